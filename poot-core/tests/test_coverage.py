"""poot.codegen.coverage: the one declaration kernel backends derive their tables from."""
from __future__ import annotations

import pytest
from poot.capability import Use, every_op_key
from poot.codegen.coverage import (
    ARITH,
    COVERAGE,
    FULL,
    HELD,
    NARROW,
    NARROW_INTS,
    PACKED,
    U32,
    kernel_table,
)
from poot.codegen.lower import LOWERINGS
from poot.dtypes import DType
from poot.errors import DtypeLowering, PootError, UnsupportedOp
from poot.ir import ops as O
from poot.ir.types import TensorType

D = DType
T = TensorType
#: Reshape is an alias of its operand's buffer: the planner lowers it without a kernel
ALIASES = {"Reshape"}
USES = {D.F32: FULL, D.I32: FULL, D.U32: FULL, D.F16: FULL, D.BF16: HELD,
        **dict.fromkeys(NARROW_INTS, NARROW), D.F8E4M3: PACKED}


def _family(key: str) -> str:
    return key.split(".")[0]


def test_every_declared_key_is_an_op_key_with_a_lowering():
    lowered = {cls.__name__ for cls in LOWERINGS} | ALIASES
    assert set(COVERAGE) <= set(every_op_key())
    assert {k for k in COVERAGE if _family(k) not in lowered} == set()


def test_every_lowering_is_declared():
    """A lowering without its COVERAGE entry is code no backend declares."""
    declared = {_family(k) for k in COVERAGE}
    assert {cls.__name__ for cls in LOWERINGS} - declared == set()
    for family in ("Unary", "Binary", "Reduce"):
        assert {k for k in every_op_key() if _family(k) == family} <= set(COVERAGE)


def test_rules_print_as_written():
    assert repr(ARITH - U32) == "arith - {u32}"
    assert repr(COVERAGE["GroupedDenseContraction"].dtypes) == "dot & {bf16}"


def test_a_table_follows_the_device_uses():
    t = kernel_table("k", "k:0", USES, {"gguf:Q4_0"})
    assert t.lowers("Unary.Exp") == {D.F32, D.F16}               # bf16 is held only
    assert t.lowers("MatMul") == {D.F32, D.F16, D.BF16, D.I32}
    assert t.lowers("Broadcast") == {D.F32, D.I32, D.U32, D.F16, D.BF16, *NARROW_INTS}
    assert t.lowers("Reduce.Max") == {D.F32, D.F16, D.I32, *NARROW_INTS}
    assert t.lowers("PackedContraction") == {"gguf:Q4_0"}
    assert "f8e4m3" in t.notes and "GatedContraction" not in t.ops   # offered, not elected
    bare = kernel_table("k", "k:0", {**USES, D.F16: Use.NONE}, ())
    assert all(D.F16 not in v for v in bare.ops.values())


def test_refusals_name_the_fact():
    t = kernel_table("k", "k:0", USES, (), refuse={"Select": {D.F16: "no f16 OpSelect"}},
                     without={"PagedAttention": "its own attention reads dense rows"})
    x = T((4,), D.F16)
    with pytest.raises(DtypeLowering, match="no f16 OpSelect"):
        t.check(O.Select(), [T((4,), D.I32), x, x], x)
    assert D.F16 in t.lowers("Rope")                  # a Select rule is not a printer's
    with pytest.raises(UnsupportedOp, match="its own attention reads dense rows"):
        q = T((1, 4, 1, 16), D.F32)
        t.check(O.PagedAttention(0.25), [q, T((8, 2, 16), D.F32), T((8, 2, 16), D.F32),
                                         T((1, 8), D.I32), T((1, 1, 1, 1, 8), D.F32)], q)


def test_a_printer_without_selects_refuses_every_op_that_selects():
    t = kernel_table("k", "k:0", USES, (), no_select={D.F16: "the printer has no f16 select"})
    x, cs = T((3, 4, 16), D.F16), T((3, 1, 6), D.F16)
    for op, ins in ((O.Rope(12), [x, cs, cs]), (O.Select(), [T((3, 4, 16), D.I32), x, x])):
        with pytest.raises(DtypeLowering, match="no f16 select"):
            t.check(op, ins, x)
    assert D.F16 in t.lowers("Attention")


def test_a_backends_own_kernels_declare_what_no_lowering_covers():
    t = kernel_table("k", "k:0", USES, (), own={"Q8PackedContraction": {"gguf:Q4_0"}})
    assert t.lowers("Q8PackedContraction") == {"gguf:Q4_0"}
    with pytest.raises(PootError, match="declare these already"):
        kernel_table("k", "k:0", USES, (), own={"Attention": {D.F32}})


def test_offered_composites_are_declared_only_when_declared_or_elected():
    t = kernel_table("k", "k:0", USES, (), elect=("GatedContraction",))
    assert t.lowers("GatedContraction") == t.lowers("ContractionEpilogue")
    assert "NormedDenseContraction" not in t.ops and not t.unelected
    t = kernel_table("k", "k:0", USES, (), elect=("GatedContraction",),
                     declare=("NormedDenseContraction", "GatedContraction"))
    assert t.lowers("NormedDenseContraction") == t.lowers("DenseContraction")
    assert t.unelected == {"NormedDenseContraction"}      # declared, not elected
    for bad in ({"elect": ("MatMul",)}, {"declare": ("MatMul",)}):
        with pytest.raises(PootError, match="MatMul"):
            kernel_table("k", "k:0", USES, (), **bad)
    with pytest.raises(PootError, match="Nonsense"):
        kernel_table("k", "k:0", USES, (), without={"Nonsense": "typo"})
