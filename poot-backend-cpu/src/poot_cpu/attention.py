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

SinkAttention's sink logit (one per query head) joins each row's max, and its exp the
denominator after the scores' sum, as the definition orders them; it weights no value, so
a row with no live key is 0 rather than NaN there.

Taken: F32 q and mask (and sinks); k and v both F32, F16 or BF16 (an f16 KV cache read in
place, each element widened exactly as it is loaded, so the result is the f32 kernel's over
the widened keys), or, for Q8KVAttention, PagedQ8KVAttention and Q8KVSinkAttention, q8_0
codes and scales (each element dequantized as it is loaded, f32(code) * scale as the
definition's chain rounds it); a mask of [T, S] rows shared by every head (its leading
axes 1, or a paged batch's per-sequence rows: its batch axes q's trailing leading axes); k and v leading axes equal to q's or all 1, or, for
the paged ops, pools [P, Hkv, D] whose rows each sequence reads through its slot map (no
gathered copy: only the live range of a sequence's slots is touched); S at most MAX_S
(score rows on the stack; the q8 ops, which have no shared lowering, put longer ones on
the heap). Any other Attention or PagedAttention takes the shared lowering; any other q8
op is refused at plan time. The sink ops take the dense forms only (no paged one exists).
"""
from __future__ import annotations

import math

from poot.codegen.lower.base import Sig
from poot.codegen.program import OUT, Access, BufferParam, KernelProgram
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.ir.graph import Lit
from poot.ir.ops import (
    Q8_BLOCK,
    Attention,
    PagedAttention,
    PagedQ8KVAttention,
    Q8KVAttention,
    Q8KVSinkAttention,
    SinkAttention,
)
from poot.kernel_backend import CompiledProgram

from poot_cpu.kernels import built_kernel

F32, F16, BF16, I8 = DType.F32, DType.F16, DType.BF16, DType.I8
MAX_S = 16384      # the score row lives on the thread's stack
LANES = 8
QUERY_ROWS = 8     # query rows of one head sharing each pass over its keys and values
SCORE_BYTES = 1 << 16   # ... while their score rows fit this on the stack
#: the keys' and values' dtype -> (C element type, element i of row r widened to float,
#: elements i .. i+7 of row r as an __m256 with AVX2/F16C); s is the row's q8 scales
KV_LOADS = {
    F32: ("float", "((r)[i])", "_mm256_loadu_ps((r) + (i))"),
    F16: ("_Float16", "((float)(r)[i])",
          "_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((r) + (i))))"),
    BF16: ("unsigned short", "poot_u2f((unsigned int)(r)[i] << 16)",
           "_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32("
           "_mm_loadu_si128((const __m128i*)((r) + (i)))), 16))"),
    # q8_0: eight codes of one block share its scale
    I8: ("signed char", f"((float)(r)[i] * (s)[(i) / {Q8_BLOCK}])",
         "_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64("
         f"(const __m128i*)((r) + (i))))), _mm256_set1_ps((s)[(i) / {Q8_BLOCK}]))"),
}


#: each op's operand names, in order (the C function's parameters, then its output o)
OPERANDS = {Attention: ("q", "k", "v", "mask"),
            PagedAttention: ("q", "k", "v", "smap", "mask"),
            Q8KVAttention: ("q", "k", "ks", "v", "vs", "mask"),
            PagedQ8KVAttention: ("q", "k", "ks", "v", "vs", "smap", "mask"),
            SinkAttention: ("q", "k", "v", "mask", "sinks"),
            Q8KVSinkAttention: ("q", "k", "ks", "v", "vs", "mask", "sinks")}
#: where row j of the keys (values alike) and of their q8 scales lie: a dense block per
#: (leading index, kv head), or a pool row named by the sequence's slot map
DENSE_ROWS = """\
#define KROW(j) (k + (kh * S + (size_t)(j)) * D)
#define VROW(j) (v + (vh * S + (size_t)(j)) * DV)
#define KSROW(j) SROW(ks, kh * S + (size_t)(j), D)
#define VSROW(j) SROW(vs, vh * S + (size_t)(j), DV)
"""
POOL_ROWS = """\
#define KROW(j) (k + ((size_t)sm[j] * HKV + kh) * D)
#define VROW(j) (v + ((size_t)sm[j] * HKV + vh) * DV)
#define KSROW(j) SROW(ks, (size_t)sm[j] * HKV + kh, D)
#define VSROW(j) SROW(vs, (size_t)sm[j] * HKV + vh, DV)
"""


def attention_program(op, ins, out, printer) -> CompiledProgram | None:
    names = OPERANDS.get(type(op))
    if names is None or any(isinstance(x, Lit) for x in ins):
        return None
    x = dict(zip(names, ins, strict=True))
    q, k, v, mask = x["q"], x["k"], x["v"], x["mask"]
    q8 = isinstance(op, (Q8KVAttention, PagedQ8KVAttention, Q8KVSinkAttention))
    paged = isinstance(op, (PagedAttention, PagedQ8KVAttention))
    sink = isinstance(op, (SinkAttention, Q8KVSinkAttention))
    if q.dtype is not F32 or mask.dtype is not F32 or k.dtype is not v.dtype or \
            k.dtype not in KV_LOADS or (k.dtype is I8) is not q8:
        return None
    *lead, hq, t, d = q.shape
    if paged:       # pools [P, Hkv, D]: each sequence reads its rows through its slot map
        hkv, s, dv = k.shape[1], x["smap"].shape[1], v.shape[2]
        kv_lead = [True, True]
    else:
        hkv, s, dv = k.shape[-3], k.shape[-2], v.shape[-1]
        kv_lead = [lead_mode(rows, lead) for rows in (k, v)]
    batches = mask_batches(mask, lead)
    if (s > MAX_S and not q8) or batches is None or None in kv_lead:
        if not q8:
            return None
        raise UnsupportedOp(
            f"{op.name}: the cpu row kernel takes k, v leading axes {tuple(lead)} or 1 and "
            f"a mask of [T, S] rows shared by the heads; got k {k}, v {v}, mask {mask}",
            op=op.name, dtype=str(I8), backend="cpu", device=printer.device)
    ms = (1,) * max(0, 2 - mask.rank) + tuple(mask.shape[-2:])
    mask_t = ms[1] if ms[0] > 1 else 0       # element strides of the mask's T and S axes
    mask_s = 1 if ms[1] > 1 else 0
    heap = s > MAX_S
    rows = math.prod(lead) * hq * t
    name = Sig(op, tuple(ins), out).name + "_rows"
    kvt, widen, widen8 = KV_LOADS[k.dtype]
    params = ", ".join(
        f"const {kvt if n in ('k', 'v') else 'int' if n == 'smap' else 'float'}* restrict {n}"
        for n in names)
    src = SOURCE.format(name=name, widen=widen, widen8=widen8, params=params,
                        rowdefs=POOL_ROWS if paged else DENSE_ROWS,
                        slot_rows="const int* restrict sm = smap + (size_t)l * S;" if paged
                        else "", kvt=kvt,
                        srow=f"((p) + (j) * ((n) / {Q8_BLOCK}))" if q8 else "((const float*)0)",
                        rows=rows, hq=hq, t=t, d=d, hkv=hkv, s=s, dv=dv,
                        g=hq // hkv, klead=int(kv_lead[0]), vlead=int(kv_lead[1]),
                        mt=mask_t, ms=mask_s, mbn=batches, mls=ms[0] * ms[1],
                        scores="float (*sc)[S] = malloc(sizeof(float[QT][S]));" if heap else
                        "float sc[QT][S];", free="free(sc);" if heap else "",
                        sink_max="m = poot_fmax(m, sinks[h]);" if sink else "",
                        sink_den="dsum += expf(sinks[h] - m);" if sink else "",
                        dense=int(not paged), scale=repr(float(op.scale)) + "f",
                        lanes=LANES, qt=max(1, min(QUERY_ROWS, t, SCORE_BYTES // (4 * s))))
    bufs = tuple(BufferParam(n, a.dtype, Access.READ, a.size, i)
                 for i, (n, a) in enumerate(zip(names, ins, strict=True))) + (
        BufferParam("o", F32, Access.WRITE, out.size, OUT),)
    kernel = built_kernel(name, src, bufs)
    return CompiledProgram(KernelProgram((kernel.kernel,)), (kernel,), printer.device)


def lead_mode(x, lead) -> bool | None:
    """Whether k or v `x` has a row block per leading index of q (True), one shared
    (False), or neither (None)."""
    xl = tuple(x.shape[:-3])
    return True if xl == tuple(lead) else False if all(n == 1 for n in xl) else None


def mask_batches(mask, lead) -> int | None:
    """How many [T, S] row blocks the mask holds, cycling over q's flattened leading index
    (1: one shared by all; n: its batch axes are q's last leading axes), or None when its
    rows differ by head (or it has no [S] axis)."""
    if mask.rank < 1:
        return None
    heads = 2 if mask.rank == len(lead) + 4 else 1   # the grouped form [..., Hkv, G, T, S]
    ml = tuple(mask.shape[:-2])
    if any(n != 1 for n in ml[max(0, len(ml) - heads):]):
        return None
    mb = ml[:max(0, len(ml) - heads)]
    while mb and mb[0] == 1:
        mb = mb[1:]
    if mb and (len(mb) > len(lead) or mb != tuple(lead[len(lead) - len(mb):])):
        return None
    return math.prod(mb)


SOURCE = """\
#define KV(r, s, i) {widen}
#define KV8(r, s, i) {widen8}
#define SROW(p, j, n) {srow}
{rowdefs}static void {name}({params},
                   float* restrict o) {{
  enum {{ ROWS = {rows}, HQ = {hq}, T = {t}, D = {d}, HKV = {hkv}, S = {s}, DV = {dv},
          G = {g}, KLEAD = {klead}, VLEAD = {vlead}, MT = {mt}, MS = {ms}, L = {lanes},
          MBN = {mbn}, MLS = {mls},
          QT = {qt}, TT = (T + QT - 1) / QT, TILES = ROWS / T * TT }};
  #pragma omp for schedule(dynamic, 1) nowait
  for (int tile = 0; tile < TILES; ++tile) {{
    const int t0 = tile % TT * QT, h = tile / TT % HQ, l = tile / (TT * HQ);
    const int nq = T - t0 < QT ? T - t0 : QT;
    /* the kv head's row block (dense), or its row within each pool slot (paged) */
    const size_t kh = (size_t)(KLEAD ? l : 0) * HKV * {dense} + h / G;
    const size_t vh = (size_t)(VLEAD ? l : 0) * HKV * {dense} + h / G;
    {slot_rows}
    const float* qr[QT];
    const float* mr[QT];
    for (int i = 0; i < QT; ++i) {{    /* rows past T repeat the last; they are not stored */
      const int t = t0 + (i < nq ? i : nq - 1);
      qr[i] = q + ((size_t)(l * HQ + h) * T + t) * D;
      mr[i] = mask + (size_t)(l % MBN) * MLS + (size_t)t * MT;
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
    {scores}
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
      __m256 part[QT][8];
      for (int u = 0; u < 8; ++u) {{     /* each key row widened once for the tile's rows */
        const {kvt}* kr = KROW(j + u);
        const float* ksr = KSROW(j + u);
        __m256 kv[D / L + 1];
        for (int e = 0; e < D; e += L) kv[e / L] = KV8(kr, ksr, e);
        for (int i = 0; i < nq; ++i) {{
          __m256 a = _mm256_setzero_ps();
          for (int e = 0; e < D; e += L)
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(qr[i] + e), kv[e / L]));
          part[i][u] = a;
        }}
      }}
      for (int i = 0; i < nq; ++i) {{
        __m256 lane[8];
        poot_transpose8x32((const __m256i*)part[i], (__m256i*)lane, 1);
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
      const {kvt}* kr = KROW(j);
      const float* ksr = KSROW(j);
      for (int i = 0; i < nq; ++i) {{
        const float mk = mr[i][j * MS];
        if (mk == -INFINITY) {{ sc[i][j] = -INFINITY; continue; }}
        float part[L] = {{0}};
        int e = 0;
        for (; e + L <= D; e += L)
          for (int u = 0; u < L; ++u) part[u] += qr[i][e + u] * KV(kr, ksr, e + u);
        float dot = 0.0f;
        for (int u = 0; u < L; ++u) dot += part[u];
        for (; e < D; ++e) dot += qr[i][e] * KV(kr, ksr, e);
        sc[i][j] = dot * {scale} + mk;
      }}
    }}
    float den[QT], acc[QT][DV];
    int dead[QT];                  /* no live position: the row is NaN */
    for (int i = 0; i < nq; ++i) {{
      float m = -INFINITY;
      for (int j = lo; j < hi; ++j) m = poot_fmax(m, sc[i][j]);   /* -inf: as if skipped */
      {sink_max}
      dead[i] = m == -INFINITY;
      if (dead[i]) continue;
      float dsum = 0.0f;
      for (int j = lo; j < hi; ++j) {{
        sc[i][j] = sc[i][j] == -INFINITY ? 0.0f : expf(sc[i][j] - m);   /* what expf gives it */
        dsum += sc[i][j];
      }}
      {sink_den}
      den[i] = dsum;
      for (int e = 0; e < DV; ++e) acc[i][e] = 0.0f;
    }}
    for (int j = lo; j < hi; ++j) {{
      const {kvt}* vr = VROW(j);
      const float* vsr = VSROW(j);
#ifdef POOT_AVX2
      /* the value row widened once for the tile's rows, eight values at a time (gcc does
         not vectorize a 16-bit widening here) */
      __m256 vv[DV / 8 + 1];
      for (int e = 0; e + 8 <= DV; e += 8) vv[e / 8] = KV8(vr, vsr, e);
#endif
      for (int i = 0; i < nq; ++i) {{
        if (dead[i] || mr[i][j * MS] == -INFINITY) continue;
        const float p = sc[i][j] / den[i];
        int e = 0;
#ifdef POOT_AVX2
        for (const __m256 pv = _mm256_set1_ps(p); e + 8 <= DV; e += 8)
          _mm256_storeu_ps(acc[i] + e, _mm256_add_ps(_mm256_loadu_ps(acc[i] + e),
                                                     _mm256_mul_ps(pv, vv[e / 8])));
#endif
        for (; e < DV; ++e) acc[i][e] += p * KV(vr, vsr, e);
      }}
    }}
    for (int i = 0; i < nq; ++i) {{
      float* orow = o + ((size_t)(l * HQ + h) * T + t0 + i) * DV;
      for (int e = 0; e < DV; ++e) orow[e] = dead[i] ? poot_u2f(0x7fc00000u) : acc[i][e];
    }}
    {free}
  }}
}}
#undef KV
#undef KV8
#undef SROW
#undef KROW
#undef VROW
#undef KSROW
#undef VSROW
"""

__all__ = ["attention_program"]
