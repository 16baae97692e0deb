"""Attention on the CPU: a C source builder driven by the eqn's shapes.

Written by hand because the shared attention schedule splits S across 128-thread
workgroups with subgroup reductions (a GPU shape): on a CPU one thread should take a few
query rows of one head (up to QUERY_ROWS consecutive positions, so each key and value
row read serves all of them), compute their scores in row buffers (with AVX2, eight keys
at a time), and run the softmax and the weighted sum of V over them with vectorizable
loops; every row gets the same operations as it would alone. The arithmetic is the
composite's definition (scores = q.k * scale + mask, max, exp, sum, p = e / sum, p.V).
Positions whose mask is -inf are skipped, and every loop runs over the tile's live range
of keys only: their probability is exactly 0 (no expf is called for a score of -inf: m
is finite or +inf there, so expf(-inf - m) is exactly 0). A row with no live position is
NaN, as the definition gives (exp(-inf - -inf)).

Taken: F32 q and mask; k and v both F32, F16 or BF16 (an f16 KV cache read in place,
each element widened exactly as it is loaded, so the result is the f32 kernel's over the
widened keys); mask broadcastable to [T, S] (any leading axes of size 1), k and v
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

F32, F16, BF16 = DType.F32, DType.F16, DType.BF16
MAX_S = 16384      # the score row lives on the thread's stack
LANES = 8
QUERY_ROWS = 8     # query rows of one head sharing each pass over its keys and values
SCORE_BYTES = 1 << 16   # ... while their score rows fit this on the stack
#: the keys' and values' dtype -> (C element type, one element widened to float, eight
#: elements at pointer p widened to an __m256 with AVX2/F16C)
KV_LOADS = {
    F32: ("float", "(x)", "_mm256_loadu_ps(p)"),
    F16: ("_Float16", "((float)(x))", "_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p)))"),
    BF16: ("unsigned short", "poot_u2f((unsigned int)(x) << 16)",
           "_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32("
           "_mm_loadu_si128((const __m128i*)(p))), 16))"),
}


def attention_program(op, ins, out, printer) -> CompiledProgram | None:
    if not isinstance(op, Attention) or any(isinstance(x, Lit) for x in ins):
        return None
    q, k, v, mask = ins
    if q.dtype is not F32 or mask.dtype is not F32 or k.dtype is not v.dtype or \
            k.dtype not in KV_LOADS:
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
    kvt, widen, widen8 = KV_LOADS[k.dtype]
    src = SOURCE.format(name=name, kvt=kvt, widen=widen, widen8=widen8, rows=rows, hq=hq, t=t, d=d, hkv=hkv, s=s, dv=dv,
                        g=hq // hkv, klead=int(kv_lead[0]), vlead=int(kv_lead[1]),
                        mt=mask_t, ms=mask_s, scale=repr(float(op.scale)) + "f",
                        lanes=LANES, qt=max(1, min(QUERY_ROWS, t, SCORE_BYTES // (4 * s))))
    bufs = (BufferParam("q", F32, Access.READ, q.size, 0),
            BufferParam("k", k.dtype, Access.READ, k.size, 1),
            BufferParam("v", v.dtype, Access.READ, v.size, 2),
            BufferParam("mask", F32, Access.READ, mask.size, 3),
            BufferParam("o", F32, Access.WRITE, out.size, OUT))
    kernel = built_kernel(name, src, bufs)
    return CompiledProgram(KernelProgram((kernel.kernel,)), (kernel,), printer.device)


SOURCE = """\
#define KV(x) {widen}
#define KV8(p) {widen8}
static void {name}(const float* restrict q, const {kvt}* restrict k,
                   const {kvt}* restrict v, const float* restrict mask,
                   float* restrict o) {{
  enum {{ ROWS = {rows}, HQ = {hq}, T = {t}, D = {d}, HKV = {hkv}, S = {s}, DV = {dv},
          G = {g}, KLEAD = {klead}, VLEAD = {vlead}, MT = {mt}, MS = {ms}, L = {lanes},
          QT = {qt}, TT = (T + QT - 1) / QT, TILES = ROWS / T * TT }};
  #pragma omp for schedule(static) nowait
  for (int tile = 0; tile < TILES; ++tile) {{
    const int t0 = tile % TT * QT, h = tile / TT % HQ, l = tile / (TT * HQ);
    const int nq = T - t0 < QT ? T - t0 : QT;
    const {kvt}* kb = k + ((size_t)(KLEAD ? l : 0) * HKV + h / G) * S * D;
    const {kvt}* vb = v + ((size_t)(VLEAD ? l : 0) * HKV + h / G) * S * DV;
    const float* qr[QT];
    const float* mr[QT];
    for (int i = 0; i < QT; ++i) {{    /* rows past T repeat the last; they are not stored */
      const int t = t0 + (i < nq ? i : nq - 1);
      qr[i] = q + ((size_t)(l * HQ + h) * T + t) * D;
      mr[i] = mask + (size_t)t * MT;
    }}
    int lo = S, hi = 0;            /* the keys live in any row of the tile lie in [lo, hi) */
    for (int i = 0; i < nq; ++i) {{
      int a = 0, b = S;
      while (a < S && mr[i][a * MS] == -INFINITY) ++a;
      while (b > a && mr[i][(b - 1) * MS] == -INFINITY) --b;
      if (a < b) {{
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
      }}
    }}
    float sc[QT][S];
    int j = lo;
#ifdef POOT_AVX2
    /* eight keys at a time: each key's eight lane sums (part[u] of the row loop below) are
       transposed so that lane u of eight keys is one vector, then summed in the row loop's
       order; each score gets the same operations as one key at a time */
    for (; D % L == 0 && j + 8 <= hi; j += 8) {{
      int live = 0;
      for (int i = 0; i < nq; ++i)
        for (int u = 0; u < 8; ++u) live |= mr[i][(j + u) * MS] != -INFINITY;
      if (!live) {{
        for (int i = 0; i < nq; ++i)
          for (int u = 0; u < 8; ++u) sc[i][j + u] = -INFINITY;
        continue;
      }}
      for (int i = 0; i < nq; ++i) {{
        __m256 part[8], lane[8];
        for (int u = 0; u < 8; ++u) {{
          const {kvt}* kr = kb + (size_t)(j + u) * D;
          __m256 a = _mm256_setzero_ps();
          for (int e = 0; e < D; e += L)
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(qr[i] + e),
                                               KV8(kr + e)));
          part[u] = a;
        }}
        poot_transpose8x32((const __m256i*)part, (__m256i*)lane, 1);
        __m256 dot = _mm256_setzero_ps();
        for (int u = 0; u < 8; ++u) dot = _mm256_add_ps(dot, lane[u]);
        const __m256 mk = MS ? _mm256_loadu_ps(mr[i] + j) : _mm256_set1_ps(mr[i][0]);
        const __m256 ninf = _mm256_set1_ps(-INFINITY);
        const __m256 s8 = _mm256_add_ps(_mm256_mul_ps(dot, _mm256_set1_ps({scale})), mk);
        _mm256_storeu_ps(sc[i] + j, _mm256_blendv_ps(s8, ninf,
                                                     _mm256_cmp_ps(mk, ninf, _CMP_EQ_OQ)));
      }}
    }}
#endif
    for (; j < hi; ++j) {{
      const {kvt}* kr = kb + (size_t)j * D;
      for (int i = 0; i < nq; ++i) {{
        const float mk = mr[i][j * MS];
        if (mk == -INFINITY) {{ sc[i][j] = -INFINITY; continue; }}
        float part[L] = {{0}};
        int e = 0;
        for (; e + L <= D; e += L)
          for (int u = 0; u < L; ++u) part[u] += qr[i][e + u] * KV(kr[e + u]);
        float dot = 0.0f;
        for (int u = 0; u < L; ++u) dot += part[u];
        for (; e < D; ++e) dot += qr[i][e] * KV(kr[e]);
        sc[i][j] = dot * {scale} + mk;
      }}
    }}
    float den[QT], acc[QT][DV];
    int dead[QT];                  /* no live position: the row is NaN */
    for (int i = 0; i < nq; ++i) {{
      float m = -INFINITY;
      for (int j = lo; j < hi; ++j) m = poot_fmax(m, sc[i][j]);   /* -inf: as if skipped */
      dead[i] = m == -INFINITY;
      if (dead[i]) continue;
      float dsum = 0.0f;
      for (int j = lo; j < hi; ++j) {{
        sc[i][j] = sc[i][j] == -INFINITY ? 0.0f : expf(sc[i][j] - m);   /* what expf gives it */
        dsum += sc[i][j];
      }}
      den[i] = dsum;
      for (int e = 0; e < DV; ++e) acc[i][e] = 0.0f;
    }}
    for (int j = lo; j < hi; ++j) {{
      const {kvt}* vr = vb + (size_t)j * DV;
      for (int i = 0; i < nq; ++i) {{
        if (dead[i] || mr[i][j * MS] == -INFINITY) continue;
        const float p = sc[i][j] / den[i];
        int e = 0;
#ifdef POOT_AVX2
        /* eight values widened at once (gcc does not vectorize a 16-bit widening here) */
        for (const __m256 pv = _mm256_set1_ps(p); e + 8 <= DV; e += 8)
          _mm256_storeu_ps(acc[i] + e, _mm256_add_ps(_mm256_loadu_ps(acc[i] + e),
                                                     _mm256_mul_ps(pv, KV8(vr + e))));
#endif
        for (; e < DV; ++e) acc[i][e] += p * KV(vr[e]);
      }}
    }}
    for (int i = 0; i < nq; ++i) {{
      float* orow = o + ((size_t)(l * HQ + h) * T + t0 + i) * DV;
      for (int e = 0; e < DV; ++e) orow[e] = dead[i] ? poot_u2f(0x7fc00000u) : acc[i][e];
    }}
  }}
}}
#undef KV
#undef KV8
"""

__all__ = ["attention_program"]
