"""ArgTopK on the CPU: a C source builder driven by the eqn's shapes.

Written by hand because the shared schedule is one 256-thread workgroup per row, each
thread keeping its own top k over a strided share of the row, then k cooperative
rounds: on a CPU that is one thread walking the row 256 times over. Here one thread
takes one row and keeps its top k in a sorted array as it streams the row once.

The order is the shared schedule's and the oracle's: each float is mapped to an int32 key
that orders as the floats do (negative values have their magnitude bits flipped; both
zeros are 0; every NaN is below -inf), largest key first, and among equal keys the lower
index first (a stable sort of -x).

Taken: F32 rows, k at most MAX_K. Anything else takes the shared lowering.
"""
from __future__ import annotations

import math

from poot.codegen.lower.base import Sig
from poot.codegen.program import OUT, Access, BufferParam, KernelProgram
from poot.dtypes import DType
from poot.ir.graph import Lit
from poot.ir.ops import ArgTopK
from poot.kernel_backend import CompiledProgram

from poot_cpu.kernels import built_kernel

F32, I32 = DType.F32, DType.I32
MAX_K = 256        # the row's top k live on the thread's stack, inserted into in order

SOURCE = """\
static inline int {name}_key(float f) {{
  int b; memcpy(&b, &f, 4);
  const int mag = b & 0x7fffffff;
  if (mag > 0x7f800000) return -2147483647;     /* NaN: under -inf */
  if (mag == 0) return 0;                        /* -0 and +0 are equal */
  return b >= 0 ? b : b ^ 0x7fffffff;
}}
static void {name}(const float* restrict x, int* restrict out) {{
  enum {{ ROWS = {rows}, N = {n}, K = {k} }};
  #pragma omp for schedule(static) nowait
  for (int row = 0; row < ROWS; ++row) {{
    const float* restrict xr = x + (size_t)row * N;
    int key[K], idx[K], held = 0;
    for (int j = 0; j < N; ++j) {{
      const int kj = {name}_key(xr[j]);
      /* j is past every held index, so it goes after the held keys >= its own */
      if (held == K && kj <= key[K - 1]) continue;
      int at = held < K ? held : K - 1;
      while (at > 0 && key[at - 1] < kj) {{
        key[at] = key[at - 1];
        idx[at] = idx[at - 1];
        --at;
      }}
      key[at] = kj;
      idx[at] = j;
      if (held < K) ++held;
    }}
    for (int i = 0; i < K; ++i) out[(size_t)row * K + i] = idx[i];
  }}
}}
"""


def topk_program(op, ins, out, printer) -> CompiledProgram | None:
    if not isinstance(op, ArgTopK) or isinstance(ins[0], Lit):
        return None
    (x,) = ins
    if x.dtype is not F32 or op.k > MAX_K:
        return None
    n = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    name = Sig(op, tuple(ins), out).name + "_rows"
    bufs = (BufferParam("x", F32, Access.READ, x.size, 0),
            BufferParam("out", I32, Access.WRITE, out.size, OUT))
    kernel = built_kernel(name, SOURCE.format(name=name, rows=rows, n=n, k=op.k), bufs)
    return CompiledProgram(KernelProgram((kernel.kernel,)), (kernel,), printer.device)


__all__ = ["MAX_K", "topk_program"]
