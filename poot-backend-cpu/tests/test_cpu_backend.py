"""The cpu backend's own source builders come through KernelBackend's `program_for` hook,
into the shared lowering cache like every other program."""
from __future__ import annotations

import poot
from poot import ops
from poot.plan import plan


def test_its_own_programs_are_shared_by_eqns_of_one_signature(cpu_backend):
    g = poot.trace(lambda a, b: ops.add(ops.argtopk(ops.exp(a), 3), ops.argtopk(ops.exp(b), 3)),
                   poot.spec((2, 64), name="a"), poot.spec((2, 64), name="b"))
    device = cpu_backend.probe()[0]
    cpu_backend.forget_lowerings()
    steps = plan(g, (cpu_backend, device)).steps
    topk = [s for s in steps if s.eqn.op.name == "ArgTopK"]
    exp = [s for s in steps if s.eqn.op.name == "Unary"]
    assert len(topk) == len(exp) == 2
    # ArgTopK: the cpu's row kernel (program_for); exp: the shared lowering; each built once
    assert all(k.name.endswith("_rows") for k in topk[0].lowering.program.kernels)
    assert not any(k.name.endswith("_rows") for k in exp[0].lowering.program.kernels)
    assert topk[0].lowering is topk[1].lowering and exp[0].lowering is exp[1].lowering

