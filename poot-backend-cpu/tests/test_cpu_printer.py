"""The host C printer: workgroups as loop nests, split at barriers and reductions."""
from __future__ import annotations

from poot.codegen.expr import Load
from poot.codegen.program import Access, Barrier, CoopReduce, Let, Store, local_index
from poot.dtypes import DType
from poot.ir.ops import ReduceOp
from poot_cpu.printer import HostCPrinter, promoted_names

F32, I32 = DType.F32, DType.I32


def test_scalars_read_across_a_barrier_become_per_thread_arrays():
    from poot.codegen.expr import Var
    from poot.codegen.program import BufferParam, Kernel, SharedArray

    body = (Let("v", Load("x", local_index(), F32)),
            Store("s", local_index(), Var("v", F32)),
            Barrier(),
            CoopReduce("r", ReduceOp.Sum, Var("v", F32), 4),
            Store("y", local_index(), Var("r", F32)))
    buffers = (BufferParam("x", F32, Access.READ, 8, 0),
               BufferParam("y", F32, Access.WRITE, 8, -1))
    k = Kernel("k", buffers, (1,), (8,), body, shared=(SharedArray("s", F32, 8),))
    assert promoted_names(k.body) == {"v": F32, "r": F32}
    src = HostCPrinter().source(k)
    assert "float v[8];" in src and "float r[8];" in src
    assert src.count("for (int poot_lid = 0;") == 3   # two segments and the reduction's
    assert "#pragma omp for" in src

