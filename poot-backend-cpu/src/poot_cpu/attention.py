"""Attention on the CPU: a C source builder driven by the eqn's shapes.

Written by hand because the shared attention schedule splits S across 128-thread
workgroups with subgroup reductions (a GPU shape): on a CPU one thread should take one
query row, compute its scores in a row buffer, and run the softmax and the weighted sum
of V over it with vectorizable loops. The arithmetic is the composite's definition
(scores = q.k * scale + mask, max, exp, sum, p = e / sum, p.V). Positions whose mask
is -inf are skipped: their probability is exactly 0 (no expf is called for a score of
-inf: m is finite or +inf there, so expf(-inf - m) is exactly 0). A row with no live position is
NaN, as the definition gives (exp(-inf - -inf)).

Taken: F32, mask broadcastable to [T, S] (any leading axes of size 1), k and v
leading axes equal to q's or all 1, S at most MAX_S. Anything else takes the shared
lowering.
"""
from __future__ import annotations

import math

from poot.codegen.lower.base import Sig
from poot.codegen.program import OUT, Access, BufferParam, KernelProgram
from poot.dtypes import DType
from poot.ir.graph import Lit
from poot.ir.ops import Attention
from poot.kernel_backend import CompiledProgram

from poot_cpu.kernels import built_kernel

F32 = DType.F32
MAX_S = 16384      # the score row lives on the thread's stack
LANES = 8


def attention_program(op, ins, out, printer) -> CompiledProgram | None:
    if not isinstance(op, Attention) or any(isinstance(x, Lit) for x in ins):
        return None
    q, k, v, mask = ins
    if any(x.dtype is not F32 for x in (q, k, v, mask)):
        return None
    *lead, hq, t, d = q.shape
    hkv, s, dv = k.shape[-3], k.shape[-2], v.shape[-1]
    if s > MAX_S or mask.rank < 1 or any(n != 1 for n in mask.shape[:-2]):
        return None
    kv_lead = []
    for x in (k, v):
        xl = x.shape[:-3]
        if tuple(xl) == tuple(lead):
            kv_lead.append(True)
        elif all(n == 1 for n in xl):
            kv_lead.append(False)
        else:
            return None
    ms = (1,) * max(0, 2 - mask.rank) + tuple(mask.shape[-2:])
    mask_t = ms[1] if ms[0] > 1 else 0       # element strides of the mask's T and S axes
    mask_s = 1 if ms[1] > 1 else 0
    rows = math.prod(lead) * hq * t
    name = Sig(op, tuple(ins), out).name + "_rows"
    src = SOURCE.format(name=name, rows=rows, hq=hq, t=t, d=d, hkv=hkv, s=s, dv=dv,
                        g=hq // hkv, klead=int(kv_lead[0]), vlead=int(kv_lead[1]),
                        mt=mask_t, ms=mask_s, scale=repr(float(op.scale)) + "f",
                        lanes=LANES)
    bufs = (BufferParam("q", F32, Access.READ, q.size, 0),
            BufferParam("k", F32, Access.READ, k.size, 1),
            BufferParam("v", F32, Access.READ, v.size, 2),
            BufferParam("mask", F32, Access.READ, mask.size, 3),
            BufferParam("o", F32, Access.WRITE, out.size, OUT))
    kernel = built_kernel(name, src, bufs)
    return CompiledProgram(KernelProgram((kernel.kernel,)), (kernel,), printer.device)


SOURCE = """\
static void {name}(const float* restrict q, const float* restrict k,
                   const float* restrict v, const float* restrict mask,
                   float* restrict o) {{
  enum {{ ROWS = {rows}, HQ = {hq}, T = {t}, D = {d}, HKV = {hkv}, S = {s}, DV = {dv},
          G = {g}, KLEAD = {klead}, VLEAD = {vlead}, MT = {mt}, MS = {ms}, L = {lanes} }};
  #pragma omp for schedule(static) nowait
  for (int r = 0; r < ROWS; ++r) {{
    const int t = r % T, h = (r / T) % HQ, l = r / (T * HQ);
    const float* qr = q + (size_t)r * D;
    const float* kb = k + ((size_t)(KLEAD ? l : 0) * HKV + h / G) * S * D;
    const float* vb = v + ((size_t)(VLEAD ? l : 0) * HKV + h / G) * S * DV;
    const float* mr = mask + (size_t)t * MT;
    float sc[S];
    float m = -INFINITY;
    for (int j = 0; j < S; ++j) {{
      const float mk = mr[j * MS];
      if (mk == -INFINITY) {{ sc[j] = -INFINITY; continue; }}
      const float* kr = kb + (size_t)j * D;
      float part[L] = {{0}};
      int e = 0;
      for (; e + L <= D; e += L)
        for (int u = 0; u < L; ++u) part[u] += qr[e + u] * kr[e + u];
      float dot = 0.0f;
      for (int u = 0; u < L; ++u) dot += part[u];
      for (; e < D; ++e) dot += qr[e] * kr[e];
      sc[j] = dot * {scale} + mk;
      m = poot_fmax(m, sc[j]);
    }}
    float* orow = o + (size_t)r * DV;
    if (m == -INFINITY) {{
      for (int e = 0; e < DV; ++e) orow[e] = poot_u2f(0x7fc00000u);
      continue;
    }}
    float den = 0.0f;
    for (int j = 0; j < S; ++j) {{
      sc[j] = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - m);   /* what expf gives it */
      den += sc[j];
    }}
    float acc[DV];
    for (int e = 0; e < DV; ++e) acc[e] = 0.0f;
    for (int j = 0; j < S; ++j) {{
      if (mr[j * MS] == -INFINITY) continue;
      const float p = sc[j] / den;
      const float* vr = vb + (size_t)j * DV;
      for (int e = 0; e < DV; ++e) acc[e] += p * vr[e];
    }}
    for (int e = 0; e < DV; ++e) orow[e] = acc[e];
  }}
}}
"""

__all__ = ["attention_program"]
