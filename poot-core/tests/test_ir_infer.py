"""Every primitive's `infer` against numpy's own shape rules (hypothesis), and the typed
errors (ShapeError / DtypeError naming the op) for shapes and dtypes the rule refuses."""
from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from poot.dtypes import DType
from poot.errors import DtypeError, ShapeError
from poot.formats import PackedWeight
from poot.ir import TensorType
from poot.ir import ops as O

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
F32, I32, U32 = DType.F32, DType.I32, DType.U32
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
nonempty_shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5)


def T(shape, dtype=F32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def empty(shape):
    return np.empty(tuple(shape), np.float32)


def numpy_shape(fn):
    """The shape numpy gives, or None where numpy refuses."""
    try:
        return tuple(fn())
    except (ValueError, IndexError, TypeError, np.exceptions.AxisError):
        return None


def poot_shape(op, ins):
    """The shape op.infer gives, or None where it refuses (with a ShapeError naming it)."""
    try:
        return op.infer(ins).shape
    except ShapeError as e:
        assert str(e).startswith(op.name), e
        return None


# -- elementwise ---------------------------------------------------------------------------
@SETTINGS
@given(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
       st.sampled_from(list(O.BinaryOp)))
def test_binary_broadcasts_like_numpy(bs, op):
    a, b = bs.input_shapes
    dtype = I32 if op.bitwise else F32
    out = O.Binary(op).infer([T(a, dtype), T(b, dtype)])
    assert out.shape == np.broadcast_shapes(a, b) == bs.result_shape
    assert out.dtype == (I32 if op.compare else dtype)


@SETTINGS
@given(shapes, shapes, st.sampled_from([O.BinaryOp.Add, O.BinaryOp.Max, O.BinaryOp.Xor]))
def test_binary_refuses_exactly_what_numpy_refuses(a, b, op):
    want = numpy_shape(lambda: np.broadcast_shapes(a, b))
    assert poot_shape(O.Binary(op), [T(a, I32), T(b, I32)]) == want


@SETTINGS
@given(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=4, max_side=4))
def test_select_broadcasts_like_numpy(bs):
    c, t, f = bs.input_shapes
    out = O.Select().infer([T(c, I32), T(t, DType.BF16), T(f, DType.BF16)])
    assert out == T(np.broadcast_shapes(c, t, f), DType.BF16)


@SETTINGS
@given(shapes, shapes, shapes)
def test_select_refuses_what_numpy_where_refuses(c, t, f):
    want = numpy_shape(lambda: np.where(np.empty(c, bool), empty(t), empty(f)).shape)
    assert poot_shape(O.Select(), [T(c, I32), T(t), T(f)]) == want


@SETTINGS
@given(shapes, st.sampled_from(list(DType)), st.sampled_from(list(DType)))
def test_cast_keeps_shape_changes_dtype(shape, src, to):
    assert O.Cast(to).infer([T(shape, src)]) == T(shape, to)
    assert O.Cast(to.value).to is to


_FLOATS = [d for d in DType if d.is_float]


@pytest.mark.parametrize("dtype", list(DType), ids=str)
@pytest.mark.parametrize("op", list(O.UnaryOp), ids=lambda o: o.name)
def test_unary_dtype_table(op, dtype):
    if op in (O.UnaryOp.Not, O.UnaryOp.Clz):
        allowed = dtype in (I32, U32)
    elif op is O.UnaryOp.Neg:
        allowed = dtype.is_float or dtype is I32
    else:
        allowed = dtype.is_float
    if allowed:
        assert O.Unary(op).infer([T((2, 3), dtype)]) == T((2, 3), dtype)
    else:
        with pytest.raises(DtypeError, match=rf"^Unary: .*{dtype}"):
            O.Unary(op).infer([T((2, 3), dtype)])


@pytest.mark.parametrize("dtype", list(DType), ids=str)
@pytest.mark.parametrize("op", list(O.BinaryOp), ids=lambda o: o.name)
def test_binary_dtype_table(op, dtype):
    bitwise = op in (O.BinaryOp.GeU, O.BinaryOp.And, O.BinaryOp.Or, O.BinaryOp.Xor,
                     O.BinaryOp.Shl, O.BinaryOp.Shr)
    if not bitwise or dtype in (I32, U32):
        out = O.Binary(op).infer([T((3,), dtype), T((1,), dtype)])
        assert out == T((3,), I32 if op in (O.BinaryOp.Ge, O.BinaryOp.GeU) else dtype)
    else:
        with pytest.raises(DtypeError, match="^Binary: "):
            O.Binary(op).infer([T((3,), dtype), T((1,), dtype)])


def test_binary_refuses_mixed_dtypes_and_names_a_fix():
    with pytest.raises(DtypeError, match=r"Binary: operand dtypes differ \(f32 vs bf16\); "
                                         r"insert a Cast"):
        O.Binary(O.BinaryOp.Add).infer([T((2,)), T((2,), DType.BF16)])


def test_select_dtype_rules():
    with pytest.raises(DtypeError, match="Select: condition dtype f32"):
        O.Select().infer([T((2,)), T((2,)), T((2,))])
    with pytest.raises(DtypeError, match="Select: branches have different dtypes"):
        O.Select().infer([T((2,), I32), T((2,)), T((2,), DType.F16)])
    for d in (F32, DType.F16, DType.BF16, I32):
        assert O.Select().infer([T((2,), I32), T((2,), d), T((), d)]) == T((2,), d)


@pytest.mark.parametrize("op", [O.Unary(O.UnaryOp.Exp), O.Binary(O.BinaryOp.Add), O.Select(),
                                O.Cast(F32), O.MatMul(), O.Gather(0), O.ArgTopK(1)],
                         ids=lambda o: o.name)
def test_wrong_operand_count_is_a_shape_error(op):
    with pytest.raises(ShapeError, match=rf"^{op.name} takes \d operands, got 5"):
        op.infer([T((2, 2), I32)] * 5)


# -- shape ops -------------------------------------------------------------------------------
@st.composite
def broadcast_pairs(draw):
    target = draw(shapes)
    k = draw(st.integers(0, len(target)))
    src = [d if draw(st.booleans()) else 1 for d in target[len(target) - k:]]
    if draw(st.booleans()) and src:  # sometimes break it
        src[draw(st.integers(0, len(src) - 1))] = draw(st.integers(0, 5))
    if draw(st.booleans()):
        src = [1] + src if draw(st.booleans()) else src + [2]
    return tuple(src), target


@SETTINGS
@given(broadcast_pairs())
def test_broadcast_like_numpy_broadcast_to(pair):
    src, target = pair
    want = numpy_shape(lambda: np.broadcast_to(empty(src), target).shape)
    assert poot_shape(O.Broadcast(target), [T(src)]) == want


@SETTINGS
@given(nonempty_shapes, st.data())
def test_reshape_like_numpy(shape, data):
    n = math.prod(shape)
    divs = [d for d in range(1, n + 1) if n % d == 0]
    a = data.draw(st.sampled_from(divs))
    new = data.draw(st.sampled_from([(n,), (a, n // a), (n // a, 1, a), (1, n), (n + 1,),
                                     (a, n // a + 1)]))
    want = numpy_shape(lambda: np.reshape(empty(shape), new).shape)
    assert poot_shape(O.Reshape(new), [T(shape)]) == want


@SETTINGS
@given(shapes, st.data())
def test_transpose_like_numpy(shape, data):
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    assert O.Transpose(perm).infer([T(shape)]).shape == np.transpose(empty(shape), perm).shape
    bad = data.draw(st.sampled_from([perm + (len(shape),), perm[:-1], (0,) * (len(shape) + 1)]))
    assume(sorted(bad) != list(range(len(shape))))
    with pytest.raises(ShapeError, match="^Transpose: perm"):
        O.Transpose(bad).infer([T(shape)])


@SETTINGS
@given(shapes, st.integers(-5, 4), st.integers(-1, 6), st.integers(-1, 6))
def test_slice_like_numpy(shape, axis, start, end):
    def np_slice():
        a = np.empty(shape)
        ax = axis + a.ndim if axis < 0 else axis
        if not 0 <= ax < a.ndim or not 0 <= start <= end <= a.shape[ax]:
            raise IndexError  # poot's rule: a contiguous in-bounds range on a real axis
        idx = [slice(None)] * a.ndim
        idx[ax] = slice(start, end)
        return a[tuple(idx)].shape
    assert poot_shape(O.Slice(axis, start, end), [T(shape)]) == numpy_shape(np_slice)


@SETTINGS
@given(nonempty_shapes, st.integers(-4, 3), st.lists(st.integers(0, 4), min_size=1, max_size=4),
       st.booleans())
def test_concat_like_numpy(shape, axis, sizes, perturb):
    assume(-len(shape) <= axis < len(shape))
    ax = axis % len(shape)
    parts = [tuple(shape[:ax]) + (n,) + tuple(shape[ax + 1:]) for n in sizes]
    if perturb and len(shape) > 1:
        off = (ax + 1) % len(shape)
        p = list(parts[-1])
        p[off] += 1
        parts[-1] = tuple(p)
    want = numpy_shape(lambda: np.concatenate([empty(p) for p in parts], axis).shape)
    assert poot_shape(O.Concat(axis), [T(p) for p in parts]) == want


@SETTINGS
@given(shapes, shapes, st.integers(-4, 4))
def test_gather_like_numpy_take(src, idx, axis):
    def np_take():  # the output shape does not depend on the indexed axis's size
        a = np.empty(tuple(max(d, 1) if i == axis % max(len(src), 1) else d
                           for i, d in enumerate(src)))
        return np.take(a, np.zeros(idx, np.intp), axis=axis).shape
    want = numpy_shape(np_take)
    if len(src) == 0:
        want = None  # numpy takes from a flattened scalar without an axis; poot needs an axis
    assert poot_shape(O.Gather(axis), [T(src), T(idx, I32)]) == want


@SETTINGS
@given(shapes, st.integers(-4, 4), st.booleans(), st.sampled_from(list(O.ReduceOp)))
def test_reduce_like_numpy(shape, axis, keepdim, op):
    fn = np.sum if op is O.ReduceOp.Sum else np.max  # numpy's max of nothing is refused too
    want = numpy_shape(lambda: fn(empty(shape), axis=axis, keepdims=keepdim).shape)
    if len(shape) == 0:
        want = None  # numpy reduces a scalar over axis 0 or -1; there is no axis to reduce
    assert poot_shape(O.Reduce(op, axis, keepdim), [T(shape)]) == want


@SETTINGS
@given(hnp.mutually_broadcastable_shapes(signature="(m,k),(k,n)->(m,n)",
                                         max_dims=3, max_side=4))
def test_matmul_like_numpy(bs):
    a, b = bs.input_shapes
    want = np.matmul(empty(a), empty(b)).shape
    assert O.MatMul().infer([T(a), T(b)]) == T(want)


@SETTINGS
@given(shapes, shapes)
def test_matmul_refuses_what_numpy_refuses_and_vectors(a, b):
    want = numpy_shape(lambda: np.matmul(empty(a), empty(b)).shape)
    if len(a) < 2 or len(b) < 2:
        want = None  # GEMV is [1, K] @ [K, N]: rank-1 operands are refused, not promoted
    assert poot_shape(O.MatMul(), [T(a), T(b)]) == want


@SETTINGS
@given(st.integers(1, 4), st.integers(0, 4), st.integers(1, 4), st.integers(1, 3))
def test_indexed_matmul_rule(m, k, n, e):
    out = O.IndexedMatMul().infer([T((m, k)), T((e, k, n)), T((m,), I32)])
    x, w, idx = empty((m, k)), empty((e, k, n)), np.zeros(m, np.intp)
    assert out == T(np.einsum("mk,mkn->mn", x, w[idx]).shape)
    for bad in ([T((m, k + 1)), T((e, k, n)), T((m,), I32)],
                [T((m, k)), T((e, k, n)), T((m + 1,), I32)],
                [T((m, k)), T((k, n)), T((m,), I32)]):
        with pytest.raises(ShapeError, match="^IndexedMatMul: expected x"):
            O.IndexedMatMul().infer(bad)
    with pytest.raises(DtypeError, match="^IndexedMatMul: idx dtype f32"):
        O.IndexedMatMul().infer([T((m, k)), T((e, k, n)), T((m,))])


@SETTINGS
@given(nonempty_shapes, st.integers(1, 6))
def test_argtopk_rule(shape, k):
    if k <= shape[-1]:
        want = np.argsort(empty(shape), axis=-1)[..., :k].shape
        assert O.ArgTopK(k).infer([T(shape)]) == T(want, I32)
    else:
        with pytest.raises(ShapeError, match=rf"^ArgTopK: k={k} must be in \[1, {shape[-1]}\]"):
            O.ArgTopK(k).infer([T(shape)])


@SETTINGS
@given(nonempty_shapes, st.integers(0, 6), st.integers(0, 6))
def test_scatter_update_rule(base, n, bad_rows):
    src = (n,) + base[1:]
    assert O.ScatterUpdate().infer([T(base), T(src), T((n,), I32)]) == T(base)
    with pytest.raises(ShapeError, match=r"^ScatterUpdate: slots must be"):
        O.ScatterUpdate().infer([T(base), T(src), T((n + 1,), I32)])
    if bad_rows != n:
        with pytest.raises(ShapeError, match="^ScatterUpdate: src rows must match base rows"):
            O.ScatterUpdate().infer([T(base), T((n,) + base[1:] + (1,)), T((n,), I32)])
    with pytest.raises(DtypeError, match="^ScatterUpdate: slots dtype u32"):
        O.ScatterUpdate().infer([T(base), T(src), T((n,), U32)])
    with pytest.raises(DtypeError, match="^ScatterUpdate: src and base dtypes differ"):
        O.ScatterUpdate().infer([T(base), T(src, DType.F16), T((n,), I32)])


@SETTINGS
@given(nonempty_shapes, st.data())
def test_dynamic_update_slice_rule(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ax = axis % len(shape)
    u = list(shape)
    u[ax] = data.draw(st.integers(0, shape[ax]))
    op = O.DynamicUpdateSlice(axis)
    for idx in [T((), I32), T((1,), I32), T((1, 1), I32)]:
        assert op.infer([T(shape), T(u), idx]) == T(shape)
    with pytest.raises(ShapeError, match="^DynamicUpdateSlice: index must hold one element"):
        op.infer([T(shape), T(u), T((2,), I32)])
    u[ax] = shape[ax] + 1
    with pytest.raises(ShapeError, match="^DynamicUpdateSlice: update"):
        op.infer([T(shape), T(u), T((), I32)])
    with pytest.raises(ShapeError, match="^DynamicUpdateSlice: update"):
        op.infer([T(shape), T(shape + (1,)), T((), I32)])


@SETTINGS
@given(shapes, st.integers(-4, 4), st.sampled_from([F32, I32, DType.F16]))
def test_iota_rule(shape, axis, dtype):
    op = O.Iota(shape, axis, dtype)
    if not -len(shape) <= axis < len(shape):
        with pytest.raises(ShapeError, match="^Iota: axis"):
            op.infer([])
    elif dtype is DType.F16:
        with pytest.raises(DtypeError, match="^Iota: Iota makes F32 or I32 ranges"):
            op.infer([])
    else:
        assert op.infer([]) == T(shape, dtype)


@pytest.mark.parametrize("op", [O.Reduce(O.ReduceOp.Sum, 0), O.Slice(0, 0, 0), O.Concat(0),
                                O.Gather(0), O.DynamicUpdateSlice(0), O.AllGather(1, 0),
                                O.ArgTopK(1)], ids=lambda o: o.name)
def test_an_axis_of_a_scalar_is_refused(op):
    ins = {"Gather": [T(()), T((2,), I32)], "Concat": [T(()), T(())],
           "DynamicUpdateSlice": [T(()), T(()), T((), I32)]}.get(op.name, [T(())])
    with pytest.raises(ShapeError, match=f"^{op.name}: "):
        op.infer(ins)


def test_packed_dequant_checks_sources_by_role():
    w = PackedWeight("dense:f16words", (4, 6))
    op = O.PackedDequant(w)
    assert op.infer([T((4, 3), U32)]) == T((4, 6), F32)
    with pytest.raises(ShapeError, match=r"^PackedDequant: source 'words' must be u32\[4,3\]"):
        op.infer([T((4, 6), U32)])
    with pytest.raises(ShapeError, match=r"^PackedDequant: dense:f16words takes 1 sources"):
        op.infer([T((4, 3), U32)] * 2)


def test_tensor_type_refuses_bad_shapes_and_dtypes():
    with pytest.raises(ShapeError, match="negative dimension"):
        TensorType((2, -1), F32)
    with pytest.raises(ShapeError, match="must hold integers"):
        TensorType((2.5,), F32)
    with pytest.raises(DtypeError, match=r"unknown dtype 'f64'; known dtypes: f32, f16, bf16"):
        TensorType((2,), "f64")
    assert TensorType((np.int64(3),), "bf16") == T((3,), DType.BF16)


def test_dtype_parse_names_the_known_dtypes():
    for d in DType:
        assert DType.parse(d.value) is d and DType.parse(d.value.upper()) is d
        assert DType.of(np.zeros(1, d.numpy)) is d
    with pytest.raises(DtypeError, match=r"^unknown dtype 'f64'; known dtypes: f32, f16, bf16, "
                                         r"f8e4m3, f8e5m2"):
        DType.parse("f64")
    with pytest.raises(DtypeError, match="numpy dtype float64 has no poot DType; cast it first"):
        DType.of(np.zeros(1))
    with pytest.raises(DtypeError, match="numpy dtype bool has no poot DType"):
        DType.of(np.zeros(1, bool))
