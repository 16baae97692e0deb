"""The capability table, proven: every (op, dtype) it declares runs on the device and matches
the oracle; every stored dtype it leaves out of an op is refused with the typed error."""
import numpy as np
import pytest
from poot.capability import Use
from poot.codegen.lower import lower
from poot.dtypes import DType
from poot.errors import DtypeLowering, LoweringError
from poot.ir import ops as O
from poot.ir.builder import Builder
from poot.ir.types import TensorType
from poot.reference.evaluate import apply
from poot_wgpu.backend import BACKEND_INSTANCE
from poot_wgpu.launch import run_lowering
from wgpu_exprcheck import assert_bits_equal, assert_close

D = DType
T = TensorType
I32 = D.I32


def _table():
    found = BACKEND_INSTANCE.probe()
    if not found:
        pytest.skip(f"wgpu backend: {BACKEND_INSTANCE.unavailable_reason()}")
    return BACKEND_INSTANCE.capabilities(found[0])


def _region(name, types, build):
    b = Builder(name, compiler=True)
    b.result(build(b, [b.param(t) for t in types]))
    return b.finish()


def _rms_norm(b, ps):
    x, w = ps
    sq = b.eqn(O.Binary(O.BinaryOp.Mul), x, x)
    ss = b.eqn(O.Reduce(O.ReduceOp.Sum, -1, True), sq)
    ms = b.eqn(O.Binary(O.BinaryOp.Mul), ss, b.lit(1 / 96, x.dtype))
    den = b.eqn(O.Unary(O.UnaryOp.Sqrt), b.eqn(O.Binary(O.BinaryOp.Add), ms, b.lit(1e-5, x.dtype)))
    return b.eqn(O.Binary(O.BinaryOp.Mul), b.eqn(O.Binary(O.BinaryOp.Div), x, den), w)


def _softmax(b, ps):
    (x,) = ps
    m = b.eqn(O.Reduce(O.ReduceOp.Max, -1, True), x)
    ex = b.eqn(O.Unary(O.UnaryOp.Exp), b.eqn(O.Binary(O.BinaryOp.Sub), x, m))
    return b.eqn(O.Binary(O.BinaryOp.Div), ex, b.eqn(O.Reduce(O.ReduceOp.Sum, -1, True), ex))


def _gelu_ish(b, ps):
    x, y = ps
    t = b.eqn(O.Unary(O.UnaryOp.Tanh), b.eqn(O.Binary(O.BinaryOp.Mul), x, y))
    return b.eqn(O.Binary(O.BinaryOp.Add), t, b.eqn(O.Unary(O.UnaryOp.Exp), x))


def case(key: str, d: DType):
    """(op, operand types, index operands {i: (low, high)}) of a small eqn for key at d."""
    family, _, sub = key.partition(".")
    if family == "Unary":
        return O.Unary(O.UnaryOp[sub]), [T((37,), d)], {}
    if family == "Binary":
        ranges = {1: (-40, 40)} if sub in ("Shl", "Shr") and d is I32 else \
            {1: (0, 40)} if sub in ("Shl", "Shr") else {}
        return O.Binary(O.BinaryOp[sub]), [T((5, 8), d), T((1, 8), d)], ranges
    if family == "Reduce":
        return O.Reduce(O.ReduceOp[sub], -1, False), [T((3, 70), d)], {}
    simple = {
        "Select": (O.Select(), [T((5, 8), I32), T((5, 8), d), T((5, 1), d)], {0: (0, 1)}),
        "Iota": (O.Iota((4, 6), 1, d), [], {}),
        "Cast": (O.Cast(d), [T((40,), D.F32 if d is not D.F32 else I32)], {}),
        "Broadcast": (O.Broadcast((3, 4, 5)), [T((4, 1), d)], {}),
        "Reshape": (O.Reshape((6, 2)), [T((3, 4), d)], {}),
        "Transpose": (O.Transpose((1, 0)), [T((3, 7), d)], {}),
        "Slice": (O.Slice(0, 1, 4), [T((5, 3), d)], {}),
        "Concat": (O.Concat(0), [T((2, 3), d), T((1, 3), d)], {}),
        "Gather": (O.Gather(0), [T((9, 5), d), T((3,), I32)], {1: (0, 8)}),
        "ScatterUpdate": (O.ScatterUpdate(), [T((6, 3), d), T((3, 3), d), T((3,), I32)],
                          {2: (-1, 5)}),
        "DynamicUpdateSlice": (O.DynamicUpdateSlice(0), [T((7, 3), d), T((2, 3), d),
                                                         T((1,), I32)], {2: (0, 5)}),
        "ArgTopK": (O.ArgTopK(3), [T((4, 9), d)], {}),
        "MatMul": (O.MatMul(), [T((3, 16), d), T((16, 5), d)], {0: (-9, 9), 1: (-9, 9)}),
        "IndexedMatMul": (O.IndexedMatMul(), [T((3, 8), d), T((2, 8, 4), d), T((3,), I32)],
                          {0: (-9, 9), 1: (-9, 9), 2: (0, 1)}),
    }
    if key in simple:
        return simple[key]
    if key == "Fused":
        types = [T((4, 6), d), T((1, 6), d)]
        return O.Fused(_region("gelu_ish", types, _gelu_ish)), types, {}
    if key == "FusedRow":
        types = [T((5, 96), d), T((96,), d)]
        return O.FusedRow(_region("rms_norm", types, _rms_norm), -1), types, {}
    raise AssertionError(f"no test case for {key}")


def _random(t: TensorType, rng, low=None, high=None):
    if t.dtype.is_float:
        return rng.standard_normal(t.shape).astype(np.float32).astype(t.dtype.numpy)
    info = np.iinfo(t.dtype.numpy)
    lo = max(info.min, -(2**31) if low is None else low)
    hi = min(int(info.max), 2**31 - 1 if high is None else high)
    return rng.integers(lo, hi + 1, t.shape).astype(t.dtype.numpy)


def _declared():
    try:
        table = _table()
    except pytest.skip.Exception:
        return []
    return [(k, d) for k in sorted(table.ops) for d in sorted(table.ops[k], key=str)
            # a region's arithmetic needs an arithmetic dtype (bf16 regions are refused below)
            if not (k in ("Fused", "FusedRow") and Use.ARITH not in table.uses(d))
            and not (k in ("Fused", "FusedRow") and d.is_int)]


_EXACT_FLOAT = ("Binary.Add", "Binary.Sub", "Binary.Mul", "Binary.Max", "Binary.Ge",
                "Unary.Neg", "Select", "Cast", "Broadcast", "Reshape", "Transpose", "Slice",
                "Concat", "Gather", "ScatterUpdate", "DynamicUpdateSlice", "ArgTopK", "Iota",
                "Reduce.Max")


@pytest.mark.parametrize("key,dtype", _declared(), ids=lambda v: str(v))
def test_declared_pairs_match_the_oracle(wgpu_device, key, dtype):
    op, types, ranges = case(key, dtype)
    rng = np.random.default_rng(abs(hash((key, str(dtype)))) % 2**32)
    args = [_random(t, rng, *ranges.get(i, (None, None))) for i, t in enumerate(types)]
    out = op.infer(types)
    want = apply(op, args, types, out)
    got = run_lowering(wgpu_device, lower(op, types, out), args, np.zeros(out.shape,
                                                                           want.dtype))
    if not out.dtype.is_float or key in _EXACT_FLOAT:
        assert_bits_equal(got.reshape(-1), want.reshape(-1), f"{key} {dtype}")
    else:
        tol = 1e-4 if out.dtype is D.F32 else 1e-2
        assert_close(got.reshape(-1), want.reshape(-1), f"{key} {dtype}", rtol=tol, atol=tol)


def test_undeclared_pairs_are_refused_by_name(wgpu_device):
    table = _table()
    stored = [d for d, u in table.dtypes.items() if Use.STORAGE in u]
    refused = 0
    for key in ("Unary.Exp", "Binary.Add", "Binary.Shl", "Select", "Reduce.Max", "MatMul"):
        for d in stored:
            if d in table.ops[key]:
                continue
            op, types, _ = case(key, d)
            try:
                out = op.infer(types)
            except Exception:  # the IR's own type rule refuses it first
                continue
            with pytest.raises(LoweringError) as e:
                table.check(op, types, out)
            assert e.value.backend == "wgpu" and e.value.dtype == str(d)
            refused += 1
    assert refused >= 8
    for key in ("Fused", "FusedRow"):  # bf16 arithmetic inside a region, found in its body
        op, types, _ = case(key, D.BF16)
        with pytest.raises(DtypeLowering, match="bf16"):
            table.check(op, types, op.infer(types))


def test_table_declares_the_dtype_rules(wgpu_device):
    table = _table()
    assert table.uses(D.F32) == Use.all()
    assert table.uses(D.BF16) == Use.STORAGE | Use.CONVERT | Use.DOT
    assert Use.ARITH not in table.uses(D.BF16)
    assert table.uses(D.F8E4M3) == Use.NONE
    f16 = Use.all() if wgpu_device.has("shader-f16") else Use.NONE
    assert table.uses(D.F16) == f16
    for d in (D.F16, D.BF16):
        op, types, _ = case("Select", d)
        with pytest.raises(DtypeLowering, match="SPIR-V"):
            table.check(op, types, op.infer(types))
    assert "bf16" in table.to_markdown()
