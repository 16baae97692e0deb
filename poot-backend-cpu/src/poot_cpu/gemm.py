"""Dense contractions of many rows on the CPU: a cache-blocked GEMM written as C.

out[m, n] = sum_k x[m, k] * W[n, k] for a checkpoint weight W [N, K] in f32, bf16, f16
or f16 held as u32 words (DenseContraction), or x . B for an f32 MatMul whose right
operand B [K, N] has no batch axes; each also as the head of a ContractionEpilogue.
Written by hand because the shared contraction schedules are shaped for GPUs (a
workgroup per output tile, one element per thread): printed as C loops they keep the
host's FMA units mostly idle (docs/performance.md has the measurement).

The function, in every thread of the step's parallel region:

1. packs the whole weight once per call into scratch, converted to f32, as panels of NR
   rows: panel p holds W[p*NR .. p*NR+NR, :] as [K][NR] (rows past N zero), so
   the microkernel reads NR consecutive weights of one k with one or two vector loads
   (with at most LOCAL_ROWS rows, each tile packs its own KC x NC block instead);
2. runs the MC x NC tiles of the output as an OpenMP loop; in each tile, per block of KC
   of K, the activations' MC x KC block is copied into the thread's stack as MR-row
   micro-panels ([KC][MR]), and every MR x NR micro-tile is a register tile: per k one
   broadcast of each of the MR activations times the NR weights, fused multiply-adds.

Sums: every output is one chain of fused multiply-adds over k in order (a micro-tile
starts from the partial sums of the previous K block), the same at every vector width;
the plain C path multiplies and adds (two roundings), within the contractions'
tolerance of the oracle.

The instruction set is the compiler's target (`-march=native`: the host's cpuid when the
plan is built): AVX-512F (MR 8 x NR 32), AVX2 with FMA (6 x 16), else plain C loops
(4 x 16); the tests build each from the same source.

Taken: those contractions of at least GEMM_FROM rows of f32 activations. Fewer rows take
the shared lowering (its GEMV schedules stream the weight once, which is what decode
needs), as do MatMuls of other dtypes or with batched right operands.
"""
from __future__ import annotations

import functools
import math

from poot.codegen.lower.base import Sig
from poot.codegen.program import SCRATCH, Access, BufferParam
from poot.dtypes import DType
from poot.ir.graph import Lit
from poot.ir.ops import ContractionEpilogue, DenseContraction, MatMul
from poot.kernel_backend import CompiledProgram

from poot_cpu.gemv import contraction_program, result_param

F32, BF16, F16, U32 = DType.F32, DType.BF16, DType.F16, DType.U32
GEMM_FROM = 16      # rows from which a dense contraction runs here
NR_MAX = 32         # the widest panel (AVX-512): the packed weight's scratch is sized by it
# up to this many rows (a tile or two of rows) each tile packs its KC x NC block of the
# weight on its stack as it goes: each weight element is packed at most twice, and the
# packed block stays in L2 instead of going through memory and a barrier
LOCAL_ROWS = 128

# the element (n, k) of the weight as f32, per weight dtype (w: the weight's first byte);
# "kn": a MatMul's right operand, [K, N]
WEIGHT_LOAD = {
    F32: "((const float*)w)[(size_t)n * K + k]",
    BF16: "poot_u2f((unsigned int)((const unsigned short*)w)[(size_t)n * K + k] << 16)",
    F16: "(float)((const _Float16*)w)[(size_t)n * K + k]",
    "kn": "((const float*)w)[(size_t)k * N + n]",
}

# the microkernel and its tile sizes, once per translation unit
HELPERS = """\
#ifndef POOT_GEMM_TILE
#define POOT_GEMM_TILE
#if defined(POOT_AVX2) && defined(__AVX512F__)
#define POOT_GEMM_VL 16
#define POOT_GEMM_MR 8
typedef __m512 poot_gemm_v;
#define poot_gemm_load _mm512_loadu_ps
#define poot_gemm_store _mm512_storeu_ps
#define poot_gemm_set1 _mm512_set1_ps
#define poot_gemm_fma _mm512_fmadd_ps
#elif defined(POOT_AVX2)
#define POOT_GEMM_VL 8
#define POOT_GEMM_MR 6
typedef __m256 poot_gemm_v;
#define poot_gemm_load _mm256_loadu_ps
#define poot_gemm_store _mm256_storeu_ps
#define poot_gemm_set1 _mm256_set1_ps
#define poot_gemm_fma _mm256_fmadd_ps
#else
#define POOT_GEMM_MR 4
#endif
#define POOT_GEMM_NR 16
#ifdef POOT_GEMM_VL
#undef POOT_GEMM_NR
#define POOT_GEMM_NR (2 * POOT_GEMM_VL)
#endif
/* KC x NR weights (a micro-panel) stay in L1 while the tile's MC x KC activations,
   in L2, stream past them; a tile spans NC outputs of a row */
#define POOT_GEMM_KC 256
#define POOT_GEMM_MC (16 * POOT_GEMM_MR)
#define POOT_GEMM_NC (8 * POOT_GEMM_NR)
/* c[mr x nr] (row stride ldc) = (first ? 0 : c) + a . b over kc: a is [kc][MR], b [kc][NR] */
static inline void poot_gemm_tile(int kc, const float* restrict a, const float* restrict b,
                                  float* restrict c, int ldc, int first, int mr, int nr) {
  enum { MR = POOT_GEMM_MR, NR = POOT_GEMM_NR };
  const int full = mr == MR && nr == NR;
  float t[MR][NR];      /* an edge tile's partial sums, padded */
  if (!full)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) t[i][j] = first || i >= mr || j >= nr ? 0.0f : c[i * ldc + j];
#ifdef POOT_GEMM_VL
  enum { VL = POOT_GEMM_VL };
  poot_gemm_v acc[MR][2];
  POOT_UNROLL(8)
  for (int i = 0; i < MR; ++i)
    for (int h = 0; h < 2; ++h)
      acc[i][h] = full ? (first ? poot_gemm_set1(0.0f) : poot_gemm_load(c + i * ldc + h * VL))
                       : poot_gemm_load(&t[i][h * VL]);
  for (int k = 0; k < kc; ++k) {
    const poot_gemm_v b0 = poot_gemm_load(b + k * NR), b1 = poot_gemm_load(b + k * NR + VL);
    POOT_UNROLL(8)
    for (int i = 0; i < MR; ++i) {
      const poot_gemm_v ai = poot_gemm_set1(a[k * MR + i]);
      acc[i][0] = poot_gemm_fma(ai, b0, acc[i][0]);
      acc[i][1] = poot_gemm_fma(ai, b1, acc[i][1]);
    }
  }
  POOT_UNROLL(8)
  for (int i = 0; i < MR; ++i)
    for (int h = 0; h < 2; ++h)
      poot_gemm_store(full ? c + i * ldc + h * VL : &t[i][h * VL], acc[i][h]);
#else
  float acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = full ? (first ? 0.0f : c[i * ldc + j]) : t[i][j];
  for (int k = 0; k < kc; ++k)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[k * MR + i] * b[k * NR + j];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      if (full) c[i * ldc + j] = acc[i][j];
      else t[i][j] = acc[i][j];
    }
#endif
  if (!full)
    for (int i = 0; i < mr; ++i)
      for (int j = 0; j < nr; ++j) c[i * ldc + j] = t[i][j];
}
#endif
"""

TEMPLATE = """\
static void {name}(const float* restrict x, const void* restrict w, float* restrict y,
                   float* restrict bp{extra}) {{
  enum {{ M = {m}, N = {n}, K = {k}, MR = POOT_GEMM_MR, NR = POOT_GEMM_NR, KC = POOT_GEMM_KC,
         MC = POOT_GEMM_MC, NC = POOT_GEMM_NC, NP = (N + NR - 1) / NR,
         TM = (M + MC - 1) / MC, TN = (N + NC - 1) / NC, LOCAL = M <= {local_rows} }};
{prologue}  if (!LOCAL) {{
    #pragma omp for schedule(static)
    for (int p = 0; p < NP; ++p)
      for (int k = 0; k < K; ++k) {{
        float* restrict dst = bp + ((size_t)p * K + k) * NR;
        for (int j = 0; j < NR; ++j) {{
          const int n = p * NR + j;
          dst[j] = n < N ? {load} : 0.0f;
        }}
      }}
  }}
  float ap[MC * KC] __attribute__((aligned(64)));
  float bl[LOCAL ? KC * NC : 1] __attribute__((aligned(64)));
  #pragma omp for schedule(dynamic, 1) nowait
  for (int t = 0; t < TM * TN; ++t) {{
    const int mb = t / TN * MC, nb = t % TN * NC;
    const int mc = M - mb < MC ? M - mb : MC, nc = N - nb < NC ? N - nb : NC;
    for (int k0 = 0; k0 < K; k0 += KC) {{
      const int kc = K - k0 < KC ? K - k0 : KC, last = k0 + kc == K;
      for (int i0 = 0; i0 < mc; i0 += MR)
        for (int i = 0; i < MR; ++i) {{
          float* restrict dst = ap + i0 * kc + i;
          if (i0 + i < mc) {{
            const float* src = x + (size_t)(mb + i0 + i) * K + k0;
            for (int k = 0; k < kc; ++k) dst[k * MR] = src[k];
          }} else {{
            for (int k = 0; k < kc; ++k) dst[k * MR] = 0.0f;
          }}
        }}
      if (LOCAL)
        for (int j0 = 0; j0 < nc; j0 += NR)
          for (int kk = 0; kk < kc; ++kk) {{
            float* restrict dst = bl + ((size_t)j0 * kc + (size_t)kk * NR);
            const int k = k0 + kk;
            for (int j = 0; j < NR; ++j) {{
              const int n = nb + j0 + j;
              dst[j] = n < N ? {load} : 0.0f;
            }}
          }}
      for (int j0 = 0; j0 < nc; j0 += NR) {{
        const int n0 = nb + j0, np = nc - j0 < NR ? nc - j0 : NR;
        const float* bk = LOCAL ? bl + (size_t)j0 * kc
                                : bp + (size_t)(n0 / NR) * K * NR + (size_t)k0 * NR;
        for (int i0 = 0; i0 < mc; i0 += MR) {{
          const int m0 = mb + i0, mr = mc - i0 < MR ? mc - i0 : MR;
          poot_gemm_tile(kc, ap + i0 * kc, bk, y + (size_t)m0 * N + n0, N, k0 == 0, mr, np);
          if (last) {{
{after_tile}          }}
        }}
      }}
    }}
  }}
{tail}}}
"""


def _weight(head, x, w) -> tuple[DType | str, int] | None:
    """(how the kernel reads the weight: its element dtype, u32 words holding f16 pairs, or
    "kn" for a MatMul's f32 [K, N]; N), or None where this kernel does not take it."""
    if isinstance(w, Lit) or w.rank != 2:
        return None
    if type(head) is MatMul:
        return ("kn", w.shape[1]) if w.dtype is F32 and w.shape[0] == x.shape[-1] else None
    words = w.dtype is U32
    if w.shape[1] * (2 if words else 1) != x.shape[-1]:
        return None
    return (F16 if words else w.dtype, w.shape[0]) if words or w.dtype in WEIGHT_LOAD else None


def packed_bytes(m: int, n: int, k: int) -> int:
    """Scratch for the packed weight: whole panels of the widest NR (a float where each
    tile packs its own part, at most LOCAL_ROWS rows)."""
    return 4 if m <= LOCAL_ROWS else -(-n // NR_MAX) * NR_MAX * k * 4


@functools.cache   # one string per distinct function: a plan calls each shape many times
def kernel_source(name: str, wdtype: DType | str, m: int, n: int, k: int, extra: str = "",
                  prologue: str = "", after_tile: str = "", tail: str = "") -> str:
    """One C function: y[M, N] = x[M, K] . W[N, K]^T for a weight of dtype `wdtype` (with
    a fused epilogue: its parameters and code, from poot_cpu.gemv.fused_epilogue), after
    the microkernel."""
    return HELPERS + TEMPLATE.format(name=name, m=m, n=n, k=k, extra=extra, prologue=prologue,
                                     after_tile=after_tile, tail=tail, local_rows=LOCAL_ROWS,
                                     load=WEIGHT_LOAD[wdtype])


def gemm_program(op, ins, out, printer) -> CompiledProgram | None:
    head = op.head if isinstance(op, ContractionEpilogue) else op
    if type(head) not in (DenseContraction, MatMul) or \
            (isinstance(op, ContractionEpilogue) and op.n_head != 2):
        return None
    x, w = ins[0], ins[1]
    if isinstance(x, Lit) or x.dtype is not F32 or x.rank < 2:
        return None
    read = _weight(head, x, w)
    if read is None:
        return None
    wdtype, n = read
    k = x.shape[-1]
    m = math.prod(x.shape[:-1])
    if m < GEMM_FROM:
        return None
    sig = Sig(op, tuple(ins), out)
    name = f"{sig.name}_gemm"
    y = result_param(op, out, m * n)
    if y is None:
        return None
    bp = BufferParam("bp", F32, Access.READ_WRITE, packed_bytes(m, n, k) // 4, SCRATCH)
    bufs = (BufferParam("x", F32, Access.READ, m * k, 0),
            BufferParam("w", w.dtype, Access.READ, w.size, 1), y, bp)

    def source(*fused):          # the GEMM has no use for the per-tile piece
        pieces = fused[:2] + fused[3:]
        return kernel_source(name, wdtype, m, n, k, *pieces)

    return contraction_program(sig, name, bufs, y, (bp,), source, m * k, printer)


__all__ = ["GEMM_FROM", "gemm_program", "kernel_source", "packed_bytes"]
