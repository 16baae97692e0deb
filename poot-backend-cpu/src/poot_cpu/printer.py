"""C for the host CPU: the C-style printer with workgroups as loop nests.

A kernel becomes one C function that runs its workgroups as an OpenMP work-shared
loop (`#pragma omp for`, orphaned: the plan's step function opens the one parallel
region, so a step forks once). Inside a workgroup the threads become a loop; a
barrier or a cooperative reduction splits the body into segments, each its own
thread loop (loop fission at barriers): the loops run one after the other, which is
what a barrier guarantees. Barriers sit in uniform control flow (program.py's rule),
so a `For` or `If` holding one runs once per workgroup around its split body.

A scalar declared in one segment and read in a later one is promoted to a
per-thread array (`name[poot_lid]`); per-thread arrays of split kernels likewise get
one row per thread. A cooperative reduction stores each thread's value in such an
array, folds each group of `width` threads in order, and hands every thread its
group's result: on a CPU a subgroup operation is a plain loop the compiler can
vectorize.

16-bit floats: F16 is the compiler's `_Float16` (conversions round to nearest even,
by the hardware where F16C exists); BF16 is stored as 16-bit words and converted by
the shared scalar helpers (poot.codegen.scalar: nearest even, NaN kept quiet), with no
arithmetic of its own.
"""
from __future__ import annotations

from poot.codegen.cstyle import CPrinter
from poot.codegen.expr import Load, Var, walk
from poot.codegen.program import (
    Assign,
    Barrier,
    CoopReduce,
    For,
    If,
    Kernel,
    Let,
    LocalArray,
    Stmt,
    Store,
)
from poot.dtypes import DType
from poot.ir.ops import ReduceOp

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32

HEADER = """\
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
static inline float poot_u2f(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int poot_f2u_bits(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline int poot_overlap(const void* a, size_t na, const void* b, size_t nb) {
  const uintptr_t p = (uintptr_t)a, q = (uintptr_t)b; return p < q + nb && q < p + na; }
"""

#: SIMD helpers of the source builders (poot_cpu.gemv): a translation unit includes them
#: only when one of its functions uses them (immintrin.h alone costs gcc ~0.4 s)
SIMD_HEADER = """\
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define POOT_AVX2 1
/* the prefill panel's vectors (poot_cpu.gemv): POOT_VL weight rows per vector of int32
   sums (16 with AVX-512, else 8), POOT_PANEL_MR activation rows per pass (as many as the
   registers hold: two vectors each), poot_vi_dot16(acc, a, b): acc + the pairwise int16
   products of a and b, summed per 32-bit lane (exact, no saturation; one instruction with
   VNNI, whose latency wants more independent sums); poot_vi_dot8(acc, u, x): acc + the
   products of bytes u ^ 0x80 (signed codes) and x (signed), per lane, plus POOT_DOT8_BIAS
   x the sum of x's bytes (VNNI's dpbusd multiplies u as unsigned: the caller takes that
   sum off again) */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define POOT_VL 16
typedef __m512i poot_vi;
typedef __m512 poot_vf;
#define poot_vi_load(p) _mm512_load_si512((const void*)(p))
#define poot_vi_set1 _mm512_set1_epi32
#define poot_vi_zero _mm512_setzero_si512
#define poot_vf_zero _mm512_setzero_ps
#define poot_vf_load _mm512_load_ps
#define poot_vf_store _mm512_store_ps
#define poot_vf_set1 _mm512_set1_ps
#define poot_vf_add _mm512_add_ps
#define poot_vf_mul _mm512_mul_ps
#define poot_vf_fmadd _mm512_fmadd_ps
#define poot_vf_cvt _mm512_cvtepi32_ps
#define poot_vi_sub _mm512_sub_epi32
#if defined(__AVX512VNNI__)
#define poot_vi_dot16 _mm512_dpwssd_epi32
#define poot_vi_dot8 _mm512_dpbusd_epi32
#define POOT_DOT8_BIAS 128
#else
#define poot_vi_dot16(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
static inline __m512i poot_vi_dot8(__m512i acc, __m512i u, __m512i x) {
  const __m512i c = _mm512_xor_si512(u, _mm512_set1_epi8(-128));
  const __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(c), _mm512_setzero_si512(), x);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(c), sx),
                                                 _mm512_set1_epi16(1)));
}
#define POOT_DOT8_BIAS 0
#endif
#define POOT_PANEL_MR 8
#define POOT_PANEL_UNROLL 4
#else
#define POOT_VL 8
typedef __m256i poot_vi;
typedef __m256 poot_vf;
#define poot_vi_load(p) _mm256_load_si256((const __m256i*)(p))
#define poot_vi_set1 _mm256_set1_epi32
#define poot_vi_zero _mm256_setzero_si256
#define poot_vf_zero _mm256_setzero_ps
#define poot_vf_load _mm256_load_ps
#define poot_vf_store _mm256_store_ps
#define poot_vf_set1 _mm256_set1_ps
#define poot_vf_add _mm256_add_ps
#define poot_vf_mul _mm256_mul_ps
#define poot_vf_fmadd _mm256_fmadd_ps
#define poot_vf_cvt _mm256_cvtepi32_ps
#define poot_vi_sub _mm256_sub_epi32
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define poot_vi_dot16 _mm256_dpwssd_epi32
#define poot_vi_dot8 _mm256_dpbusd_epi32
#else
#define poot_vi_dot16 _mm256_dpwssd_avx_epi32
#define poot_vi_dot8 _mm256_dpbusd_avx_epi32
#endif
#define POOT_DOT8_BIAS 128
#define POOT_PANEL_MR 8
#define POOT_PANEL_UNROLL 4
#else
#define poot_vi_dot16(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#define poot_vi_dot8(acc, u, x) _mm256_add_epi32(acc, poot_dot_i8(_mm256_xor_si256( \
    u, _mm256_set1_epi8(-128)), x))
#define POOT_DOT8_BIAS 0
/* AVX2 alone: formats whose codes are an unsigned field u less a centre multiply u itself
   (maddubs' unsigned operand, no sign juggling) and take the centre's share off as an
   integer (poot_cpu.gemv): the same integer sums */
#define POOT_U8DOT 1
#define POOT_PANEL_MR_U8 8   /* their panel's activation rows per pass (fewer registers) */
#ifndef POOT_PANEL_MR
#define POOT_PANEL_MR 4
#define POOT_PANEL_UNROLL 2
#endif
#endif
#endif
/* poot_dot_i8(c, x): per 32-bit lane, the sum of the four products of signed bytes of c
   and x (exact: |c| <= 128 and |x| <= 127 keep maddubs' 16-bit pair sums from saturating) */
static inline __m256i poot_dot_i8(__m256i c, __m256i x) {
  const __m256i a = _mm256_abs_epi8(c), sx = _mm256_sign_epi8(x, c);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, sx);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, sx);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, sx), _mm256_set1_epi16(1));
#endif
}
#if POOT_U8DOT
/* poot_dot_u8(u, x, xc): poot_dot_i8(u - centre, x) for u < 64, given xc = the pairwise
   sums of centre x x (maddubs(centre, x)): every 16-bit pair sum stays exact */
static inline __m256i poot_dot_u8(__m256i u, __m256i x, __m256i xc) {
  return _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(u, x), xc),
                           _mm256_set1_epi16(1));
}
#endif
/* out[j * stride] = lane j of in[0..7] (an 8 x 8 transpose of 32-bit lanes) */
static inline void poot_transpose8x32(const __m256i* in, __m256i* out, int stride) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(in[i], in[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(in[i], in[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_store_si256(out + i * stride, _mm256_permute2x128_si256(u[i], u[i + 4], 0x20));
    _mm256_store_si256(out + (i + 4) * stride,
                       _mm256_permute2x128_si256(u[i], u[i + 4], 0x31));
  }
}
static inline float poot_hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
/* AMX (the prefill panel of q8 rows, poot_cpu.gemv): the tiles' byte products need the
   process's permission, asked of Linux once (refused, e.g. where a signal stack is too small
   for the tile state, the kernels take their VNNI loops); each thread loads the tile shapes
   for a call and releases them after it */
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512VNNI__) && \
    defined(__AVX512BW__) && defined(__linux__)
#define POOT_AMX 1
#include <unistd.h>
#include <sys/syscall.h>
static int poot_amx_state;          /* 0: not asked yet, 1: granted, -1: refused */
static inline int poot_amx_ready(void) {
  int s = __atomic_load_n(&poot_amx_state, __ATOMIC_RELAXED);
  if (s == 0) {
    s = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0
        ? 1 : -1;
    __atomic_store_n(&poot_amx_state, s, __ATOMIC_RELAXED);
  }
  return s > 0;
}
/* tiles 0-3: 16 x 16 int32 sums of four blocks in flight; tiles 4, 5: 16 weight rows x 32
   codes; tiles 6, 7: a block's 32 activations of 16 rows, four bytes of a row per 32-bit
   column (8 x 64 bytes) */
static inline void poot_amx_config(void) {
  struct { unsigned char palette, start, pad[14]; unsigned short colsb[16];
           unsigned char rows[16]; } c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 4; ++t) { c.colsb[t] = 64; c.rows[t] = 16; }
  for (int t = 4; t < 6; ++t) { c.colsb[t] = 32; c.rows[t] = 16; }
  for (int t = 6; t < 8; ++t) { c.colsb[t] = 64; c.rows[t] = 8; }
  _tile_loadconfig(&c);
}
/* the sums of block j (< nb) of four into tile j: tiles are named by immediates */
#define POOT_AMX_PRODUCTS(wa, xt, nb) do { \
    _tile_zero(0); _tile_loadd(4, (wa)[0], 32); _tile_loadd(6, (xt), 64); \
    _tile_dpbusd(0, 4, 6); \
    if ((nb) > 1) { _tile_zero(1); _tile_loadd(5, (wa)[1], 32); \
                    _tile_loadd(7, (xt) + 512, 64); _tile_dpbusd(1, 5, 7); } \
    if ((nb) > 2) { _tile_zero(2); _tile_loadd(4, (wa)[2], 32); \
                    _tile_loadd(6, (xt) + 1024, 64); _tile_dpbusd(2, 4, 6); } \
    if ((nb) > 3) { _tile_zero(3); _tile_loadd(5, (wa)[3], 32); \
                    _tile_loadd(7, (xt) + 1536, 64); _tile_dpbusd(3, 5, 7); } \
  } while (0)
#define POOT_AMX_STORE(cb, nb) do { \
    _tile_stored(0, (cb)[0], 64); \
    if ((nb) > 1) _tile_stored(1, (cb)[1], 64); \
    if ((nb) > 2) _tile_stored(2, (cb)[2], 64); \
    if ((nb) > 3) _tile_stored(3, (cb)[3], 64); \
  } while (0)
#endif
#endif
#ifndef POOT_VL
#define POOT_VL 8
#define POOT_PANEL_MR 4
#endif
#ifndef POOT_PANEL_MR_U8
#define POOT_PANEL_MR_U8 POOT_PANEL_MR
#endif
#define POOT_DO_PRAGMA(x) _Pragma(#x)
#define POOT_UNROLL(n) POOT_DO_PRAGMA(GCC unroll n)
/* an f16 at p as f32 (exact). gcc's plain conversion, where AVX512-FP16 exists, is a
   vcvtsh2ss that merges into its destination register: a dependency on the previous
   block's scale in every kernel loop. Merged into zeros instead (one instruction fewer than
   F16C's vcvtph2ps, which needs the value in a vector register first) */
static inline float poot_h2f(const unsigned char* p) {
#if defined(POOT_AVX2) && defined(__AVX512FP16__)
  _Float16 h; memcpy(&h, p, 2);
  return _mm_cvtss_f32(_mm_cvtsh_ss(_mm_setzero_ps(), _mm_set_sh(h)));
#elif defined(POOT_AVX2)
  unsigned short u; memcpy(&u, p, 2); return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u)));
#else
  _Float16 h; memcpy(&h, p, 2); return (float)h;
#endif
}
"""

LID = "poot_lid"      # the thread loop's counter: local_index of the current thread


def _has_sync(body) -> bool:
    for s in body:
        if isinstance(s, (Barrier, CoopReduce)):
            return True
        if isinstance(s, For) and _has_sync(s.body):
            return True
        if isinstance(s, If) and (_has_sync(s.then) or _has_sync(s.orelse)):
            return True
    return False


def _names_used(stmts) -> set[str]:
    """Every variable and array name the statements read or assign."""
    out: set[str] = set()

    def exprs(s):
        if isinstance(s, (Let, Assign, CoopReduce)):
            yield s.value
        elif isinstance(s, Store):
            yield from (s.index, s.value)
        elif isinstance(s, For):
            yield from (s.start, s.stop, s.step)
        elif isinstance(s, If):
            yield s.cond

    def visit(body):
        for s in body:
            if isinstance(s, Assign):
                out.add(s.name)
            for e in exprs(s):
                for n in walk(e):
                    if isinstance(n, Var):
                        out.add(n.name)
                    elif isinstance(n, Load):
                        out.add(n.buffer)
            if isinstance(s, For):
                visit(s.body)
            elif isinstance(s, If):
                visit(s.then)
                visit(s.orelse)
    visit(stmts)
    return out


def _units(body) -> list[tuple[str, list[Stmt]]]:
    """A split block's units in order: ("seg", statements without sync) or ("sync", [s])."""
    units, seg = [], []
    for s in body:
        sync = isinstance(s, (Barrier, CoopReduce)) or \
            (isinstance(s, For) and _has_sync(s.body)) or \
            (isinstance(s, If) and (_has_sync(s.then) or _has_sync(s.orelse)))
        if sync:
            if seg:
                units.append(("seg", seg))
                seg = []
            units.append(("sync", [s]))
        else:
            seg.append(s)
    if seg:
        units.append(("seg", seg))
    return units


def promoted_names(body) -> dict[str, DType]:
    """Scalars of split blocks read outside the segment that declares them, and every
    cooperative reduction's result: they become per-thread arrays."""
    out: dict[str, DType] = {}
    units = _units(body)
    for i, (kind, stmts) in enumerate(units):
        later = _names_used([s for _, ss in units[i + 1:] for s in ss])
        for s in stmts:
            if isinstance(s, CoopReduce):
                out[s.name] = s.value.dtype
            elif isinstance(s, Let) and s.name in later:
                out[s.name] = s.value.dtype
        for s in stmts:
            if kind == "sync" and isinstance(s, For):
                out.update(promoted_names(s.body))
            elif kind == "sync" and isinstance(s, If):
                out.update(promoted_names(s.then))
                out.update(promoted_names(s.orelse))
    return out


class HostCPrinter(CPrinter):
    backend = "cpu"
    qualifier = "static inline"
    holds_bf16_bits = True
    f16_type, bf16_type = "_Float16", "unsigned short"

    def __init__(self, device: str = "cpu:0"):
        self.device = device
        self.supported = frozenset({F32, I32, U32, DType.I16, DType.U16, DType.I8, DType.U8,
                                    F16, BF16})
        self._split, self._promoted = False, {}     # no kernel yet: the helpers print first

    # -- language hooks --------------------------------------------------------------------
    def bitcast(self, src: DType, dst: DType, text: str) -> str:
        if dst is F32 and src in (I32, U32):
            return f"poot_u2f((unsigned int)({text}))"
        if src is F32 and dst in (I32, U32):
            return f"(({self.type_name(dst)})poot_f2u_bits({text}))"
        if {src, dst} == {I32, U32}:
            return f"(({self.type_name(dst)})({text}))"
        raise self.refuse(src, f"bitcast to {dst}")

    def clz(self, text: str) -> str:
        return f"({text} == 0 ? 32 : __builtin_clz((unsigned int)({text})))"

    def loop_pragma(self, s: For, pad: str) -> list[str]:
        return [p.replace("#pragma unroll", "#pragma GCC unroll 16")
                for p in super().loop_pragma(s, pad)]

    def builtin(self, kind: str, axis: int, kernel: Kernel) -> str:
        wx, wy, wz = kernel.workgroup3()
        local = (f"({LID} % {wx})", f"(({LID} / {wx}) % {wy})", f"({LID} / {wx * wy})")[axis]
        if kind == "index":
            return LID
        if kind == "local":
            return local
        group = ("poot_gx", "poot_gy", "poot_gz")[axis]
        if kind == "group":
            return group
        return f"({group} * {kernel.workgroup3()[axis]} + {local})"

    def function_name(self, kernel: Kernel) -> str:
        return kernel.name

    def signature(self, kernel: Kernel) -> str:
        params = []
        for b in kernel.buffers:
            const = "const " if not b.access.writable else ""
            params.append(f"{const}{self.type_name(b.dtype)}* restrict {b.name}")
        return f"static void {self.function_name(kernel)}({', '.join(params)})"

    # -- the function ------------------------------------------------------------------------
    def unit(self, kernel: Kernel) -> str:
        """The kernel as one C function (no includes or helpers: see `prelude`)."""
        self._split = _has_sync(kernel.body)
        self._promoted = promoted_names(kernel.body) if self._split else {}
        tpg = kernel.threads_per_group
        gx, gy, gz = kernel.grid3()
        u = self.indent_unit
        lines = [self.signature(kernel) + " {",
                 f"{u}#pragma omp for schedule(static) nowait",
                 f"{u}for (int poot_g = 0; poot_g < {gx * gy * gz}; ++poot_g) {{",
                 f"{u * 2}const int poot_gx = poot_g % {gx}, poot_gy = (poot_g / {gx}) % {gy},"
                 f" poot_gz = poot_g / {gx * gy};",
                 f"{u * 2}(void)poot_gx; (void)poot_gy; (void)poot_gz;"]
        for a in kernel.shared:
            lines.append(f"{u * 2}{self.type_name(a.dtype)} {a.name}[{a.count}] "
                         "__attribute__((aligned(64)));")
        if self._split:
            for a in kernel.locals:
                lines.append(f"{u * 2}{self.type_name(a.dtype)} {a.name}[{tpg * a.count}];")
            for name, dtype in self._promoted.items():
                lines.append(f"{u * 2}{self.type_name(dtype)} {name}[{tpg}];")
            lines.append(f"{u * 2}const int {LID} = 0; (void){LID};")
            lines += self.split_block(kernel.body, 2)
        else:
            lines += self.thread_loop(kernel.body, 2, declare_locals=True)
        lines += [f"{u}}}", "}"]
        return "\n".join(lines) + "\n"

    def element_source(self, kernel: Kernel, name: str) -> str:
        """A one-dimensional kernel without barriers as `static inline void name(int poot_e,
        buffers...)`: the body of its thread `poot_e` (workgroup poot_e / threads per group,
        thread poot_e % threads per group), for a source builder that applies it to the
        elements a thread has just computed (poot_cpu.gemv's fused epilogues)."""
        kernel.validate()
        kernel = self.rewrite(kernel)
        self.check_dtypes(kernel)
        self._kernel = kernel            # the refusal below names it
        gx, gy, gz = kernel.grid3()
        if (gy, gz) != (1, 1) or _has_sync(kernel.body) or kernel.shared:
            raise self.unsupported(f"element function of {kernel.name} (a 1-D grid without "
                                   f"barriers or shared arrays)")
        self._kernel, self._before, self._split, self._promoted = kernel, [], False, {}
        tpg, u = kernel.threads_per_group, self.indent_unit
        params = ", ".join(f"{'const ' if not b.access.writable else ''}"
                           f"{self.type_name(b.dtype)}* restrict {b.name}"
                           for b in kernel.buffers)
        lines = [f"static inline void {name}(const int poot_e, {params}) {{",
                 f"{u}const int poot_gx = poot_e / {tpg}, poot_gy = 0, poot_gz = 0, "
                 f"{LID} = poot_e % {tpg};",
                 f"{u}(void)poot_gx; (void)poot_gy; (void)poot_gz; (void){LID};"]
        for a in kernel.locals:
            lines.append(f"{u}{self.type_name(a.dtype)} {a.name}[{a.count}];")
        return "\n".join([*lines, *self.block(kernel.body, 1), "}"]) + "\n"

    def prelude(self, simd: bool = False) -> str:
        """Includes and helpers of a translation unit; `simd`: with SIMD_HEADER."""
        return HEADER + self.scalar_helpers() + (SIMD_HEADER if simd else "")

    def thread_loop(self, body, depth: int, declare_locals: bool = False) -> list[str]:
        pad = self.pad(depth)
        tpg = self.kernel.threads_per_group
        out = [f"{pad}for (int {LID} = 0; {LID} < {tpg}; ++{LID}) {{"]
        if declare_locals:
            for a in self.kernel.locals:
                out.append(f"{pad}{self.indent_unit}{self.type_name(a.dtype)} {a.name}"
                           f"[{a.count}];")
        return out + self.block(body, depth + 1) + [pad + "}"]

    def split_block(self, body, depth: int) -> list[str]:
        pad = self.indent_unit * depth
        out = []
        for kind, stmts in _units(body):
            if kind == "seg":
                out += self.thread_loop(stmts, depth)
                continue
            s = stmts[0]
            if isinstance(s, Barrier):
                continue                      # the thread loops run one after the other
            if isinstance(s, CoopReduce):
                out += self.reduce(s, depth)
            elif isinstance(s, For):
                out += [*self.loop_pragma(s, pad),
                        f"{pad}for (int {s.var} = {self.expr(s.start)}; {s.var} < "
                        f"{self.expr(s.stop)}; {s.var} += {self.expr(s.step)}) {{",
                        *self.split_block(s.body, depth + 1), pad + "}"]
            else:
                out += [f"{pad}if ({self.expr(s.cond)} != 0) {{",
                        *self.split_block(s.then, depth + 1)]
                if s.orelse:
                    out += [pad + "} else {", *self.split_block(s.orelse, depth + 1)]
                out.append(pad + "}")
        return out

    def reduce(self, s: CoopReduce, depth: int) -> list[str]:
        pad, u = self.indent_unit * depth, self.indent_unit
        tpg = self.kernel.threads_per_group
        width = s.width or tpg
        t = self.type_name(s.value.dtype)
        arr, r, acc = s.name, f"poot_r_{s.name}", f"poot_a_{s.name}"
        if s.op is ReduceOp.Sum:
            fold = f"{acc} + {arr}[{r} + o]" if s.value.dtype is F32 else \
                f"poot_iadd({acc}, {arr}[{r} + o])"
        else:
            fold = f"poot_fmax({acc}, {arr}[{r} + o])" if s.value.dtype is F32 else \
                f"poot_imax({acc}, {arr}[{r} + o])"
        return [f"{pad}for (int {LID} = 0; {LID} < {tpg}; ++{LID}) "
                f"{arr}[{LID}] = {self.expr(s.value)};",
                f"{pad}for (int {r} = 0; {r} < {tpg}; {r} += {width}) {{",
                f"{pad}{u}{t} {acc} = {arr}[{r}];",
                f"{pad}{u}for (int o = 1; o < {width}; ++o) {acc} = {fold};",
                f"{pad}{u}for (int o = 0; o < {width}; ++o) {arr}[{r} + o] = {acc};",
                f"{pad}}}"]

    # -- promoted scalars and per-thread arrays -------------------------------------------
    def let(self, s: Let, depth: int) -> list[str]:
        if s.name in self._promoted:
            return [f"{self.pad(depth)}{s.name}[{LID}] = {self.expr(s.value)};"]
        return super().let(s, depth)

    def assign(self, s: Assign, depth: int) -> list[str]:
        if s.name in self._promoted:
            return [f"{self.pad(depth)}{s.name}[{LID}] = {self.expr(s.value)};"]
        return super().assign(s, depth)

    def store(self, s: Store, depth: int) -> list[str]:
        if self._split and self._is_local(s.array):
            return [f"{self.pad(depth)}{self._local(s.array, s.index)} = {self.expr(s.value)};"]
        return super().store(s, depth)

    def coop_reduce(self, s: CoopReduce, depth: int) -> list[str]:
        return self.reduce(s, depth)    # reached only through split_block

    def _is_local(self, name: str) -> bool:
        return isinstance(self.kernel.arrays().get(name), LocalArray)

    def _local(self, name: str, index) -> str:
        count = self.kernel.arrays()[name].count
        return f"{name}[{LID} * {count} + {self.expr(index)}]"

    def var(self, e: Var) -> str:
        if e.name in self._promoted:
            return f"{e.name}[{LID}]"
        return super().var(e)

    def load(self, e: Load) -> str:
        if self._split and self._is_local(e.buffer):
            return self._local(e.buffer, e.index)
        return super().load(e)


__all__ = ["HEADER", "SIMD_HEADER", "HostCPrinter", "promoted_names"]
