"""The backend seam: probe, entry point, capability refusals, plan-time lowering."""
from __future__ import annotations

import pytest
from poot.dtypes import DType
from poot.errors import DeviceUnavailable, DtypeLowering, UnsupportedOp
from poot.ir import Builder
from poot.ir.ops import Binary, BinaryOp, Reduce, ReduceOp, Unary, UnaryOp
from poot.ir.types import TensorType
from poot.plugin import backends
from poot_cuda.backend import CudaBackend
from poot_cuda.probe import probe

F32, U32 = DType.F32, DType.U32


def test_probe_never_raises_and_explains():
    devices, reason = probe()
    assert bool(devices) != bool(reason)
    if not devices:
        assert reason.startswith("no CUDA device")


def test_registered_through_the_entry_point():
    b = backends()["cuda"]
    assert isinstance(b, CudaBackend)
    assert (b.unavailable_reason() is None) == bool(b.probe())


def test_capability_table_refuses_what_it_does_not_declare():
    b = CudaBackend()
    table = b.capabilities(b.compile_only_device("sm_90"))
    t = TensorType((4, 4), U32)
    with pytest.raises(DtypeLowering):
        table.check(Reduce(ReduceOp.Max, -1), [t], TensorType((4,), U32))
    with pytest.raises(DtypeLowering):
        table.check(Unary(UnaryOp.Exp), [t], t)
    old = b.capabilities(b.compile_only_device("sm_75"))
    bf = TensorType((4,), DType.BF16)
    with pytest.raises(DtypeLowering):
        old.check(Binary(BinaryOp.Add), [bf, bf], bf)


def test_plan_time_lowering_compiles_without_a_gpu():
    b = CudaBackend()
    dev = b.compile_only_device("sm_90")
    bld = Builder("t")
    x = bld.param(TensorType((3, 70), F32), "x")
    y = bld.eqn(Unary(UnaryOp.Tanh), x)
    s = bld.eqn(Reduce(ReduceOp.Sum, -1), y)
    bld.result(s)
    g = bld.finish()
    for e in g.eqns():
        choice = b.lower(e, g, dev)
        assert choice.dispatches == 1 and choice.program.kernels[0].binary[:4] == b"\x7fELF"
    with pytest.raises(DeviceUnavailable):
        b.runtime(dev)


def test_unlowered_composite_is_refused_by_name():
    from poot.ir.ops import AllReduce

    b = CudaBackend()
    table = b.capabilities(b.compile_only_device())
    t = TensorType((4,), F32)
    with pytest.raises(UnsupportedOp) as e:
        table.check(AllReduce(2), [t], t)
    assert "AllReduce" in str(e.value)


def test_op_families_come_from_the_sub_ops_traits():
    """Every Binary and Unary sub-op is declared by its trait, with no hand list to extend:
    arithmetic on every float and word dtype, bitwise on I32/U32."""
    from poot_cuda.capability import table

    t = table("cuda:0", 9, 0, ())
    for b in BinaryOp:
        want = {DType.I32, DType.U32} if b.bitwise else {DType.F32, DType.BF16, DType.I8}
        assert want <= t.lowers(f"Binary.{b.name}"), b
    assert all(t.lowers(k) for k in UnaryOp.keys())
