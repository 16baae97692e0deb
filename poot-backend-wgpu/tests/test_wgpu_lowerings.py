"""Every lowering poot.codegen offers, printed as WGSL and run on the device, against the oracle.

Each case is one eqn: its op, operand types (or literals) and seeded random inputs; the
kernels come from `poot.codegen.lower.lower`, the expected result from the oracle's rule
(`poot.oracle.evaluate.apply`).
"""
import numpy as np
import pytest
from poot.codegen.lower import lower
from poot.dtypes import DType
from poot.errors import DtypeLowering
from poot.ir import ops as O
from poot.ir.graph import Lit
from poot.ir.types import TensorType
from poot.oracle.evaluate import apply
from poot_wgpu.exprcheck import assert_bits_equal, assert_close
from poot_wgpu.launch import run_lowering

D = DType
T = TensorType


def _random(t: TensorType, rng, low=None, high=None):
    if t.dtype.is_float:
        return rng.standard_normal(t.shape).astype(np.float32).astype(t.dtype.numpy)
    info = np.iinfo(t.dtype.numpy)
    lo = info.min if low is None else low
    hi = int(info.max) if high is None else high
    return rng.integers(lo, hi + 1, t.shape).astype(t.dtype.numpy)


# (id, op, operand types or literals, {operand index: (low, high)} for index operands, exact)
CASES = [
    ("exp", O.Unary(O.UnaryOp.Exp), [T((5, 7), D.F32)], {}, False),
    ("erf-f16", O.Unary(O.UnaryOp.Erf), [T((33,), D.F16)], {}, False),
    ("add-bcast", O.Binary(O.BinaryOp.Add), [T((4, 1), D.F32), T((1, 6), D.F32)], {}, True),
    ("mul-lit", O.Binary(O.BinaryOp.Mul), [T((3, 5), D.F32), Lit(0.125, D.F32)], {}, True),
    ("div-i32", O.Binary(O.BinaryOp.Div), [T((70,), D.I32), T((70,), D.I32)],
     {1: (-3, 3)}, True),
    ("shr-u32", O.Binary(O.BinaryOp.Shr), [T((9, 9), D.U32), T((9, 1), D.U32)],
     {1: (0, 40)}, True),
    ("add-f16", O.Binary(O.BinaryOp.Add), [T((2, 17), D.F16), T((2, 17), D.F16)], {}, True),
    ("add-i8", O.Binary(O.BinaryOp.Add), [T((37,), D.I8), T((37,), D.I8)], {}, True),
    ("select", O.Select(), [T((6, 5), D.I32), T((6, 5), D.F32), T((1, 5), D.F32)],
     {0: (0, 1)}, True),
    ("cast-f32-bf16", O.Cast(D.BF16), [T((3, 11), D.F32)], {}, True),
    ("cast-bf16-f32", O.Cast(D.F32), [T((3, 11), D.BF16)], {}, True),
    ("cast-f32-f16", O.Cast(D.F16), [T((13,), D.F32)], {}, True),
    ("cast-f32-u8", O.Cast(D.U8), [T((50,), D.F32)], {}, True),
    ("iota-f32", O.Iota((3, 4), 1, D.F32), [], {}, True),
    ("iota-i32", O.Iota((5, 2), 0, D.I32), [], {}, True),
    ("broadcast", O.Broadcast((4, 3, 5)), [T((3, 1), D.F32)], {}, True),
    ("transpose", O.Transpose((2, 0, 1)), [T((2, 3, 5), D.F32)], {}, True),
    ("slice", O.Slice(1, 2, 7), [T((3, 9), D.F32)], {}, True),
    ("concat", O.Concat(-1), [T((2, 3), D.F32), T((2, 5), D.F32)], {}, True),
    ("gather", O.Gather(0), [T((10, 6), D.F32), T((4,), D.I32)], {1: (0, 9)}, True),
    ("scatter", O.ScatterUpdate(), [T((8, 4), D.F32), T((5, 4), D.F32), T((5,), D.I32)],
     {2: (-1, 7)}, True),
    ("dus", O.DynamicUpdateSlice(1), [T((2, 9, 3), D.F32), T((2, 2, 3), D.F32),
                                      T((1,), D.I32)], {2: (0, 7)}, True),
    ("argtopk", O.ArgTopK(3), [T((4, 10), D.F32)], {}, True),
    ("sum-last", O.Reduce(O.ReduceOp.Sum, -1, False), [T((5, 300), D.F32)], {}, False),
    ("max-first", O.Reduce(O.ReduceOp.Max, 0, True), [T((7, 6), D.F32)], {}, True),
    ("sum-i32", O.Reduce(O.ReduceOp.Sum, 1, False), [T((3, 40), D.I32)], {0: (-1000, 1000)},
     True),
    ("matmul", O.MatMul(), [T((3, 5), D.F32), T((5, 7), D.F32)], {}, False),
    ("matmul-batched", O.MatMul(), [T((2, 1, 4, 8), D.F32), T((3, 8, 5), D.F32)], {}, False),
    ("gemv", O.MatMul(), [T((1, 200), D.F32), T((200, 33), D.F32)], {}, False),
    ("matmul-f16", O.MatMul(), [T((4, 16), D.F16), T((16, 9), D.F16)], {}, False),
    ("indexed-matmul", O.IndexedMatMul(), [T((4, 8), D.F32), T((3, 8, 6), D.F32),
                                           T((4,), D.I32)], {2: (0, 2)}, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_lowering_matches_the_oracle(wgpu_device, case):
    name, op, ins, ranges, exact = case
    rng = np.random.default_rng(sum(map(ord, name)))
    in_types = [x.type if isinstance(x, Lit) else x for x in ins]
    out_type = op.infer(in_types)
    args = [np.full((), x.value, x.dtype.numpy) if isinstance(x, Lit)
            else _random(x, rng, *ranges.get(i, (None, None))) for i, x in enumerate(ins)]
    if name == "scatter":
        args[2][:2] = [3, 3]  # a repeated slot: the later row wins
    want = apply(op, args, in_types, out_type)
    lowering = lower(op, ins, out_type)
    operands = [None if isinstance(x, Lit) else a for x, a in zip(ins, args, strict=True)]
    seed = _random(out_type, rng) if lowering.alias is None else None
    got = run_lowering(wgpu_device, lowering, operands,
                       seed if seed is not None else np.empty(out_type.shape, want.dtype))
    if exact:
        assert_bits_equal(got.reshape(-1), want.reshape(-1), name)
    else:
        rtol = 2e-3 if out_type.dtype is D.F16 else 1e-4
        assert_close(got.reshape(-1), want.reshape(-1), name, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", [D.F16, D.BF16])
def test_select_lowering_refuses_16_bit_floats(wgpu_device, dtype):
    ins = [T((8,), D.I32), T((8,), dtype), T((8,), dtype)]
    lowering = lower(O.Select(), ins, ins[1])
    args = [np.ones(8, np.int32), np.ones(8, dtype.numpy), np.ones(8, dtype.numpy)]
    with pytest.raises(DtypeLowering, match="Select"):
        run_lowering(wgpu_device, lowering, args, np.empty(8, dtype.numpy))


REDUCTIONS = [("sum-f32", O.Reduce(O.ReduceOp.Sum, -1, False), T((5, 700), D.F32), False),
              ("max-i32", O.Reduce(O.ReduceOp.Max, -1, False), T((3, 900), D.I32), True),
              ("max-f32", O.Reduce(O.ReduceOp.Max, -1, False), T((3, 900), D.F32), True)]


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "no-subgroup"])
def test_whole_workgroup_reductions_use_subgroups_where_the_adapter_has_them(
        wgpu_device, limited, subgroup):
    """With the adapter's `subgroup` feature a Sum (and an integer Max) over the whole
    workgroup folds subgroup partials; without it, or for an f32 Max (NaN rule), the tree."""
    from poot_wgpu.wgsl import print_kernel

    if subgroup and not wgpu_device.has("subgroup"):
        pytest.skip(f"the adapter lacks subgroup: {sorted(wgpu_device.features)}")
    dev = limited()
    dev.features = wgpu_device.features - ({"subgroup"} if not subgroup else set())
    rng = np.random.default_rng(11)
    for name, op, t, exact in REDUCTIONS:
        out_type = op.infer([t])
        x = _random(t, rng, -10**6, 10**6)
        lowering = lower(op, [t], out_type)
        source = "".join(print_kernel(k, dev).source for k in lowering.kernels)
        assert ("subgroupAdd" in source or "subgroupMax" in source) == \
            (subgroup and name != "max-f32"), name
        got = run_lowering(dev, lowering, [x], np.empty(out_type.shape, out_type.dtype.numpy))
        want = apply(op, [x], [t], out_type)
        if exact:
            assert_bits_equal(got.reshape(-1), want.reshape(-1), name)
        else:
            assert_close(got.reshape(-1), want.reshape(-1), name, rtol=1e-4, atol=1e-4)
