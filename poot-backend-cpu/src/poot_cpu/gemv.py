"""The packed contraction hot path: a C source builder driven by the plan's shapes and the
weight's block layout (design: "the heavy kernels may be parameterized source builders
per backend"). Written by hand because the shared GEMV schedule is shaped for GPUs (32
lanes per dot product and a subgroup reduction per output); on a CPU one thread should
stream whole weight rows through SIMD registers.

out[m, n] = sum_k x[m, k] * W[n, k] for GGUF 32-element block types whose element is
`d * (q - bias) + min` with one f16 scale `d` (and optional f16 `min`) per block and
integer quants q of 4 bits (nibbles) or 8 bits. The activations are quantized once per
call to int16 per block of 32 (scale max|x| / 32767, round to nearest; their exact F32
block sums are kept), so a block's dot product is integer multiply-adds (AVX2
`madd_epi16`: 16 products per instruction, exact int32 sums) scaled once by d * dx;
`min - bias * d` multiplies the block's activation sum. 4-bit quants are centred (q - 8)
first, which keeps the rounding of x small against the result: NMSE against the oracle
is about 4e-10 on random data (the conformance threshold for contractions is 3.7e-9).
Weights stay packed: nothing is decoded outside the loop. Without AVX2 the same integer
arithmetic runs as plain C loops.

The block layout of each format is checked against the format's own dequantize
(poot-quant's decode program, the oracle's) on random blocks before it is used, so a
layout that disagrees with the format is never printed.

A ContractionEpilogue over such a head becomes this kernel into a scratch buffer and
the shared pointwise lowering of its epilogue body.
"""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass

import numpy as np
from poot.codegen import index as ix
from poot.codegen.expr import Load
from poot.codegen.lower.base import Sig
from poot.codegen.lower.pointwise import pointwise_kernel
from poot.codegen.program import OUT, SCRATCH, Access, BufferParam, Kernel, KernelProgram
from poot.codegen.region import RegionEval
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.ir.graph import Lit
from poot.ir.ops import ContractionEpilogue, PackedContraction
from poot.kernel_backend import CompiledProgram

from poot_cpu.kernels import built_kernel

F32, U8 = DType.F32, DType.U8
M_TILES = (4, 8)    # activation rows sharing one decoded weight block: decode, prefill
PANEL_FROM = 8      # calls of at least this many rows use the panel kernel (PANEL_TEMPLATE)
PANEL_ROWS = 16     # weight rows of a panel at most (POOT_VL: 16 with AVX-512, else 8)
PANEL_BYTES = 1 << 18   # ... when a decoded panel (PANEL_ROWS x K int16) fits this on the stack


@dataclass(frozen=True)
class BlockLayout:
    """Where the fields of one block lie (byte offsets) and how quants become values."""

    elements: int
    nbytes: int
    scale: int                 # f16 d
    minimum: int | None        # f16 min, or None
    bias: int                  # x = d * (q - bias) + min
    quants: int
    bits: int                  # 4: element j < 16 in the low nibble of byte j, j >= 16 in
                               # the high nibble of byte j - 16; 8: signed bytes


LAYOUTS = {
    "gguf:Q4_0": BlockLayout(32, 18, 0, None, 8, 2, 4),
    "gguf:Q4_1": BlockLayout(32, 20, 0, 2, 0, 4, 4),
    "gguf:Q8_0": BlockLayout(32, 34, 0, None, 0, 2, 8),
}


def _layout_decode(layout: BlockLayout, blocks: np.ndarray) -> np.ndarray:
    """What the printed kernel computes per element, in numpy (for the self-check)."""
    f16 = lambda o: blocks[:, o:o + 2].copy().view(np.float16).astype(np.float32)  # noqa: E731
    d = f16(layout.scale)
    raw = blocks[:, layout.quants:]
    if layout.bits == 4:
        q = np.concatenate([raw[:, :16] & 15, raw[:, :16] >> 4], axis=1).astype(np.float32)
    else:
        q = raw[:, :32].view(np.int8).astype(np.float32)
    out = d * (q - layout.bias)
    return out + f16(layout.minimum) if layout.minimum is not None else out


@functools.cache
def layout_of(format_name: str) -> BlockLayout | None:
    """The layout of a format, if it has one here and it agrees with the format's own
    dequantize on random blocks (finite scales)."""
    from poot.formats import get_format

    layout = LAYOUTS.get(format_name)
    if layout is None:
        return None
    fmt = get_format(format_name)
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (8, layout.nbytes), dtype=np.uint8)
    for off in (layout.scale, layout.minimum):
        if off is not None:
            blocks[:, off:off + 2] = rng.uniform(-2, 2, (8, 1)).astype(np.float16).view(np.uint8)
    shape = (8, layout.elements)
    want = fmt.dequantize([blocks.reshape(8, -1)], shape)
    got = _layout_decode(layout, blocks)
    return layout if np.array_equal(np.asarray(want, np.float32), got) else None


def _head(op, ins):
    """(the packed head, its operand types, x type) when the eqn is a contraction this
    builder takes, else None."""
    head, n_head = (op.head, op.n_head) if isinstance(op, ContractionEpilogue) else (op, 2)
    if not isinstance(head, PackedContraction) or n_head != 2:
        return None
    x, w = ins[0], ins[1]
    if isinstance(x, Lit) or isinstance(w, Lit) or x.dtype is not F32 or w.dtype is not U8:
        return None
    layout = layout_of(head.weight.format)
    n, k = head.weight.shape
    if layout is None or k % layout.elements or x.shape[-1] != k:
        return None
    if w.nbytes != n * k // layout.elements * layout.nbytes:
        return None
    return head, layout


def gemv_program(op, ins, out, printer) -> CompiledProgram | None:
    found = _head(op, ins)
    if found is None:
        return None
    head, layout = found
    n, k = head.weight.shape
    m = math.prod(ins[0].shape[:-1])
    sig = Sig(op, tuple(ins), out)
    name = f"{sig.name}_gemv"
    if isinstance(op, PackedContraction):
        if out.dtype is not F32:
            return None
        y = BufferParam("y", F32, Access.WRITE, m * n, OUT)
    else:
        y = BufferParam("acc", F32, Access.READ_WRITE, m * n, SCRATCH)
    xq = BufferParam("xq", U8, Access.READ_WRITE, scratch_bytes(m, k, layout), SCRATCH)
    bufs = (BufferParam("x", F32, Access.READ, m * k, 0),
            BufferParam("w", U8, Access.READ, ins[1].size, 1), y, xq)
    if isinstance(op, PackedContraction):
        gemv = built_kernel(name, gemv_source(name, layout, m, n, k), bufs)
        return CompiledProgram(KernelProgram((gemv.kernel,), scratch=(xq,)), (gemv,),
                               printer.device)
    epis = epilogue(sig, y).kernels
    fused = fused_epilogue(epis[0], sig, m * k, printer) if len(epis) == 1 else None
    if fused is not None:
        (epi,) = epis
        extra, source = fused
        # interned: a plan holds one copy of each distinct function, not one per call
        gemv = built_kernel(name, sys.intern(source + gemv_source(name, layout, m, n, k,
                                                                  *extra)),
                            bufs + tuple(b for b in epi.buffers if b.name != "acc"))
        return CompiledProgram(KernelProgram((gemv.kernel,), scratch=(y, xq)), (gemv,),
                               printer.device)
    kernels = (built_kernel(name, gemv_source(name, layout, m, n, k), bufs),
               *(built_kernel(e.name, printer.source(e), e.buffers) for e in epis))
    return CompiledProgram(KernelProgram(tuple(k.kernel for k in kernels), scratch=(y, xq)),
                           kernels, printer.device)


def fused_epilogue(epi: Kernel, sig: Sig, x_count: int, printer):
    """The epilogue `epi` inside the contraction's function: each thread applies it to the
    outputs it has just computed (`epi`'s element function), so the call needs no barrier
    between the two; where the output overlaps the activations (read by every thread) or
    an epilogue operand other than elementwise in place, the function falls back, at run
    time, to a barrier and `epi`'s own loop. Returns ((extra parameters, prologue, call
    after a tile, call after a panel tile, tail), the functions' source), or None where
    `epi` has no element function."""
    try:
        at = printer.element_source(epi, f"{epi.name}_at")
    except UnsupportedOp:
        return None
    operands = [b for b in epi.buffers if b.name != "acc"]
    out = next(b for b in operands if b.operand == OUT)
    out_bytes = out.count * out.dtype.itemsize
    extra = "".join(f", {'const ' if not b.access.writable else ''}"
                    f"{printer.type_name(b.dtype)}* restrict e_{b.name}" for b in operands)
    args = ", ".join("y" if b.name == "acc" else f"e_{b.name}" for b in epi.buffers)
    safe = [f"!poot_overlap(e_{out.name}, {out_bytes}, x, {x_count * 4})"]
    for b in operands:
        if b is out:
            continue
        apart = f"!poot_overlap(e_{out.name}, {out_bytes}, e_{b.name}, " \
                f"{b.count * b.dtype.itemsize})"
        same = sig.ins[b.operand].shape == sig.out.shape if isinstance(b.operand, int) \
            else False
        safe.append(f"({apart} || (const void*)e_{b.name} == (const void*)e_{out.name})"
                    if same else apart)
    prologue = f"  const int direct = {' && '.join(safe)};\n"
    after_tile = ("      if (direct)\n        for (int i = 0; i < mt; ++i)\n"
                  f"          for (int r = 0; r < NR; ++r) {epi.name}_at("
                  f"(m0 + i) * N + n0 + r, {args});\n")
    after_panel = ("      if (direct)\n        for (int i = 0; i < mr; ++i)\n"
                   f"          for (int r = 0; r < np; ++r) {epi.name}_at("
                   f"(m0 + i) * N + n0 + r, {args});\n")
    tail = (f"  if (!direct) {{\n    #pragma omp barrier\n    {epi.name}({args});\n  }}\n")
    return (extra, prologue, after_tile, after_panel, tail), at + printer.source(epi)


def epilogue(sig: Sig, acc: BufferParam) -> KernelProgram:
    """The ContractionEpilogue's body applied to the head's result held in `acc`."""
    op = sig.op
    shape = sig.out.shape

    def declare(kb):
        kb.buffer("acc", F32, Access.READ, acc.count)
        for j in range(op.n_head, len(sig.ins)):
            if not isinstance(sig.ins[j], Lit):
                sig.declare_input(kb, j)

    def value(coords, kb):
        params = [lambda c: Load("acc", ix.ravel(c, shape), F32).cast(sig.out.dtype)
                  if sig.out.dtype is not F32 else Load("acc", ix.ravel(c, shape), F32)]
        for j in range(op.n_head, len(sig.ins)):
            params.append(lambda c, j=j: sig.operand_at(j, c))
        return RegionEval(kb, op.body, params).result_at(coords)

    return pointwise_kernel(sig, value, declare)


TEMPLATE = """\
static void {name}(const float* restrict x, const unsigned char* restrict w,
                   float* restrict y, unsigned char* restrict scratch{extra}) {{
  enum {{ M = {m}, N = {n}, K = {k}, NB = {nb}, BS = {bs}, MT = {mt}, NR = {nr} }};
{prologue}{quant_setup}
{quantize}  #pragma omp for schedule(static) nowait
  for (int n0 = 0; n0 < N; n0 += NR) {{
    for (int m0 = 0; m0 < M; m0 += MT) {{
      const int mt = M - m0 < MT ? M - m0 : MT;
      float off[NR][MT] = {{{{0}}}};
#ifdef POOT_AVX2
      __m256 acc[NR][MT];
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < MT; ++i) acc[r][i] = _mm256_setzero_ps();
#else
      float acc[NR][MT] = {{{{0}}}};
#endif
      for (int b = 0; b < NB; ++b) {{
#ifdef POOT_AVX2
        __m256i w0[NR], w1[NR];
#else
        int wq[NR][32];
#endif
        float d[NR], shift[NR];
        for (int r = 0; r < NR; ++r) {{
          const unsigned char* blk = w + ((size_t)(n0 + r) * NB + b) * BS;
          d[r] = poot_h2f(blk + {scale});
          shift[r] = {shift};
#ifdef POOT_AVX2
{avx_decode}
#else
{scalar_decode}
#endif
        }}
        for (int i = 0; i < mt; ++i) {{
          const int xi = (m0 + i) * NB + b;
          const short* xb = xq + (size_t)xi * 32;
#ifdef POOT_AVX2
          const __m256i x0 = _mm256_loadu_si256((const __m256i*)xb);
          const __m256i x1 = _mm256_loadu_si256((const __m256i*)(xb + 16));
          for (int r = 0; r < NR; ++r) {{
            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(w0[r], x0),
                                               _mm256_madd_epi16(w1[r], x1));
            acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                        _mm256_set1_ps(d[r] * dx[xi]), acc[r][i]);
            off[r][i] += shift[r] * xs[xi];
          }}
#else
          for (int r = 0; r < NR; ++r) {{
            int p = 0;
            for (int j = 0; j < 32; ++j) p += wq[r][j] * xb[j];
            acc[r][i] += (float)p * (d[r] * dx[xi]);
            off[r][i] += shift[r] * xs[xi];
          }}
#endif
        }}
      }}
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < mt; ++i)
#ifdef POOT_AVX2
          y[(size_t)(m0 + i) * N + n0 + r] = poot_hsum8(acc[r][i]) + off[r][i];
#else
          y[(size_t)(m0 + i) * N + n0 + r] = acc[r][i] + off[r][i];
#endif
{after_tile}    }}
  }}
{tail}}}
"""


# the prefill tile: a panel of NP = POOT_VL weight rows (16 with AVX-512, else 8) is
# decoded once per call into int16 on the thread's stack, k-pair major: pair p of the NP
# rows is one vector (wp[p][r][0..1]; the decoded blocks are transposed 8 rows at a time),
# with the per-block scales and shifts stored across the rows. MR activation rows at a
# time then run through it as an outer product: each pair of activations is broadcast and
# multiplied into the NP rows' int32 sums (madd, or VNNI's dpwssd), so no sum is reduced
# across lanes; per block the sums are converted and scaled once for the NP rows. Each
# output gets the same integer dot products and float operations, in the same order, at
# every vector width.
PANEL_TEMPLATE = """\
static void {name}(const float* restrict x, const unsigned char* restrict w,
                   float* restrict y, unsigned char* restrict scratch{extra}) {{
  enum {{ M = {m}, N = {n}, K = {k}, NB = {nb}, BS = {bs}, NP = POOT_VL, MR = POOT_PANEL_MR }};
{prologue}{quant_setup}
{quantize}  #pragma omp for schedule(static) nowait
  for (int n0 = 0; n0 < N; n0 += NP) {{
    const int np = N - n0 < NP ? N - n0 : NP;
    short wp[K / 2][NP][2] __attribute__((aligned(64)));
    float d[NB][NP] __attribute__((aligned(64))), shift[NB][NP] __attribute__((aligned(64)));
    for (int b = 0; b < NB; ++b) {{
#ifdef POOT_AVX2
      __m256i w0[NP], w1[NP];   /* row r's elements 0-15 and 16-31: eight pairs each */
#endif
      for (int r = 0; r < NP; ++r) {{
        if (r >= np) {{
          d[b][r] = shift[b][r] = 0.0f;
#ifdef POOT_AVX2
          w0[r] = w1[r] = _mm256_setzero_si256();
#else
          for (int j = 0; j < 32; ++j) wp[b * 16 + j / 2][r][j % 2] = 0;
#endif
          continue;
        }}
        const unsigned char* blk = w + ((size_t)(n0 + r) * NB + b) * BS;
        d[b][r] = poot_h2f(blk + {scale});
        shift[b][r] = {shift};
#ifdef POOT_AVX2
{avx_decode}
#else
        short wq[32];
{decode}
        for (int j = 0; j < 32; ++j) wp[b * 16 + j / 2][r][j % 2] = wq[j];
#endif
      }}
#ifdef POOT_AVX2
      for (int g = 0; g < NP / 8; ++g) {{
        poot_transpose8x32(w0 + 8 * g, (__m256i*)wp[b * 16] + g, NP / 8);
        poot_transpose8x32(w1 + 8 * g, (__m256i*)wp[b * 16 + 8] + g, NP / 8);
      }}
#endif
    }}
    for (int m0 = 0; m0 < M; m0 += MR) {{
      const int mr = M - m0 < MR ? M - m0 : MR;
      int row[MR];               /* rows past M repeat the last one; their sums are unused */
      const short* xr[MR];
      for (int i = 0; i < MR; ++i) {{
        row[i] = m0 + (i < mr ? i : mr - 1);
        xr[i] = xq + (size_t)row[i] * K;
      }}
      float out[MR][NP] __attribute__((aligned(64)));
#ifdef POOT_AVX2
      poot_vf acc[MR], off[MR];
      for (int i = 0; i < MR; ++i) acc[i] = off[i] = poot_vf_zero();
      for (int b = 0; b < NB; ++b) {{
        poot_vi s[MR];
        for (int i = 0; i < MR; ++i) s[i] = poot_vi_zero();
        POOT_UNROLL(POOT_PANEL_UNROLL)
        for (int j = 0; j < 16; ++j) {{
          const poot_vi wv = poot_vi_load(wp[b * 16 + j]);
          for (int i = 0; i < MR; ++i) {{
            int pair;
            memcpy(&pair, xr[i] + b * 32 + 2 * j, 4);
            s[i] = poot_vi_dot16(s[i], wv, poot_vi_set1(pair));
          }}
        }}
        const poot_vf dv = poot_vf_load(d[b]);
        for (int i = 0; i < MR; ++i) {{
          const int xi = row[i] * NB + b;
          acc[i] = poot_vf_fmadd(poot_vf_cvt(s[i]), poot_vf_mul(dv, poot_vf_set1(dx[xi])),
                                 acc[i]);
        }}
      }}
      for (int b = 0; b < NB; ++b) {{
        const poot_vf sv = poot_vf_load(shift[b]);
        for (int i = 0; i < MR; ++i) {{
          const int xi = row[i] * NB + b;
          off[i] = poot_vf_add(off[i], poot_vf_mul(sv, poot_vf_set1(xs[xi])));
        }}
      }}
      for (int i = 0; i < MR; ++i) poot_vf_store(out[i], poot_vf_add(acc[i], off[i]));
#else
      for (int i = 0; i < mr; ++i) {{
        float acc[NP] = {{0}}, off[NP] = {{0}};
        for (int b = 0; b < NB; ++b) {{
          const int xi = row[i] * NB + b;
          const short* xb = xr[i] + b * 32;
          for (int r = 0; r < NP; ++r) {{
            int p = 0;
            for (int j = 0; j < 32; ++j) p += wp[b * 16 + j / 2][r][j % 2] * xb[j];
            acc[r] += (float)p * (d[b][r] * dx[xi]);
            off[r] += shift[b][r] * xs[xi];
          }}
        }}
        for (int r = 0; r < NP; ++r) out[i][r] = acc[r] + off[r];
      }}
#endif
      for (int i = 0; i < mr; ++i)
        for (int r = 0; r < np; ++r) y[(size_t)(m0 + i) * N + n0 + r] = out[i][r];
{after_panel}    }}
  }}
{tail}}}
"""


# each 32-block of activations to int16 (see the module docstring); with AVX2 the
# magnitude and the rounding run 8 lanes at a time, with the scalar loop's results: max is
# exact (a NaN element is passed over, as `a > amax` does), the product is the same single
# multiply, the conversion rounds to nearest even as lrintf does, and the low 16 bits are
# kept as the (short) cast keeps them. The block sum stays the scalar, in-order sum.
QUANTIZE = """\
  for (int i = 0; i < M * NB; ++i) {
    const float* xb = x + (size_t)i * 32;
    float amax = 0.0f, s = 0.0f;
#ifdef POOT_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], mx = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      mx = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), mx);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    amax = _mm_cvtss_f32(m4);
    for (int j = 0; j < 32; ++j) s += xb[j];
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i low = _mm256_set1_epi32(0xffff);
    for (int j = 0; j < 2; ++j) {
      const __m256i a = _mm256_and_si256(
          _mm256_cvtps_epi32(_mm256_mul_ps(v[2 * j], vinv)), low);
      const __m256i b = _mm256_and_si256(
          _mm256_cvtps_epi32(_mm256_mul_ps(v[2 * j + 1], vinv)), low);
      _mm256_storeu_si256((__m256i*)(xq + (size_t)i * 32 + 16 * j),
                          _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8));
    }
#else
    for (int j = 0; j < 32; ++j) {
      const float a = fabsf(xb[j]);
      amax = a > amax ? a : amax;
      s += xb[j];
    }
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    for (int j = 0; j < 32; ++j) xq[(size_t)i * 32 + j] = (short)lrintf(xb[j] * inv);
#endif
    dx[i] = isfinite(s) ? amax / 32767.0f : s;
    xs[i] = s;
  }
"""


def scratch_bytes(m: int, k: int, layout: BlockLayout) -> int:
    """The quantized activations: int16 values, then a scale and a sum per block."""
    blocks = m * k // layout.elements
    return m * k * 2 + blocks * 8


LOCAL_BYTES = 1 << 17   # quantized activations up to this size stay on each thread's stack

SHARED_QUANT = """\
  short* restrict xq = (short*)scratch;
  float* restrict dx = (float*)(scratch + (size_t)M * K * 2);
  float* restrict xs = dx + M * NB;
  #pragma omp for schedule(static)"""

# a step's rows (up to LOCAL_BYTES of them) are quantized by every thread for itself: a
# few microseconds that save the barrier a shared copy needs (a step has hundreds of
# contractions, and under load a barrier waits for a descheduled thread)
LOCAL_QUANT = """\
  short xq[M * K] __attribute__((aligned(32)));
  float dx[M * NB], xs[M * NB];
  (void)scratch;"""


def weight_rows(layout: BlockLayout, mt: int, n: int) -> int:
    """Weight rows sharing one load of the activations: two for 4-bit decode steps (fewer
    loads per product); one where the registers would not hold them (the prefill tile)
    and for 8-bit quants, whose two rows' widened quants measured slower."""
    return 2 if layout.bits == 4 and mt < 8 and n % 2 == 0 else 1


@functools.cache   # one string per distinct function: a plan has ~200 calls of ~10 of them
def gemv_source(name: str, layout: BlockLayout, m: int, n: int, k: int, extra: str = "",
                prologue: str = "", after_tile: str = "", after_panel: str = "",
                tail: str = "") -> str:
    """One C function: y[M, N] = x[M, K] . W[N, K]^T for blocks of `layout` (with a fused
    epilogue: its parameters and code, from fused_epilogue)."""
    q = layout.quants
    # 4-bit quants are centred (q - 8) so the int16 products' rounding stays small against
    # the result; what the centring moves goes into the per-block shift
    centre = 8 if layout.bits == 4 else 0

    def shift(d: str) -> str:
        term = f"{float(centre - layout.bias)}f * {d}"
        return f"poot_h2f(blk + {layout.minimum}) + {term}" if layout.minimum is not None \
            else term

    if layout.bits == 4:
        # byte j holds element j (low nibble) and j + 16 (high): widened to 16 bits
        # first, one mask and one shift give both halves
        avx = [f"const __m256i v = _mm256_cvtepu8_epi16("
               f"_mm_loadu_si128((const __m128i*)(blk + {q})));",
               "const __m256i eight = _mm256_set1_epi16(8);",
               "w0[r] = _mm256_sub_epi16(_mm256_and_si256(v, _mm256_set1_epi16(15)), eight);",
               "w1[r] = _mm256_sub_epi16(_mm256_srli_epi16(v, 4), eight);"]
        scalar = ("for (int j = 0; j < 16; ++j) {{ {wq}[j] = (blk[{q} + j] & 15) - 8; "
                  "{wq}[j + 16] = (blk[{q} + j] >> 4) - 8; }}")
    else:
        avx = [f"w{j}[r] = _mm256_cvtepi8_epi16("
               f"_mm_loadu_si128((const __m128i*)(blk + {q + 16 * j})));" for j in range(2)]
        scalar = "for (int j = 0; j < 32; ++j) {wq}[j] = (signed char)blk[{q} + j];"
    pad = " " * 10
    local = m * k * 2 <= LOCAL_BYTES and m < PANEL_FROM
    common = dict(name=name, quantize=QUANTIZE, extra=extra, prologue=prologue, tail=tail,
                  quant_setup=LOCAL_QUANT if local else SHARED_QUANT, m=m, n=n, k=k,
                  nb=k // layout.elements, bs=layout.nbytes, scale=layout.scale)
    if m >= PANEL_FROM and PANEL_ROWS * k * 2 <= PANEL_BYTES:
        return PANEL_TEMPLATE.format(**common, shift=shift("d[b][r]"), after_panel=after_panel,
                                     avx_decode="\n".join(" " * 8 + x for x in avx),
                                     decode=" " * 8 + scalar.format(wq="wq", q=q))
    mt = M_TILES[m >= 8]
    return TEMPLATE.format(**common, mt=mt, nr=weight_rows(layout, mt, n), after_tile=after_tile,
                           shift=shift("d[r]"),
                           avx_decode="\n".join(pad + x for x in avx),
                           scalar_decode=pad + scalar.format(wq="wq[r]", q=q))


__all__ = ["LAYOUTS", "BlockLayout", "gemv_program", "gemv_source", "layout_of",
           "scratch_bytes"]
