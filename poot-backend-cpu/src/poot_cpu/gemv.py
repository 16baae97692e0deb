"""The packed contraction hot path: a C source builder driven by the plan's shapes and the
weight's block layout (design: "the heavy kernels may be parameterized source builders
per backend"). Written by hand because the shared GEMV schedule is shaped for GPUs (32
lanes per dot product and a subgroup reduction per output); on a CPU one thread should
stream whole weight rows through SIMD registers.

out[m, n] = sum_k x[m, k] * W[n, k] for every GGUF block type declared in
poot_cpu.blocks: each sub-block of 32 weights is 32 signed 8-bit codes c, a scale per 32
(or per 16) and an optional offset per 32 (or per 16), decoded in the kernel from the
packed bytes (nothing is decoded outside the loop). The activations are quantized once per
call, per block of 32, and a block's dot product is integer multiply-adds, scaled once by
the weight's scale times the activations' scale; the offset multiplies the activations'
block (or half-block) sum. Two activation codings, one loop:

* "i16" (the exact mode, a plain PackedContraction): int16 codes, scale max|x| / 32767,
  round to nearest, with the block's exact F32 sum for the offset; codes widened to
  int16 (AVX2 `madd_epi16`: exact int32 sums). NMSE against the oracle is about 4e-10 on
  random data (the conformance threshold for contractions is 3.7e-9).
* "q8" (Q8PackedContraction, the fast precision): GGUF's q8_0 rule bit for bit (d = amax
  / 127, q = round-half-even(x * (1 / d)) clamped to 127), offsets against d * sum(q); the
  codes times the weight's codes with the machine's byte dot product (AVX-512 VNNI or
  AVX-VNNI `dpbusd`, else AVX2 `maddubs`; printer.SIMD_HEADER), so the result is the
  composite's definition up to the order and rounding of the f32 sums.

The instruction set is the one the compiler targets (`-march=native`: the host's cpuid
when the plan is built); every narrower one compiles from the same source (the tests
build each). Without AVX2 the same integer arithmetic runs as plain C loops. Where AMX is
compiled in and Linux grants the tile state, a q8 prefill panel takes its integer sums
from tile products (AMX_PANEL) and scales them as the VNNI loop does: the same bits.
Panels (and attention's tiles) are dealt out dynamically: on a shared machine a thread
that is descheduled or slow to wake leaves its share to the one running.

A ContractionEpilogue over such a head becomes this kernel into a scratch buffer and
the shared pointwise lowering of its epilogue body.
"""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass

from poot.codegen import index as ix
from poot.codegen.expr import Load
from poot.codegen.lower.base import Sig
from poot.codegen.lower.pointwise import pointwise_kernel
from poot.codegen.program import OUT, SCRATCH, Access, BufferParam, Kernel, KernelProgram
from poot.codegen.region import RegionEval
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.ir.graph import Lit
from poot.ir.ops import ContractionEpilogue, PackedContraction, Q8PackedContraction
from poot.kernel_backend import CompiledProgram

from poot_cpu.blocks import Block, block_of, c_name, c_source, unsigned_codes
from poot_cpu.kernels import built_kernel

F32, U8 = DType.F32, DType.U8
M_TILES = (4, 8)    # activation rows sharing one decoded weight block: decode, prefill
PANEL_FROM = 8      # calls of at least this many rows use the panel kernel (PANEL_TEMPLATE)
PANEL_ROWS = 16     # weight rows of a panel at most (POOT_VL: 16 with AVX-512, else 8)
PANEL_BYTES = 1 << 18   # ... when a decoded panel (PANEL_ROWS x K codes) fits this on the stack
# the row tiles ask for each weight row's bytes this far ahead of their decode: a decode
# step streams every weight from memory once, and the formats whose decode takes many
# instructions a block (Q5_0, the K-quants) keep too few loads in flight for the hardware
# prefetcher alone (docs/performance.md has the measurement)
PREFETCH_BYTES = 4096
LOCAL_BYTES = 1 << 17   # quantized activations up to this size stay on each thread's stack


@dataclass(frozen=True)
class Coding:
    """How a kernel holds its activations: "i16" or "q8" (see the module docstring)."""

    name: str
    ctype: str          # C type of one code
    width: int          # bytes per code

    def scratch_bytes(self, m: int, k: int) -> int:
        """The codes, then per block of 32 a scale and a sum (f32), for q8 the two halves'
        integer code sums, and the halves' sums in f32 (formats with an offset per 16 use
        them)."""
        base = m * k * self.width + m * k // 32 * (16 if self.name == "i16" else 24)
        return amx_at(m, k) + amx_bytes(m, k) if self.name == "q8" and m >= PANEL_FROM \
            else base


I16 = Coding("i16", "short", 2)
Q8 = Coding("q8", "signed char", 1)


def _head(op, ins):
    """(the weight's format name, its Block, the activation coding) when the eqn is a
    contraction this builder takes, else None."""
    head, n_head = (op.head, op.n_head) if isinstance(op, ContractionEpilogue) else (op, 2)
    if n_head != 2:
        return None
    if isinstance(head, PackedContraction):
        coding = I16
    elif isinstance(head, Q8PackedContraction):
        coding = Q8
    else:
        return None
    x, w = ins[0], ins[1]
    if isinstance(x, Lit) or isinstance(w, Lit) or x.dtype is not F32 or w.dtype is not U8:
        return None
    block = block_of(head.weight.format)
    n, k = head.weight.shape
    if block is None or k % block.elements or x.shape[-1] != k:
        return None
    if w.nbytes != n * k // block.elements * block.nbytes:
        return None
    return head.weight.format, block, coding


def q8_formats(formats) -> frozenset[str]:
    """The formats among `formats` whose contraction of q8 rows (Q8PackedContraction) the
    kernels here run: those with a block declaration (poot_cpu.blocks)."""
    return frozenset(f for f in formats if block_of(f) is not None)


def gemv_program(op, ins, out, printer) -> CompiledProgram | None:
    found = _head(op, ins)
    if found is None:
        return None
    fmt, block, coding = found
    n, k = op.head.weight.shape if isinstance(op, ContractionEpilogue) else op.weight.shape
    m = math.prod(ins[0].shape[:-1])
    sig = Sig(op, tuple(ins), out)
    name = f"{sig.name}_gemv"
    y = result_param(op, out, m * n)
    if y is None:
        return None
    xq = BufferParam("xq", U8, Access.READ_WRITE, coding.scratch_bytes(m, k), SCRATCH)
    bufs = (BufferParam("x", F32, Access.READ, m * k, 0),
            BufferParam("w", U8, Access.READ, ins[1].size, 1), y, xq)
    return contraction_program(
        sig, name, bufs, y, (xq,), lambda *fused: kernel_source(name, fmt, coding, m, n, k,
                                                                *fused), m * k, printer)


def result_param(op, out, size: int) -> BufferParam | None:
    """What a contraction kernel writes: the output itself (plain; F32 only, else None) or
    the F32 accumulator its epilogue reads."""
    if isinstance(op, ContractionEpilogue):
        return BufferParam("acc", F32, Access.READ_WRITE, size, SCRATCH)
    return BufferParam("y", F32, Access.WRITE, size, OUT) if out.dtype is F32 else None


def contraction_program(sig: Sig, name: str, bufs, y: BufferParam, scratch: tuple,
                        source, x_count: int, printer) -> CompiledProgram:
    """A contraction kernel writing `y`, then its epilogue if `sig.op` has one: fused into
    the contraction's function where fused_epilogue can, else as kernels after it.
    `source(*pieces)`: the kernel's C function, given fused_epilogue's pieces or none."""
    if not isinstance(sig.op, ContractionEpilogue):
        kernel = built_kernel(name, source(), bufs)
        return CompiledProgram(KernelProgram((kernel.kernel,), scratch=scratch), (kernel,),
                               printer.device)
    epis = epilogue(sig, y).kernels
    fused = fused_epilogue(epis[0], sig, x_count, printer) if len(epis) == 1 else None
    if fused is not None:
        pieces, epi_source = fused
        # interned: a plan holds one copy of each distinct function, not one per call
        kernel = built_kernel(name, sys.intern(epi_source + source(*pieces)),
                              bufs + tuple(b for b in epis[0].buffers if b.name != "acc"))
        return CompiledProgram(KernelProgram((kernel.kernel,), scratch=(y, *scratch)),
                               (kernel,), printer.device)
    kernels = (built_kernel(name, source(), bufs),
               *(built_kernel(e.name, printer.source(e), e.buffers) for e in epis))
    return CompiledProgram(KernelProgram(tuple(k.kernel for k in kernels),
                                         scratch=(y, *scratch)), kernels, printer.device)


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
  enum {{ M = {m}, N = {n}, K = {k}, NB = K / 32, NBLK = {nblk}, S = {sub}, TS = {ts}, G = {g},
         OG = {og}, MT = {mt}, NR = {nr}, PF = {pf} }};
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
      for (int bb = 0; bb < NBLK; ++bb) {{
        const unsigned char* blk[NR];
        float sc[NR][S * G], of[NR][S * OG];
        for (int r = 0; r < NR; ++r) {{
          blk[r] = w + ((size_t)(n0 + r) * NBLK + bb) * TS;
          {fn}_scales(blk[r], sc[r], of[r]);
        }}
        for (int r = 0; r < NR; ++r)      /* PF bytes ahead in each row's stream */
          for (int o = 0; o < TS; o += 64) __builtin_prefetch(blk[r] + PF + o, 0, 3);
        POOT_UNROLL(8)
        for (int s = 0; s < S; ++s) {{
          const int b = bb * S + s;
#ifdef POOT_AVX2
{codes}
#else
          signed char c[NR][32];
          for (int r = 0; r < NR; ++r) {fn}_codes_c(blk[r], s, c[r]);
#endif
          for (int i = 0; i < mt; ++i) {{
            const int xi = (m0 + i) * NB + b;
            const {xt}* xb = xq + (size_t)xi * 32;
#ifdef POOT_AVX2
{load}
            for (int r = 0; r < NR; ++r) {{
{dot}{offset_avx}            }}
#else
            for (int r = 0; r < NR; ++r) {{
              for (int g = 0; g < G; ++g) {{
                int p = 0;
                for (int j = g * (32 / G); j < (g + 1) * (32 / G); ++j) p += c[r][j] * xb[j];
                acc[r][i] += (float)p * (sc[r][s * G + g] * dx[xi]);
              }}
{offset}            }}
#endif
          }}
        }}
{block_offset}      }}
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

# the row tiles' pieces per coding: the sub-block's codes for the NR weight rows, one
# activation block, and its products into acc (per 32 or, G = 2, per 16 elements)
ROW_CODES = {
    "i16": """\
          __m256i w0[NR], w1[NR];
          for (int r = 0; r < NR; ++r) {fn}_codes16(blk[r], s, w0 + r, w1 + r);""",
    "q8": """\
          __m256i c[NR];
          for (int r = 0; r < NR; ++r) c[r] = {fn}_codes(blk[r], s);""",
}
ROW_LOAD = {
    "i16": """\
            const __m256i x0 = _mm256_loadu_si256((const __m256i*)xb);
            const __m256i x1 = _mm256_loadu_si256((const __m256i*)(xb + 16));""",
    "q8": "            const __m256i xv = _mm256_loadu_si256((const __m256i*)xb);",
}
ROW_DOT = {
    ("i16", 1): """\
              const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(w0[r], x0),
                                                 _mm256_madd_epi16(w1[r], x1));
              acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                          _mm256_set1_ps(sc[r][s] * dx[xi]), acc[r][i]);
""",
    ("i16", 2): """\
              acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(w0[r], x0)),
                                          _mm256_set1_ps(sc[r][2 * s] * dx[xi]), acc[r][i]);
              acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(w1[r], x1)),
                                          _mm256_set1_ps(sc[r][2 * s + 1] * dx[xi]), acc[r][i]);
""",
    ("q8", 1): """\
              acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(poot_dot_i8(c[r], xv)),
                                          _mm256_set1_ps(sc[r][s] * dx[xi]), acc[r][i]);
""",
    # lanes 0-3 of the byte dot product hold elements 0-15, lanes 4-7 elements 16-31
    ("q8", 2): """\
              acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(poot_dot_i8(c[r], xv)),
                                          _mm256_set_m128(_mm_set1_ps(sc[r][2 * s + 1] * dx[xi]),
                                                          _mm_set1_ps(sc[r][2 * s] * dx[xi])),
                                          acc[r][i]);
""",
}
# AVX2 without VNNI, codes u - centre (blocks.unsigned_codes): the row tile holds u and
# takes the centre x the activations' pair sums off before widening (printer.poot_dot_u8)
ROW_XC = "\n            const __m256i xc = _mm256_maddubs_epi16(_mm256_set1_epi8({centre}), xv);"


def u8_row(u8: bool, old: str, new: str) -> str:
    """A row tile piece: `new` where POOT_U8DOT is compiled in and the format's codes are
    unsigned fields (`u8`), else `old`."""
    if not u8:
        return old
    return f"#if POOT_U8DOT\n{new.rstrip(chr(10))}\n#else\n{old.rstrip(chr(10))}\n#endif\n"


def row_offset(offsets: int) -> str:
    """The row tiles' offset term of sub-block s, one addition into off[r][i] (two offsets
    per 16 summed first: the chain of additions bounds a decode tile)."""
    term = "of[r][s] * xs[xi]" if offsets == 1 else \
        "of[r][2 * s] * xh[2 * xi] + of[r][2 * s + 1] * xh[2 * xi + 1]"
    return f"              off[r][i] += {term};\n"


# with AVX2, a block whose offsets fill whole vectors (the K-quants') has them multiplied
# by the activations' sums per block, into the dot products' lanes (summed at the end
# anyway): a vector multiply-add per 8 offsets instead of a scalar chain of additions
BLOCK_OFFSET = """\
#ifdef POOT_AVX2
        for (int r = 0; r < NR; ++r)
          for (int i = 0; i < mt; ++i) {{
            const float* h = {sums} + (size_t)((m0 + i) * NB + bb * S) * {og};
            for (int e = 0; e < S * {og}; e += 8)
              acc[r][i] = _mm256_fmadd_ps(_mm256_loadu_ps(of[r] + e), _mm256_loadu_ps(h + e),
                                          acc[r][i]);
          }}
#endif
"""


def offset_sum(offsets: int) -> str:
    """The C expression of the activations' sum that offset h of block xi multiplies: the
    block's (xs) with one offset per 32, else its half h's (xh)."""
    return "xs[xi]" if offsets == 1 else "xh[2 * xi + h]"


# the prefill tile: a panel of NP = POOT_VL weight rows (16 with AVX-512, else 8) is
# decoded once per call onto the thread's stack, NP rows per vector: for i16 as int16
# k-pair major (pair p of the NP rows is one vector), for q8 as bytes k-quad major, each
# code stored as c ^ 0x80 (c + 128: unsigned, for dpbusd; the sum of 128 x the block's
# activation codes comes off again, exactly, POOT_DOT8_BIAS); the decoded blocks are
# transposed 8 rows at a time, the per-block scales and offsets stored across the rows.
# MR activation rows at a time then run through it as an outer product: each pair (quad)
# of activations is broadcast and multiplied into the NP rows' int32 sums, so no sum is
# reduced across lanes; per block (per 16 where the format scales 16) the sums are
# converted and scaled once for the NP rows. Each output gets the same integer dot products
# and float operations, in the same order, at every vector width.
PANEL_TEMPLATE = """\
static void {name}(const float* restrict x, const unsigned char* restrict w,
                   float* restrict y, unsigned char* restrict scratch{extra}) {{
  enum {{ M = {m}, N = {n}, K = {k}, NB = K / 32, NBLK = {nblk}, S = {sub}, TS = {ts}, G = {g},
         OG = {og}, NP = POOT_VL, MR = {mr}, PER = {per} }};
{prologue}{amx_setup}{quant_setup}
{quantize}{amx}  #pragma omp for schedule(dynamic, 1) nowait
  for (int n0 = 0; n0 < N; n0 += NP) {{
    const int np = N - n0 < NP ? N - n0 : NP;
    {pt} wp[K / PER][NP][PER] __attribute__((aligned(64)));
    float scl[NB * G][NP] __attribute__((aligned(64)));
    float shift[NB * OG][NP] __attribute__((aligned(64)));
    for (int bb = 0; bb < NBLK; ++bb) {{
      for (int r = 0; r < NP; ++r) {{
        float sc[S * G], of[S * OG];
        if (r < np) {fn}_scales(w + ((size_t)(n0 + r) * NBLK + bb) * TS, sc, of);
        for (int e = 0; e < S * G; ++e) scl[bb * S * G + e][r] = r < np ? sc[e] : 0.0f;
{panel_offsets}      }}
      for (int s = 0; s < S; ++s) {{
        const int b = bb * S + s;
#ifdef POOT_AVX2
{panel_codes}
#else
        for (int r = 0; r < NP; ++r) {{
          signed char c[32] = {{0}};
          if (r < np) {fn}_codes_c(w + ((size_t)(n0 + r) * NBLK + bb) * TS, s, c);
          for (int j = 0; j < 32; ++j) wp[b * (32 / PER) + j / PER][r][j % PER] = {store_c};
        }}
#endif
      }}
    }}
    for (int m0 = 0; m0 < M; m0 += MR) {{
      const int mr = M - m0 < MR ? M - m0 : MR;
      int row[MR];               /* rows past M repeat the last one; their sums are unused */
      const {xt}* xr[MR];
      for (int i = 0; i < MR; ++i) {{
        row[i] = m0 + (i < mr ? i : mr - 1);
        xr[i] = xq + (size_t)row[i] * K;
      }}
      float out[MR][NP] __attribute__((aligned(64)));
#ifdef POOT_AVX2
      poot_vf acc[MR], off[MR];
      for (int i = 0; i < MR; ++i) acc[i] = off[i] = poot_vf_zero();
      for (int b = 0; b < NB; ++b) {{
        for (int g = 0; g < G; ++g) {{
          poot_vi s[MR];
{panel_sums}          const poot_vf dv = poot_vf_load(scl[b * G + g]);
          for (int i = 0; i < MR; ++i) {{
            const int xi = row[i] * NB + b;
            acc[i] = poot_vf_fmadd(poot_vf_cvt(s[i]), poot_vf_mul(dv, poot_vf_set1(dx[xi])),
                                   acc[i]);
          }}
        }}
      }}
{panel_off}      for (int i = 0; i < MR; ++i) poot_vf_store(out[i], poot_vf_add(acc[i], off[i]));
#else
      for (int i = 0; i < mr; ++i) {{
        float acc[NP] = {{0}}, off[NP] = {{0}};
        for (int b = 0; b < NB; ++b) {{
          const int xi = row[i] * NB + b;
          const {xt}* xb = xr[i] + b * 32;
          for (int r = 0; r < NP; ++r) {{
            for (int g = 0; g < G; ++g) {{
              int p = 0;
              for (int j = g * (32 / G); j < (g + 1) * (32 / G); ++j)
                p += {load_c} * xb[j];
              acc[r] += (float)p * (scl[b * G + g][r] * dx[xi]);
            }}
{panel_off_c}          }}
        }}
        for (int r = 0; r < NP; ++r) out[i][r] = acc[r] + off[r];
      }}
#endif
      for (int i = 0; i < mr; ++i)
        for (int r = 0; r < np; ++r) y[(size_t)(m0 + i) * N + n0 + r] = out[i][r];
{after_panel}    }}
  }}
{amx_end}{tail}}}
"""

PANEL_SUMS = """\
          for (int i = 0; i < MR; ++i) s[i] = poot_vi_zero();
          POOT_UNROLL(POOT_PANEL_UNROLL)
          for (int j = g * (32 / PER / G); j < (g + 1) * (32 / PER / G); ++j) {{
            const poot_vi wv = poot_vi_load(wp[b * (32 / PER) + j]);
            for (int i = 0; i < MR; ++i) {{
              int pack;
              memcpy(&pack, xr[i] + b * 32 + PER * j, 4);
              s[i] = {panel_dot}(s[i], wv, poot_vi_set1(pack));
            }}
          }}
{panel_bias}"""

# AVX2 without VNNI, codes u - centre with u < 64 (blocks.unsigned_codes): the panel holds
# u itself and maddubs multiplies it by the activations' quads; a 4-bit u's pair sums
# (<= 2 x 15 x 127) add up exactly in int16 over a whole group of eight quads (<= 30480)
# and widen once, wider codes widen every quad; the centre x the group's activation sum
# then comes off as an integer: the same int32 sums as the other paths
PANEL_SUMS_U8 = """\
#if POOT_U8DOT
          {{
            __m256i h[MR];
            for (int i = 0; i < MR; ++i) {{
              s[i] = _mm256_setzero_si256();
              h[i] = _mm256_setzero_si256();
            }}
            POOT_UNROLL(POOT_PANEL_UNROLL)
            for (int j = g * (8 / G); j < (g + 1) * (8 / G); ++j) {{
              const __m256i wv = _mm256_load_si256((const __m256i*)wp[b * 8 + j]);
              for (int i = 0; i < MR; ++i) {{
                int pack;
                memcpy(&pack, xr[i] + b * 32 + 4 * j, 4);
                const __m256i p = _mm256_maddubs_epi16(wv, _mm256_set1_epi32(pack));
{u8_step}              }}
            }}
            for (int i = 0; i < MR; ++i) {{
              const int xi = row[i] * NB + b;
              const int qs = G == 1 ? qh[2 * xi] + qh[2 * xi + 1] : qh[2 * xi + g];
              s[i] = _mm256_sub_epi32({u8_wide}, _mm256_set1_epi32({centre} * qs));
            }}
          }}
#else
{old}#endif
"""
U8_STEP = {True: "                h[i] = _mm256_add_epi16(h[i], p);\n",
           False: "                s[i] = _mm256_add_epi32(s[i], "
                  "_mm256_madd_epi16(p, _mm256_set1_epi16(1)));\n"}
U8_WIDE = {True: "_mm256_add_epi32(s[i], _mm256_madd_epi16(h[i], _mm256_set1_epi16(1)))",
           False: "s[i]"}

PANEL = {
    "i16": dict(pt="short", per=2, panel_dot="poot_vi_dot16", panel_bias="",
                store_c="c[j]", load_c="wp[b * 16 + j / 2][r][j % 2]", panel_codes="""\
        __m256i w0[NP], w1[NP];   /* row r's elements 0-15 and 16-31: eight pairs each */
        for (int r = 0; r < NP; ++r) {{
          if (r < np) {fn}_codes16(w + ((size_t)(n0 + r) * NBLK + bb) * TS, s, w0 + r, w1 + r);
          else w0[r] = w1[r] = _mm256_setzero_si256();
        }}
        for (int g = 0; g < NP / 8; ++g) {{
          poot_transpose8x32(w0 + 8 * g, (__m256i*)wp[b * 16] + g, NP / 8);
          poot_transpose8x32(w1 + 8 * g, (__m256i*)wp[b * 16 + 8] + g, NP / 8);
        }}"""),
    "q8": dict(pt="unsigned char", per=4, panel_dot="poot_vi_dot8",
               store_c="(unsigned char)(c[j] ^ 0x80)",
               load_c="(signed char)(wp[b * 8 + j / 4][r][j % 4] ^ 0x80)",
               panel_bias="""\
#if POOT_DOT8_BIAS
          for (int i = 0; i < MR; ++i) {
            const int xi = row[i] * NB + b;
            const int qs = G == 1 ? qh[2 * xi] + qh[2 * xi + 1] : qh[2 * xi + g];
            s[i] = poot_vi_sub(s[i], poot_vi_set1(POOT_DOT8_BIAS * qs));
          }
#endif
""", panel_codes="""\
        __m256i cv[NP];           /* row r's 32 codes, c ^ 0x80: eight quads */
        for (int r = 0; r < NP; ++r)
          cv[r] = _mm256_xor_si256(r < np ? {fn}_codes(w + ((size_t)(n0 + r) * NBLK + bb) * TS, s)
                                          : _mm256_setzero_si256(), _mm256_set1_epi8(-128));
        for (int g = 0; g < NP / 8; ++g)
          poot_transpose8x32(cv + 8 * g, (__m256i*)wp[b * 8] + g, NP / 8);"""),
}
# the q8 panel's codes as u (PANEL_SUMS_U8) where the format's codes are unsigned fields
PANEL_CODES_U8 = """\
#if POOT_U8DOT
        __m256i cv[NP];           /* row r's 32 field values u: eight quads */
        for (int r = 0; r < NP; ++r)
          cv[r] = r < np ? {fn}_ucodes(w + ((size_t)(n0 + r) * NBLK + bb) * TS, s)
                         : _mm256_setzero_si256();
        for (int g = 0; g < NP / 8; ++g)
          poot_transpose8x32(cv + 8 * g, (__m256i*)wp[b * 8] + g, NP / 8);
#else
{old}
#endif"""

# the prefill panel of q8 rows on AMX (formats with one scale and at most one offset per
# 32): a panel of 16 weight rows is decoded once per call as bytes c ^ 0x80, a block of
# 32 codes per row (tile 1, no transpose); the quantize loop has also laid each block of 16
# activation rows out as tile 2 (AMX_QUANTIZE). One tile product per block gives the 16 x
# 16 integer sums, which are then scaled exactly as the VNNI panel scales them (the bias
# taken off as an integer, the same products, multiply-adds and offset sums in the same
# order), so both give the same bits; AVX-512 vectors run across the 16 activation rows.
AMX_SETUP = """\
#if POOT_AMX
  enum { MP = (M + 15) / 16 * 16 };
  unsigned char* restrict at = scratch + {amx_at};
  float* restrict adx = (float*)(at + (size_t)MP * K);
  float* restrict axs = adx + MP * NB;
  int* restrict abias = (int*)(axs + MP * NB);
#endif
"""
AMX_QUANTIZE = """\
#if POOT_AMX
    {                             /* block b of row m into tile (m / 16, b), column m % 16 */
      const int m = i / NB, b = i % NB, l = m % 16;
      const size_t t = (size_t)(m / 16) * NB + b;
      for (int q = 0; q < 8; ++q) memcpy(at + t * 512 + q * 64 + l * 4, qb + 4 * q, 4);
      adx[t * 16 + l] = dx[i];
      axs[t * 16 + l] = xs[i];
      abias[t * 16 + l] = POOT_DOT8_BIAS * (h0 + h1);
    }
#endif
"""
AMX_PANEL = """\
#if POOT_AMX
  if (poot_amx_ready()) {{
    poot_amx_config();
    #pragma omp for schedule(dynamic, 1) nowait
    for (int n0 = 0; n0 < N; n0 += 16) {{
      const int np = N - n0 < 16 ? N - n0 : 16;
      unsigned char wa[NB][16][32] __attribute__((aligned(64)));
      float scl[NB][16] __attribute__((aligned(64)));
      float shift[NB][16] __attribute__((aligned(64)));
      (void)shift;
      for (int bb = 0; bb < NBLK; ++bb) {{
        for (int r = 0; r < 16; ++r) {{
          float sc[S], of[S * OG];
          if (r < np) {fn}_scales(w + ((size_t)(n0 + r) * NBLK + bb) * TS, sc, of);
          for (int e = 0; e < S; ++e) scl[bb * S + e][r] = r < np ? sc[e] : 0.0f;
{amx_offsets}        }}
        for (int s = 0; s < S; ++s)
          for (int r = 0; r < 16; ++r)
            _mm256_store_si256((__m256i*)wa[bb * S + s][r], _mm256_xor_si256(
                r < np ? {fn}_codes(w + ((size_t)(n0 + r) * NBLK + bb) * TS, s)
                       : _mm256_setzero_si256(), _mm256_set1_epi8(-128)));
      }}
      for (int m0 = 0; m0 < M; m0 += 16) {{
        const int mr = M - m0 < 16 ? M - m0 : 16;
        const size_t t0 = (size_t)(m0 / 16) * NB;
        __m512 acc[16], off[16];
        int cb[4][16][16] __attribute__((aligned(64)));
        for (int r = 0; r < 16; ++r) acc[r] = off[r] = _mm512_setzero_ps();
        /* four blocks' products in flight while the previous four are scaled */
        POOT_AMX_PRODUCTS(wa, at + t0 * 512, NB < 4 ? NB : 4);
        for (int b0 = 0; b0 < NB; b0 += 4) {{
          const int nb = NB - b0 < 4 ? NB - b0 : 4, nx = NB - b0 - 4 < 4 ? NB - b0 - 4 : 4;
          POOT_AMX_STORE(cb, nb);
          if (nx > 0) POOT_AMX_PRODUCTS(wa + b0 + 4, at + (t0 + b0 + 4) * 512, nx);
          for (int j = 0; j < nb; ++j) {{
            const int b = b0 + j;
            const __m512 dv = _mm512_loadu_ps(adx + (t0 + b) * 16);
            const __m512i bias = _mm512_loadu_si512(abias + (t0 + b) * 16);
            for (int r = 0; r < 16; ++r) {{
              const __m512i sum = _mm512_sub_epi32(_mm512_load_si512(cb[j][r]), bias);
              acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                       _mm512_mul_ps(_mm512_set1_ps(scl[b][r]), dv), acc[r]);
            }}
          }}
        }}
{amx_off}        float out[16][16] __attribute__((aligned(64)));
        for (int r = 0; r < 16; ++r) _mm512_store_ps(out[r], _mm512_add_ps(acc[r], off[r]));
        for (int i = 0; i < mr; ++i)
          for (int r = 0; r < np; ++r) y[(size_t)(m0 + i) * N + n0 + r] = out[r][i];
{after_panel}      }}
    }}
    _tile_release();
  }} else
#endif
  {{
"""
AMX_OFFSETS = """\
          for (int e = 0; e < S; ++e) shift[bb * S + e][r] = r < np ? of[e] : 0.0f;
"""
AMX_OFF = """\
        for (int b = 0; b < NB; ++b) {
          const __m512 sv = _mm512_loadu_ps(axs + (t0 + b) * 16);
          for (int r = 0; r < 16; ++r)
            off[r] = _mm512_add_ps(off[r], _mm512_mul_ps(_mm512_set1_ps(shift[b][r]), sv));
        }
"""


def amx_at(m: int, k: int) -> int:
    """Where the AMX tiles of the activations start in a q8 panel's scratch: after the
    codes and per-block sums, on a cache line."""
    return (m * k + m * k // 32 * 24 + 63) // 64 * 64


def amx_bytes(m: int, k: int) -> int:
    """The AMX part of a q8 panel's scratch: the activation tiles of rows padded to 16,
    then per block and row its scale, its sum and its bias."""
    mp = -(-m // 16) * 16
    return mp * k + mp * k // 32 * 12


def amx_panel(block: Block, coding: Coding) -> bool:
    """Whether the panel kernel has an AMX path: q8 rows, one scale and offset per 32."""
    return coding is Q8 and block.groups == 1 and block.offsets == 1


PANEL_OFFSETS = """\
        for (int e = 0; e < S * OG; ++e) shift[bb * S * OG + e][r] = r < np ? of[e] : 0.0f;
"""
PANEL_OFF = """\
      for (int b = 0; b < NB; ++b)
        for (int h = 0; h < OG; ++h) {{
          const poot_vf sv = poot_vf_load(shift[b * OG + h]);
          for (int i = 0; i < MR; ++i) {{
            const int xi = row[i] * NB + b;
            off[i] = poot_vf_add(off[i], poot_vf_mul(sv, poot_vf_set1({osum})));
          }}
        }}
"""
PANEL_OFF_C = ("            for (int h = 0; h < OG; ++h) "
               "off[r] += shift[b * OG + h][r] * {osum};\n")


# each 32-block of activations to int16 (see the module docstring); with AVX2 the
# magnitude and the rounding run 8 lanes at a time, with the scalar loop's results: max is
# exact (a NaN element is passed over, as `a > amax` does), the product is the same single
# multiply, the conversion rounds to nearest even as lrintf does, and the low 16 bits are
# kept as the (short) cast keeps them. The block sum stays the scalar, in-order sum.
QUANTIZE_I16 = """\
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
    if (OG == 2) {                /* the sums of each 16, for offsets per 16 */
      float h0 = 0.0f, h1 = 0.0f;
      for (int j = 0; j < 16; ++j) {
        h0 += xb[j];
        h1 += xb[16 + j];
      }
      xh[2 * i] = h0;
      xh[2 * i + 1] = h1;
    }
    dx[i] = isfinite(s) ? amax / 32767.0f : s;
    xs[i] = s;
  }
"""

# each 32-block of activations by GGUF's q8_0 rule (QuantizeI8, docs/ir.md 10.8), bit for
# bit: d = amax / 127, inv = 1 / d (0 for d = 0), q = round-half-even(x * inv) clamped to
# +-127, a NaN product 0 (the product is clamped before the conversion, which rounds to
# nearest even as lrintf does); a block with a non-finite element gets a NaN scale, as
# the definition's d or products give. qh: the integer sums of each 16 codes.
QUANTIZE_Q8 = """\
  for (int i = 0; i < M * NB; ++i) {
    const float* xb = x + (size_t)i * 32;
    signed char* qb = xq + (size_t)i * 32;
    float amax = 0.0f;
    int h0 = 0, h1 = 0, bad = 0;
#ifdef POOT_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(127.0f);
    __m256 v[4], mx = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      const __m256 a = _mm256_andnot_ps(sign, v[j]);
      mx = _mm256_max_ps(a, mx);
      bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(INFINITY), _CMP_NLT_UQ));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      __m256 t = _mm256_mul_ps(v[j], vinv);
      t = _mm256_andnot_ps(_mm256_cmp_ps(t, t, _CMP_UNORD_Q), t);
      t = _mm256_min_ps(_mm256_max_ps(t, _mm256_sub_ps(_mm256_setzero_ps(), big)), big);
      q[j] = _mm256_cvtps_epi32(t);
    }
    const __m256i lo = _mm256_add_epi32(q[0], q[1]), hi = _mm256_add_epi32(q[2], q[3]);
    __m128i l4 = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    __m128i h4 = _mm_add_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
    l4 = _mm_hadd_epi32(_mm_hadd_epi32(l4, h4), _mm_setzero_si128());
    h0 = _mm_cvtsi128_si32(l4);
    h1 = _mm_extract_epi32(l4, 1);
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i*)qb, _mm256_permutevar8x32_epi32(
        bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
    for (int j = 0; j < 32; ++j) {
      const float a = fabsf(xb[j]);
      amax = a > amax ? a : amax;
      bad |= !(a < INFINITY);
    }
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) {
      float t = xb[j] * inv;
      t = t != t ? 0.0f : t < -127.0f ? -127.0f : t > 127.0f ? 127.0f : t;
      qb[j] = (signed char)lrintf(t);
      if (j < 16) h0 += qb[j]; else h1 += qb[j];
    }
#endif
    dx[i] = bad ? NAN : d;
    xs[i] = dx[i] * (float)(h0 + h1);
    qh[2 * i] = h0;
    qh[2 * i + 1] = h1;
    if (OG == 2) {                /* the sums of each 16, for offsets per 16 */
      xh[2 * i] = dx[i] * (float)h0;
      xh[2 * i + 1] = dx[i] * (float)h1;
    }
  }
"""


def _quant_setup(coding: Coding, local: bool) -> str:
    if local:
        # a step's rows (up to LOCAL_BYTES of them) are quantized by every thread for
        # itself: a few microseconds that save the barrier a shared copy needs (a step has
        # hundreds of contractions, and under load a barrier waits for a descheduled thread)
        extra = ("  int qh[2 * M * NB];\n" if coding is Q8 else "") + \
            "  float xh[OG == 2 ? 2 * M * NB : 1];\n  (void)xh;\n"
        return (f"  {coding.ctype} xq[M * K] __attribute__((aligned(32)));\n"
                f"  float dx[M * NB], xs[M * NB];\n{extra}  (void)scratch;")
    extra = ("  int* restrict qh = (int*)(xs + M * NB);\n"
             "  float* restrict xh = (float*)(qh + 2 * M * NB);\n" if coding is Q8 else
             "  float* restrict xh = xs + M * NB;\n") + "  (void)xh;\n"
    return (f"  {coding.ctype}* restrict xq = ({coding.ctype}*)scratch;\n"
            f"  float* restrict dx = (float*)(scratch + (size_t)M * K * {coding.width});\n"
            f"  float* restrict xs = dx + M * NB;\n{extra}"
            "  #pragma omp for schedule(static)")


def weight_rows(block: Block, coding: Coding, mt: int, n: int, k: int = 0) -> int:
    """Weight rows sharing one load of the activations (two independent sums per activation
    row): two in decode steps for 4-bit codes, and for every format's byte codes; one
    where the registers would not hold them (the prefill tile) and for wider codes
    widened to int16, whose two rows measured slower. On a host whose byte dot product is
    AVX2's (no VNNI), a weight of byte codes far past the caches (an LM head) streams
    faster one row at a time (docs/performance.md, 2026-12-07 22 UTC)."""
    pair = block.bits == 4 or coding is Q8
    if coding is Q8 and block.bits == 8 and n * k >= STREAM_ONE_ROW and not _host_vnni():
        pair = False
    return 2 if pair and mt < 8 and n % 2 == 0 else 1


STREAM_ONE_ROW = 1 << 24    # weight elements from which weight_rows streams one row (AVX2)


def _host_vnni() -> bool:
    from poot_cpu.compiler import cpu_flags

    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags())


def block_functions(fmt: str) -> str:
    """The format's decode functions, once per translation unit."""
    guard = c_name(fmt).upper()
    return f"#ifndef {guard}\n#define {guard}\n{c_source(fmt)}#endif\n"


@functools.cache   # one string per distinct function: a plan has ~200 calls of ~10 of them
def kernel_source(name: str, fmt: str, coding: Coding, m: int, n: int, k: int,
                  extra: str = "", prologue: str = "", after_tile: str = "",
                  after_panel: str = "", tail: str = "") -> str:
    """One C function: y[M, N] = x[M, K] . W[N, K]^T for a weight of format `fmt`, its
    activations coded by `coding` (with a fused epilogue: its parameters and code, from
    fused_epilogue), after the format's decode functions."""
    block = block_of(fmt)
    fn = c_name(fmt)
    local = m * k * coding.width <= LOCAL_BYTES and m < PANEL_FROM
    g = block.groups
    common = dict(name=name, extra=extra, prologue=prologue, tail=tail, fn=fn,
                  quant_setup=_quant_setup(coding, local), m=m, n=n, k=k,
                  quantize=QUANTIZE_Q8 if coding is Q8 else QUANTIZE_I16,
                  nblk=k // block.elements, sub=block.subblocks, ts=block.nbytes, g=g,
                  og=block.offsets, xt=coding.ctype)
    offsets = block.has_offset
    vector_offsets = offsets and block.subblocks * block.offsets % 8 == 0
    osum = offset_sum(block.offsets)
    u8 = coding is Q8 and unsigned_codes(block)    # AVX2 alone: POOT_U8DOT's loops
    if m >= PANEL_FROM and PANEL_ROWS * k * coding.width <= PANEL_BYTES:
        p = PANEL[coding.name]
        amx = amx_panel(block, coding)
        if amx:
            assert QUANTIZE_Q8.endswith("  }\n")
            common["quantize"] = QUANTIZE_Q8[:-4] + AMX_QUANTIZE + "  }\n"
        panel_sums = PANEL_SUMS.format(panel_dot=p["panel_dot"], panel_bias=p["panel_bias"])
        panel_codes = p["panel_codes"].format(fn=fn)
        if u8:
            four = block.bits <= 4
            panel_sums = PANEL_SUMS_U8.format(u8_step=U8_STEP[four], u8_wide=U8_WIDE[four],
                                              centre=block.centre, old=panel_sums)
            panel_codes = PANEL_CODES_U8.format(fn=fn, old=panel_codes)
        source = PANEL_TEMPLATE.format(
            **common, after_panel=after_panel, pt=p["pt"], per=p["per"],
            amx_setup=AMX_SETUP.replace("{amx_at}", str(amx_at(m, k))) if amx else "",
            amx=AMX_PANEL.format(
                fn=fn, after_panel=after_panel,
                amx_offsets=AMX_OFFSETS if offsets else "",
                amx_off=AMX_OFF if offsets else "") if amx else "",
            amx_end="  }\n" if amx else "",
            panel_sums=panel_sums, store_c=p["store_c"],
            mr="POOT_PANEL_MR_U8" if u8 else "POOT_PANEL_MR",
            load_c=p["load_c"], panel_codes=panel_codes,
            panel_offsets=PANEL_OFFSETS if offsets else "",
            panel_off=PANEL_OFF.format(osum=osum) if offsets else "",
            panel_off_c=PANEL_OFF_C.format(osum=osum) if offsets else "")
    else:
        mt = M_TILES[m >= 8]
        source = TEMPLATE.format(
            **common, mt=mt, nr=weight_rows(block, coding, mt, n, k), after_tile=after_tile,
            pf=PREFETCH_BYTES,
            codes=u8_row(u8, ROW_CODES[coding.name].format(fn=fn),
                         ROW_CODES[coding.name].format(fn=fn).replace("_codes(", "_ucodes(")),
            load=u8_row(u8, ROW_LOAD[coding.name], ROW_LOAD[coding.name] + ROW_XC.format(
                centre=block.centre)),
            dot=u8_row(u8, ROW_DOT[coding.name, g], ROW_DOT[coding.name, g].replace(
                "poot_dot_i8(c[r], xv)", "poot_dot_u8(c[r], xv, xc)")),
            offset=row_offset(block.offsets) if offsets else "",
            offset_avx=row_offset(block.offsets) if offsets and not vector_offsets else "",
            block_offset=BLOCK_OFFSET.format(sums="xs" if block.offsets == 1 else "xh",
                                             og=block.offsets) if vector_offsets else "")
    return block_functions(fmt) + source


__all__ = ["I16", "Q8", "Coding", "gemv_program", "kernel_source", "q8_formats", "weight_rows"]
