"""Casts between F32 and F16 on the CPU: a C source builder for whole tensors.

Written by hand because the shared lowering converts one element per thread of a
256-thread workgroup and recomputes its coordinates with integer divisions: on a CPU
that is a scalar loop several times slower than the conversion itself. An f16 KV cache
(the fast precision) is widened every step, so this is on the decode path. Here each
thread converts contiguous chunks eight values at a time with F16C (`vcvtph2ps`,
`vcvtps2ph` rounding to nearest even, as the IR's F16 rule and `_Float16` do); the
rest, and hosts without AVX2, use the compiler's `_Float16` conversions.

Taken: Cast F16 -> F32 and F32 -> F16 of one shape. Anything else takes the shared
lowering.
"""
from __future__ import annotations

from poot.codegen.lower.base import Sig
from poot.codegen.program import OUT, Access, BufferParam, KernelProgram
from poot.dtypes import DType
from poot.ir.graph import Lit
from poot.ir.ops import Cast
from poot.kernel_backend import CompiledProgram

from poot_cpu.kernels import built_kernel

F32, F16 = DType.F32, DType.F16
CHUNK = 4096       # elements a thread converts at a time

WIDEN = "_mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(in0 + i))))"
NARROW = ("_mm_storeu_si128((__m128i*)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in0 + i), "
          "_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))")

SOURCE = """\
static void {name}(const {src}* restrict in0, {dst}* restrict out) {{
  enum {{ N = {n}, CH = {chunk} }};
  #pragma omp for schedule(static) nowait
  for (int c = 0; c < (N + CH - 1) / CH; ++c) {{
    const int hi = (c + 1) * CH < N ? (c + 1) * CH : N;
    int i = c * CH;
#ifdef POOT_AVX2
    for (; i + 8 <= hi; i += 8) {vector};
#endif
    for (; i < hi; ++i) out[i] = ({dst})in0[i];
  }}
}}
"""


def cast_program(op, ins, out, printer) -> CompiledProgram | None:
    if not isinstance(op, Cast) or isinstance(ins[0], Lit):
        return None
    (x,) = ins
    if {x.dtype, out.dtype} != {F16, F32} or x.dtype is out.dtype or x.shape != out.shape:
        return None
    name = Sig(op, tuple(ins), out).name + "_f16c"
    widen = x.dtype is F16
    src = SOURCE.format(name=name, n=out.size, chunk=CHUNK, vector=WIDEN if widen else NARROW,
                        src=printer.type_name(x.dtype), dst=printer.type_name(out.dtype))
    bufs = (BufferParam("in0", x.dtype, Access.READ, x.size, 0),
            BufferParam("out", out.dtype, Access.WRITE, out.size, OUT))
    kernel = built_kernel(name, src, bufs)
    return CompiledProgram(KernelProgram((kernel.kernel,)), (kernel,), printer.device)


__all__ = ["cast_program"]
