"""Capability tables: typed refusals naming op, dtype, backend and device, at plan time."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poot.capability import CapabilityTable, Use, every_op_key, op_keys
from poot.contract import Backend, Device
from poot.dtypes import DType
from poot.errors import DtypeLowering, LimitExceeded, LoweringError, PootError, UnsupportedOp
from poot.formats import PackedWeight
from poot.ir import Builder, region
from poot.ir import ops as O
from poot.ir.types import TensorType

F32, F16, BF16, I32 = DType.F32, DType.F16, DType.BF16, DType.I32
ADD, MUL, EXP = O.Binary(O.BinaryOp.Add), O.Binary(O.BinaryOp.Mul), O.Unary(O.UnaryOp.Exp)


def spirv_table(device="spirv:0") -> CapabilityTable:
    """A SPIR-V-style declaration: 16-bit floats can be stored and computed, but OpSelect
    on them is refused (the spec's rule)."""
    floats = {F32: Use.all(), F16: Use.all(), BF16: Use.STORAGE | Use.CONVERT,
              I32: Use.all(), DType.U32: Use.STORAGE | Use.ARITH}
    ops = {k: [F32, F16, I32] for k in op_keys("Unary", "Binary", "Reduce", "Cast")}
    ops["Select"] = [F32, I32]
    ops["MatMul"] = [F32, F16]
    ops["Fused"] = [F32, F16]
    ops["ContractionEpilogue"] = [F32]
    ops["PackedContraction"] = ["dense:f16words"]
    return CapabilityTable.declare("spirv", device, floats, ops,
                                   notes={"Select:f16": "OpSelect has no 16-bit float form",
                                          "Select:bf16": "no bf16 in SPIR-V"})


class SpirvBackend(Backend):
    name = "spirv"
    language = "spirv"

    def __init__(self):
        self.runtimes = 0

    def probe(self):
        return [Device("spirv", 0, "test device")]

    def capabilities(self, device):
        return spirv_table(device.id)

    def runtime(self, device):  # pragma: no cover - a refusal must come before any runtime
        self.runtimes += 1
        raise AssertionError("a refused graph reached the runtime")


def select_graph(dtype: DType):
    b = Builder("select")
    c = b.const(TensorType((4,), I32), "c")
    t, f = b.const(TensorType((4,), dtype), "t"), b.const(TensorType((4,), dtype), "f")
    b.result(b.eqn(O.Select(), c, t, f))
    return b.finish()


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_spirv_select_on_16_bit_floats_is_refused_at_plan_time(dtype):
    from poot.plan import plan

    backend = SpirvBackend()
    with pytest.raises(DtypeLowering) as ei:
        plan(select_graph(dtype), (backend, backend.probe()[0]))
    err = ei.value
    assert (err.op, err.dtype, err.backend, err.device) == ("Select", str(dtype), "spirv",
                                                            "spirv:0")
    assert "Select" in str(err) and str(dtype) in str(err) and "spirv:0" in str(err)
    assert backend.runtimes == 0


def test_spirv_select_on_f32_is_allowed():
    t = spirv_table()
    assert t.allows(O.Select(), [TensorType((4,), I32)] + [TensorType((4,), F32)] * 2,
                    TensorType((4,), F32))


def test_unknown_op_key_and_family_are_refused_when_declaring():
    with pytest.raises(PootError, match="unknown op keys"):
        CapabilityTable.declare("x", "x:0", {F32: Use.all()}, {"Binary.Addd": [F32]})
    with pytest.raises(PootError, match="unknown op family"):
        op_keys("Nope")


def test_every_op_key_covers_sub_ops():
    keys = every_op_key()
    assert "Binary.Add" in keys and "Unary.Clz" in keys and "Reduce.Max" in keys
    assert "Fused" in keys and "PackedContraction" in keys and "Binary" not in keys
    assert op_keys("Reduce") == ["Reduce.Sum", "Reduce.Max"]


def test_undeclared_op_is_unsupported():
    t = spirv_table()
    err = t.refusal(O.Transpose((1, 0)), [TensorType((2, 3), F32)], TensorType((3, 2), F32))
    assert isinstance(err, UnsupportedOp) and err.op == "Transpose" and err.backend == "spirv"


def test_use_flags_are_enforced():
    t = spirv_table()
    # BF16 can be stored and converted but has no arithmetic: Add on it is refused even if
    # a table lists it, and the message says which use is missing
    t.ops["Binary.Add"] = frozenset({F32, BF16})
    ty = TensorType((3,), BF16)
    err = t.refusal(ADD, [ty, ty], ty)
    assert isinstance(err, DtypeLowering) and "no arith use of bf16" in str(err)
    # a dtype with no storage use at all
    ty8 = TensorType((3,), DType.I8)
    err = t.refusal(O.Cast(F32), [ty8], TensorType((3,), F32))
    assert isinstance(err, DtypeLowering) and err.dtype == "i8" and "cannot be stored" in str(err)
    # Cast needs the conversion use on both ends
    assert t.allows(O.Cast(F16), [TensorType((3,), F32)], TensorType((3,), F16))


def test_region_bodies_are_checked():
    t = spirv_table()
    ty = TensorType((4, 5), F16)
    ok = region([ty, ty], lambda b, x, y: b.eqn(ADD, b.eqn(EXP, x), y))
    assert t.allows(O.Fused(ok), [ty, ty], ty)
    c = TensorType((4, 5), I32)
    bad = region([c, ty, ty], lambda b, c, x, y: b.eqn(O.Select(), c, x, y))
    err = t.refusal(O.Fused(bad), [c, ty, ty], ty)
    assert isinstance(err, DtypeLowering) and "inside Fused" in str(err)
    assert err.op == "Select" and err.dtype == "f16" and err.device == "spirv:0"
    assert str(err) == ("inside Fused: Select on f16: OpSelect has no 16-bit float form "
                        "[op=Select, dtype=f16, backend=spirv, device=spirv:0]")


def test_contraction_epilogue_head_is_checked():
    t = spirv_table()
    a, w = TensorType((3, 8), F32), TensorType((8, 4), F32)
    h = TensorType((3, 4), F32)
    body = region([h, TensorType((4,), F32)], lambda b, h, bias: b.eqn(ADD, h, bias))
    op = O.ContractionEpilogue(O.MatMul(), 2, body)
    assert t.allows(op, [a, w, TensorType((4,), F32)], h)
    t.ops.pop("MatMul")
    err = t.refusal(op, [a, w, TensorType((4,), F32)], h)
    assert isinstance(err, UnsupportedOp) and err.op == "MatMul" and "inside" in str(err)


def test_declared_is_not_elected():
    """An unelected key lowers (allowed, listed in the matrix), but compile is told of it,
    also as an epilogue's head, unless the policy asks for it."""
    from dataclasses import replace

    t = replace(spirv_table(), unelected=frozenset({"MatMul"}))
    a, w, h, bias = (TensorType(s, F32) for s in ((3, 8), (8, 4), (3, 4), (4,)))
    op = O.ContractionEpilogue(O.MatMul(), 2, region([h, bias], lambda b, h, c: b.eqn(ADD, h, c)))
    assert t.allows(op, [a, w, bias], h) and t.allows(O.MatMul(), [a, w], h)
    assert t.unelected_key(op, [a, w, bias]) == t.unelected_key(O.MatMul(), [a, w]) == "MatMul"
    assert t.unelected_key(op, [a, w, bias], asked={"MatMul"}) is None
    assert t.unelected_key(EXP, [h]) is None
    assert "declared, not elected: MatMul" in t.summary()
    assert "Declared but not elected (compile forms them only where the policy asks" \
        in t.to_markdown()
    with pytest.raises(PootError, match="unelected but not declared"):
        CapabilityTable.declare("x", "x:0", {F32: Use.all()}, {"MatMul": [F32]},
                                unelected={"Attention"})


def test_packed_formats_are_declared_by_name():
    t = spirv_table()
    ok = PackedWeight("dense:f16words", (4, 8))
    src = [s.type for s in ok.sources()]
    a = TensorType((2, 8), F32)
    assert t.allows(O.PackedContraction(ok), [a] + src, TensorType((2, 4), F32))
    t.ops["PackedContraction"] = frozenset({"gguf:Q4_0"})
    err = t.refusal(O.PackedContraction(ok), [a] + src, TensorType((2, 4), F32))
    assert isinstance(err, DtypeLowering) and err.dtype == "dense:f16words"


def test_declare_accepts_format_names_without_a_colon():
    t = CapabilityTable.declare("x", "x:0", {F32: Use.all()},
                                {"PackedDequant": ["nvfp4", "f32", F16]})
    assert t.lowers("PackedDequant") == {"nvfp4", F32, F16}


def test_buffer_limit_is_a_limit_exceeded():
    t = spirv_table()
    t.limits["max_buffer_bytes"] = 1024
    big = TensorType((1024,), F32)
    err = t.refusal(EXP, [big], big)
    assert isinstance(err, LimitExceeded) and "4096 bytes" in str(err)


def test_graph_refusals_lists_every_refused_eqn():
    b = Builder("g")
    x = b.const(TensorType((4,), F16), "x")
    c = b.const(TensorType((4,), I32), "c")
    y = b.eqn(EXP, x)
    z = b.eqn(O.Select(), c, y, x)
    b.result(b.eqn(O.Transpose((0,)), z))
    refusals = spirv_table().graph_refusals(b.finish())
    assert [type(e).__name__ for _, e in refusals] == ["DtypeLowering", "UnsupportedOp"]
    assert all(isinstance(e, LoweringError) for _, e in refusals)


def test_summary_and_markdown():
    t = spirv_table()
    s = t.summary()
    n = len(O.UnaryOp)
    assert "f16:storage+convert+arith+dot" in s and f"Unary {n}/{n}" in s and "Select" in s
    md = t.to_markdown()
    assert md.startswith("# spirv on spirv:0")
    row = next(line for line in md.splitlines() if line.startswith("| Select |"))
    assert row == "| Select | yes | - | - | yes | - |"  # columns f32 f16 bf16 i32 u32
    packed = next(line for line in md.splitlines() if line.startswith("| PackedContraction |"))
    assert packed == "| PackedContraction | yes |"  # the format table: dense:f16words
    assert "- Select:f16: OpSelect has no 16-bit float form" in md


@settings(max_examples=40, deadline=None)
@given(st.sets(st.sampled_from([F32, F16, BF16, I32])), st.sampled_from([F32, F16, BF16, I32]))
def test_allows_iff_declared_with_the_needed_uses(declared, dtype):
    t = CapabilityTable.declare("h", "h:0", {F32: Use.all(), F16: Use.all(), I32: Use.all(),
                                             BF16: Use.STORAGE}, {"Binary.Mul": declared})
    ty = TensorType((2,), dtype)
    want = dtype in declared and dtype is not BF16
    assert t.allows(MUL, [ty, ty], ty) == want
    if not want:
        assert isinstance(t.refusal(MUL, [ty, ty], ty), DtypeLowering)


class TwoDeviceBackend(Backend):
    """Device 0 computes in bf16; device 1 only stores it: one table per device."""

    name = "twodev"

    def probe(self):
        return [Device("twodev", 0, "new"), Device("twodev", 1, "old")]

    def capabilities(self, device):
        bf16 = Use.all() if device.index == 0 else Use.STORAGE
        return CapabilityTable.declare(self.name, device.id, {F32: Use.all(), BF16: bf16},
                                       {"Unary.Exp": [F32, BF16]})


def test_tables_are_per_device():
    from poot.plan import plan

    b = Builder("exp")
    b.result(b.eqn(EXP, b.const(TensorType((8,), BF16), "x")))
    g = b.finish()
    backend = TwoDeviceBackend()
    new, old = backend.probe()
    assert plan(g, (backend, new)).steps[0].lowering.kernel == "Unary.Exp"
    with pytest.raises(DtypeLowering) as ei:
        plan(g, (backend, old))
    assert ei.value.device == "twodev:1" and ei.value.dtype == "bf16"
