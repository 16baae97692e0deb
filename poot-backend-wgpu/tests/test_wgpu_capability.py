"""The capability table's dtype rules and refusals (every declared (op, dtype) is run on the
device by `poot conformance wgpu`, which scripts/test.sh runs)."""
import pytest
from poot.capability import Use
from poot.dtypes import DType
from poot.errors import DtypeLowering, UnsupportedOp
from poot.ir import ops as O
from poot.ir.types import TensorType
from poot_wgpu.backend import BACKEND_INSTANCE
from poot_wgpu.capability import capability_table

D = DType
T = TensorType


@pytest.fixture(scope="module")
def table(wgpu_device):
    return BACKEND_INSTANCE.capabilities(BACKEND_INSTANCE.probe()[0])


def test_dtype_uses_follow_the_adapter(wgpu_device, table):
    assert table.uses(D.F32) == Use.all()
    assert table.uses(D.BF16) == Use.STORAGE | Use.CONVERT | Use.DOT  # no bf16 arithmetic
    assert table.uses(D.F8E4M3) == Use.STORAGE  # packed sources only
    f16 = Use.all() if wgpu_device.has("shader-f16") else Use.NONE
    assert table.uses(D.F16) == f16


def test_the_table_says_how_reductions_use_the_subgroup_feature(limited):
    dev = limited()
    dev.features = dev.features | {"subgroup"}
    with_feature = capability_table(dev, "wgpu:0", frozenset()).notes["subgroups"]
    dev.features = dev.features - {"subgroup"}
    without = capability_table(dev, "wgpu:0", frozenset()).notes["subgroups"]
    assert "folds subgroup partials" in with_feature
    assert "lacks the subgroup feature" in without


def test_without_shader_f16_f16_is_refused_everywhere(limited):
    dev = limited()
    dev.features = frozenset(f for f in dev.features if f != "shader-f16")
    bare = capability_table(dev, "wgpu:0", frozenset())
    assert bare.uses(D.F16) == Use.NONE
    assert all(D.F16 not in dts for dts in bare.ops.values())


def test_f16_kv_attention_is_refused_without_shader_f16(limited):
    """An f32 query over f16 keys (an f16 KV cache read in place) needs f16 storage: refused
    at plan time, naming op, dtype and backend, while bf16 keys (u32 halves) stay declared."""
    dev = limited()
    dev.features = frozenset(f for f in dev.features if f != "shader-f16")
    bare = capability_table(dev, "wgpu:0", frozenset())
    q, mask = T((4, 1, 16), D.F32), T((1, 8), D.F32)
    for op in (O.Attention(0.25), O.SinkAttention(0.25)):
        kv = T((2, 8, 16), D.F16)
        extra = [T((4,), D.F32)] if isinstance(op, O.SinkAttention) else []
        with pytest.raises(DtypeLowering, match="f16") as e:
            bare.check(op, [q, kv, kv, mask, *extra], q)
        assert (e.value.op, e.value.dtype, e.value.backend) == (op.name, "f16", "wgpu")
        kv = T((2, 8, 16), D.BF16)
        assert bare.allows(op, [q, kv, kv, mask, *extra], q)


@pytest.mark.parametrize("dtype", [D.F16, D.BF16])
def test_select_on_16_bit_floats_is_refused(table, dtype):
    types = [T((4,), D.I32), T((4,), dtype), T((4,), dtype)]
    with pytest.raises(DtypeLowering, match="SPIR-V") as e:
        table.check(O.Select(), types, types[1])
    assert (e.value.op, e.value.dtype, e.value.backend) == ("Select", str(dtype), "wgpu")


def test_ops_selecting_in_f16_are_refused_with_select(wgpu_device, table):
    """Rope's kernels select in the element dtype: WGSL printing refuses them on F16 as it
    refuses Select, while the other ops on F16 (here Attention) stay declared."""
    if not wgpu_device.has("shader-f16"):
        pytest.skip("the adapter has no shader-f16: F16 is refused everywhere")
    x, cs = T((3, 4, 16), D.F16), T((3, 1, 6), D.F16)
    with pytest.raises(DtypeLowering, match="select in f16.*SPIR-V"):
        table.check(O.Rope(12), [x, cs, cs], x)
    assert D.F16 in table.lowers("Attention")


def test_bf16_arithmetic_and_undeclared_ops_are_refused(table):
    x = T((4,), D.BF16)
    with pytest.raises(DtypeLowering, match="bf16"):
        table.check(O.Binary(O.BinaryOp.Add), [x, x], x)
    with pytest.raises(DtypeLowering, match="f8e4m3"):
        table.check(O.Gather(0), [T((4, 2), D.F8E4M3), T((1,), D.I32)], T((1, 2), D.F8E4M3))
    with pytest.raises(UnsupportedOp, match="wgpu does not lower AllReduce"):
        table.check(O.AllReduce(1), [T((4,), D.F32)], T((4,), D.F32))


def test_binding_limit_is_in_the_table(wgpu_device, table):
    limit = wgpu_device.limit("max-storage-buffer-binding-size")
    assert table.limits["max_buffer_bytes"] == limit
    big = T((limit // 4 + 1,), D.F32)
    err = table.refusal(O.Unary(O.UnaryOp.Exp), [big], big)
    assert err is not None and type(err).__name__ == "LimitExceeded"


def test_support_matrix_names_the_rules(table):
    md = table.to_markdown()
    assert "| Select |" in md and "SPIR-V" in md and "storage and conversion only" in md


def _scan_graph(dtype, body_fn, carry_shape=(4,)):
    from poot.ir import Builder, region

    c = T(carry_shape, dtype)
    b = Builder("scan")
    init = b.const(c, "init")
    xs = b.const(T((3, *carry_shape), dtype), "xs")
    b.result(b.eqn(O.Scan(region([c, c], body_fn), 3), init, xs))
    return b.finish()


def test_scan_body_is_checked_as_a_region(table):
    """A Scan's kernel evaluates its body, so a body eqn the device lacks refuses it."""
    g = _scan_graph(D.BF16, lambda b, c, x: b.eqn(O.Binary(O.BinaryOp.Add), c, x))
    with pytest.raises(DtypeLowering, match="inside Scan") as e:
        table.check_eqn(g.eqns()[0], g)
    assert (e.value.op, e.value.dtype) == ("Binary.Add", "bf16")


def test_scan_body_with_a_reduction_is_refused_at_plan_time(wgpu_device, table):
    from poot.plan import plan

    def body(b, c, x):
        total = b.eqn(O.Reduce(O.ReduceOp.Sum, 0, True), c)
        return b.eqn(O.Binary(O.BinaryOp.Add), b.eqn(O.Broadcast((4,)), total), x)

    g = _scan_graph(D.F32, body)
    with pytest.raises(UnsupportedOp, match="Scan body holds Reduce") as e:
        plan(g, (BACKEND_INSTANCE, BACKEND_INSTANCE.probe()[0]))
    assert (e.value.op, e.value.backend, e.value.device) == ("Scan", "wgpu", table.device)
