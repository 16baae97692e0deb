"""Concat on the CPU: a C source builder that copies contiguous runs.

Written by hand because the shared lowering moves one element per thread and recomputes
its coordinates with integer divisions; on a CPU a concatenation is a few memcpy calls.
A sliding-window layer concatenates its whole KV ring with the step's rows every decode
step, so this is on the decode path. For each index of the axes before `axis`, operand j
contributes one contiguous run (its extent on `axis` times the elements after it); the
runs are cut into chunks of CHUNK bytes, which the threads share out.

Taken: every operand a tensor (no literal). Anything else takes the shared lowering.
"""
from __future__ import annotations

import math

from poot.codegen.lower.base import Sig
from poot.codegen.program import OUT, Access, BufferParam, KernelProgram
from poot.ir.graph import Lit
from poot.ir.ops import Concat
from poot.kernel_backend import CompiledProgram

from poot_cpu.kernels import built_kernel

CHUNK = 1 << 14    # bytes a thread copies at a time

SOURCE = """\
static void {name}({params}, {t}* restrict out) {{
  enum {{ J = {j}, PER = {per}, OUTER = {outer}, CH = {chunk} }};
  const unsigned char* src[J] = {{{srcs}}};
  static const long len[J] = {{{lens}}};      /* bytes of each operand's run */
  static const long at[J] = {{{ats}}};        /* where its run starts in an output row */
  static const int first[J + 1] = {{{firsts}}};   /* its first chunk in an outer index */
  #pragma omp for schedule(static) nowait
  for (int c = 0; c < OUTER * PER; ++c) {{
    const int o = c / PER, r = c % PER;
    int j = 0;
    while (first[j + 1] <= r) ++j;
    const long k = (long)(r - first[j]) * CH, n = len[j] - k < CH ? len[j] - k : CH;
    memmove((unsigned char*)out + (long)o * {row} + at[j] + k, src[j] + (long)o * len[j] + k,
            (size_t)n);
  }}
}}
"""


def concat_program(op, ins, out, printer) -> CompiledProgram | None:
    if not isinstance(op, Concat) or any(isinstance(x, Lit) or x.size == 0 for x in ins):
        return None
    axis = op.axis % out.rank
    outer = math.prod(out.shape[:axis])
    inner = math.prod(out.shape[axis + 1:]) * out.dtype.itemsize
    lens = [x.shape[axis] * inner for x in ins]
    ats = [sum(lens[:j]) for j in range(len(ins))]
    chunks = [max(1, -(-n // CHUNK)) if n else 0 for n in lens]
    firsts = [sum(chunks[:j]) for j in range(len(ins) + 1)]
    if outer == 0 or firsts[-1] == 0:
        return None
    t = printer.type_name(out.dtype)
    name = Sig(op, tuple(ins), out).name + "_runs"
    src = SOURCE.format(
        name=name, t=t, j=len(ins), per=firsts[-1], outer=outer, chunk=CHUNK, row=sum(lens),
        params=", ".join(f"const {t}* restrict in{j}" for j in range(len(ins))),
        srcs=", ".join(f"(const unsigned char*)in{j}" for j in range(len(ins))),
        lens=", ".join(map(str, lens)), ats=", ".join(map(str, ats)),
        firsts=", ".join(map(str, firsts)))
    bufs = tuple(BufferParam(f"in{j}", x.dtype, Access.READ, x.size, j)
                 for j, x in enumerate(ins)) + (
        BufferParam("out", out.dtype, Access.WRITE, out.size, OUT),)
    kernel = built_kernel(name, src, bufs)
    return CompiledProgram(KernelProgram((kernel.kernel,)), (kernel,), printer.device)


__all__ = ["CHUNK", "concat_program"]
