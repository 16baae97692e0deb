"""The oracle against numpy formulas written here, op by op, on fresh random inputs: every
primitive, the integer and bit semantics, Select's bit-for-bit choice, Cast's rounding, and
the typed refusals at bind and evaluation time."""
from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import poot
import poot.ops
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poot.dtypes import DType
from poot.errors import BindError, OutOfRange, PootError, SlotRangeError
from poot.formats import PackedWeight
from poot.ir import Builder, Lit, SlotKind, TensorType
from poot.ir import ops as O

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
U, B = O.UnaryOp, O.BinaryOp


def ev(op, *args):
    """Evaluate one op on arrays (bound as consts) and Lits; return its result."""
    b = Builder(op.name, compiler=True)
    operands, arrays = [], []
    for i, a in enumerate(args):
        if isinstance(a, Lit):
            operands.append(a)
        else:
            a = np.asarray(a)
            operands.append(b.const(TensorType(a.shape, DType.of(a)), f"a{i}"))
            arrays.append(a)
    b.result(b.eqn(op, *operands))
    g = b.finish()
    copies = [a.copy() for a in arrays]
    (out,) = poot.evaluate(g, arrays)
    for a, c in zip(arrays, copies, strict=True):  # the oracle never writes its inputs
        np.testing.assert_array_equal(np.ascontiguousarray(a).reshape(-1).view(np.uint8),
                                      c.reshape(-1).view(np.uint8))
    assert out.dtype == g.type_of(g.result()).dtype.numpy
    assert out.shape == g.type_of(g.result()).shape
    return out


def f32(x):
    return np.asarray(x, np.float32)


# -- unary ---------------------------------------------------------------------------------
UNARY_F64 = {U.Neg: lambda x: -x, U.Exp: np.exp, U.Log: np.log, U.Sqrt: np.sqrt,
             U.Recip: lambda x: 1.0 / x, U.Tanh: np.tanh,
             U.Erf: np.vectorize(math.erf, otypes=[np.float64])}


@pytest.mark.parametrize("op", list(UNARY_F64), ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=str)
def test_unary_float(op, dtype, rand):
    x = rand((3, 5), dtype)
    if op in (U.Log, U.Sqrt):
        x = np.abs(x)
    got = ev(O.Unary(op), x)
    want = UNARY_F64[op](x.astype(np.float64))
    if dtype is F32:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    else:  # computed in f32, rounded once to the narrow dtype: within half an ulp of f64
        np.testing.assert_allclose(got.astype(np.float64), want,
                                   rtol=2.0 ** -(8 if dtype is BF16 else 11), atol=1e-6)


def test_unary_float_specials():
    x = f32([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(ev(O.Unary(U.Recip), x),
                                      f32([np.inf, -np.inf, 0, -0.0, np.nan, -1]))
        np.testing.assert_array_equal(ev(O.Unary(U.Log), x),
                                      f32([-np.inf, -np.inf, np.inf, np.nan, np.nan, np.nan]))
        np.testing.assert_allclose(ev(O.Unary(U.Exp), x),
                                   f32([1, 1, np.inf, 0, np.nan, math.exp(-1)]), rtol=1e-7)


def test_unary_int(rand):
    x = rand((40,), I32, lo=-2 ** 31, hi=2 ** 31 - 1)
    x[:4] = [0, -1, 2 ** 31 - 1, -2 ** 31]
    np.testing.assert_array_equal(ev(O.Unary(U.Not), x), -x.astype(np.int64) - 1)
    np.testing.assert_array_equal(ev(O.Unary(U.Neg), x),
                                  ((-x.astype(np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31))
    clz = [32 - int(v).bit_length() for v in x.astype(np.int64) % 2 ** 32]
    np.testing.assert_array_equal(ev(O.Unary(U.Clz), x), clz)
    assert list(ev(O.Unary(U.Clz), x[:4])) == [32, 0, 1, 0]
    u = x.view(np.uint32)
    np.testing.assert_array_equal(ev(O.Unary(U.Clz), u),
                                  [32 - int(v).bit_length() for v in u])
    np.testing.assert_array_equal(ev(O.Unary(U.Not), u), 0xFFFFFFFF - u.astype(np.int64))


# -- binary --------------------------------------------------------------------------------
BIN_F64 = {B.Add: np.add, B.Sub: np.subtract, B.Mul: np.multiply, B.Div: np.divide,
           B.Max: np.maximum}


@settings(max_examples=60, deadline=None)
@given(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4),
       st.sampled_from(list(BIN_F64)), st.sampled_from([F32, F16, BF16]), st.integers(0, 2 ** 32))
def test_binary_float_is_the_exact_result_rounded_once(shapes, op, dtype, seed):
    """f64 holds every exact +,-,*,max of these dtypes and rounds a quotient innocuously
    (53 >= 2*24+2 bits), so f64-then-dtype rounding is the one correct rounding."""
    rng = np.random.default_rng(seed)
    a, b = (random_floats(rng, s, dtype) for s in shapes.input_shapes)
    got = ev(O.Binary(op), a, b)
    assert got.shape == shapes.result_shape
    with np.errstate(all="ignore"):
        want = BIN_F64[op](a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_array_equal(got, want.astype(np.float32).astype(dtype.numpy))


def random_floats(rng, shape, dtype):
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-8, 8, shape))
    return np.where(x == 0, 1.0, x).astype(np.float32).astype(dtype.numpy)


def test_binary_with_literal_and_ge(rand):
    a = rand((6,))
    np.testing.assert_allclose(ev(O.Binary(B.Mul), a, Lit(0.25, F32)), a * 0.25)
    np.testing.assert_allclose(ev(O.Binary(B.Sub), Lit(1.5, F32), a), 1.5 - a.astype(np.float64),
                               rtol=1e-6)
    b = a.copy()
    b[::2] += 1
    got = ev(O.Binary(B.Ge), a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, (a >= b).astype(np.int32))
    assert list(ev(O.Binary(B.Ge), f32([np.nan, 1, np.inf]), f32([1, np.nan, np.inf]))) == \
        [0, 0, 1]


def wrap32(x):
    return ((np.asarray(x, np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)


def test_int_arithmetic_wraps(rand):
    a = rand((64,), I32, lo=-2 ** 31, hi=2 ** 31 - 1)
    b = rand((64,), I32, lo=-2 ** 31, hi=2 ** 31 - 1)
    a64, b64 = a.astype(object), b.astype(object)  # exact Python integers
    for op, fn in [(B.Add, lambda x, y: x + y), (B.Sub, lambda x, y: x - y),
                   (B.Mul, lambda x, y: x * y)]:
        want = [((int(v) + 2 ** 31) % 2 ** 32) - 2 ** 31 for v in fn(a64, b64)]
        np.testing.assert_array_equal(ev(O.Binary(op), a, b), want)
    np.testing.assert_array_equal(ev(O.Binary(B.Max), a, b), np.maximum(a, b))
    big = np.array([2 ** 31 - 1], np.int32)
    assert ev(O.Binary(B.Add), big, np.array([1], np.int32))[0] == -2 ** 31
    ua = a.view(np.uint32)
    ub = b.view(np.uint32)
    np.testing.assert_array_equal(ev(O.Binary(B.Mul), ua, ub),
                                  [int(x) * int(y) % 2 ** 32
                                   for x, y in zip(ua, ub, strict=True)])


def test_int_div_truncates_and_division_by_zero_is_zero(rand):
    a = rand((200,), I32, lo=-1000, hi=1000)
    b = rand((200,), I32, lo=-20, hi=20, zero_ok=True)
    b[:3] = 0
    want = [0 if y == 0 else int(math.copysign(abs(int(x)) // abs(int(y)), 1)) *
            (1 if (x < 0) == (y < 0) else -1) for x, y in zip(a, b, strict=True)]
    np.testing.assert_array_equal(ev(O.Binary(B.Div), a, b), want)
    cases = np.array([7, -7, 7, -7, 5, -2 ** 31], np.int32)
    divs = np.array([2, 2, -2, -2, 0, -1], np.int32)
    # truncation toward zero; x/0 = 0; INT_MIN / -1 wraps to INT_MIN
    assert list(ev(O.Binary(B.Div), cases, divs)) == [3, -3, -3, 3, 0, -2 ** 31]
    u = np.array([7, 2 ** 32 - 1, 9], np.uint32)
    assert list(ev(O.Binary(B.Div), u, np.array([2, 2, 0], np.uint32))) == \
        [3, 2 ** 31 - 1, 0]


def test_bitwise_and_unsigned_compare(rand):
    a = rand((100,), I32, lo=-2 ** 31, hi=2 ** 31 - 1)
    b = rand((100,), I32, lo=-2 ** 31, hi=2 ** 31 - 1)
    au, bu = a.view(np.uint32).astype(np.int64), b.view(np.uint32).astype(np.int64)
    np.testing.assert_array_equal(ev(O.Binary(B.And), a, b).view(np.uint32), au & bu)
    np.testing.assert_array_equal(ev(O.Binary(B.Or), a, b).view(np.uint32), au | bu)
    np.testing.assert_array_equal(ev(O.Binary(B.Xor), a, b).view(np.uint32), au ^ bu)
    np.testing.assert_array_equal(ev(O.Binary(B.GeU), a, b), (au >= bu).astype(np.int32))
    assert list(ev(O.Binary(B.GeU), np.array([-1, 0], np.int32), np.array([1, -1], np.int32))) \
        == [1, 0]  # -1 is 0xFFFFFFFF unsigned


def test_shifts_wrap_and_define_large_amounts(rand):
    a = rand((300,), I32, lo=-2 ** 31, hi=2 ** 31 - 1)
    s = rand((300,), I32, lo=-40, hi=70, zero_ok=True)
    word = a.view(np.uint32).astype(np.int64)
    amt = s.view(np.uint32).astype(np.int64)  # the amount read as an unsigned word
    shl = np.where(amt >= 32, 0, (word << np.minimum(amt, 63)) % 2 ** 32)
    np.testing.assert_array_equal(ev(O.Binary(B.Shl), a, s).view(np.uint32), shl)
    sar = np.where(amt >= 32, np.where(a < 0, -1, 0), a.astype(np.int64) >> np.minimum(amt, 63))
    np.testing.assert_array_equal(ev(O.Binary(B.Shr), a, s), sar)  # I32: arithmetic
    shr = np.where(amt >= 32, 0, word >> np.minimum(amt, 63))
    np.testing.assert_array_equal(ev(O.Binary(B.Shr), a.view(np.uint32), s.view(np.uint32)),
                                  shr)  # U32: logical
    x = np.array([-8, -8, 1, 1, -1, 3], np.int32)
    n = np.array([1, 32, 31, 32, 33, -1], np.int32)
    assert list(ev(O.Binary(B.Shr), x, n)) == [-4, -1, 0, 0, -1, 0]
    assert list(ev(O.Binary(B.Shl), x, n)) == [-16, 0, -2 ** 31, 0, 0, 0]
    assert list(ev(O.Binary(B.Shr), x.view(np.uint32), n.view(np.uint32))) == \
        [2 ** 31 - 4, 0, 0, 0, 0, 0]


# -- Select ----------------------------------------------------------------------------------
def nan_payloads(dtype, n, rng):
    """An array of `dtype` whose entries are NaNs with assorted payloads and +-Inf."""
    width = np.dtype(dtype.numpy).itemsize * 8
    exp_bits = {32: 8, 16: 5 if dtype is F16 else 8}[width]
    man = width - 1 - exp_bits
    ubits = {32: np.uint32, 16: np.uint16}[width]
    sign = rng.integers(0, 2, n).astype(np.uint64) << (width - 1)
    payload = rng.integers(1, 2 ** man, n).astype(np.uint64)
    bits = sign | (((1 << exp_bits) - 1) << man) | payload
    bits[::5] = (((1 << exp_bits) - 1) << man) | (sign[::5])  # some Infs
    return bits.astype(ubits).view(dtype.numpy)


@pytest.mark.parametrize("dtype", [F32, F16, BF16, I32], ids=str)
def test_select_moves_the_chosen_element_bit_for_bit(dtype, rng, rand, as_bits):
    n = 64
    if dtype is I32:
        t, f = rand((n,), I32, lo=-2 ** 31, hi=2 ** 31 - 1), rand((n,), I32)
    else:
        t = rand((n,), dtype)
        f = nan_payloads(dtype, n, rng)
        assert np.isnan(f.astype(np.float32)).sum() > n // 2
    cond = rng.integers(-3, 3, n).astype(np.int32)  # nonzero (also negative) picks if_true
    got = ev(O.Select(), cond, t, f)
    want_bits = np.where(cond != 0, as_bits(t), as_bits(f))
    np.testing.assert_array_equal(as_bits(got), want_bits)
    if dtype is not I32:
        assert not np.isnan(got[cond != 0].astype(np.float32)).any()
        # and the other way round: NaN payloads in the chosen branch survive untouched
        got2 = ev(O.Select(), cond, f, t)
        np.testing.assert_array_equal(as_bits(got2), np.where(cond != 0, as_bits(f), as_bits(t)))


def test_select_broadcasts_and_takes_literals(rng, rand):
    cond = rng.integers(0, 2, (3, 1)).astype(np.int32)
    x = rand((3, 4))
    got = ev(O.Select(), cond, x, Lit(float("-inf"), F32))
    np.testing.assert_array_equal(got, np.where(cond != 0, x, -np.inf))


# -- Cast ------------------------------------------------------------------------------------
def bf16_rne_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 round to nearest even, on the bits (quiet NaN kept a NaN)."""
    u = x.view(np.uint32).astype(np.uint64)
    lsb = (u >> 16) & 1
    r = ((u + 0x7FFF + lsb) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def test_cast_f32_to_bf16_rounds_to_nearest_even(rng, as_bits):
    x = (rng.standard_normal(4096) * np.exp(rng.uniform(-30, 30, 4096))).astype(np.float32)
    got = ev(O.Cast(BF16), x)
    np.testing.assert_array_equal(as_bits(got), bf16_rne_bits(x))
    np.testing.assert_array_equal(as_bits(got), as_bits(x.astype(ml_dtypes.bfloat16)))


def test_cast_f32_to_bf16_ties_go_to_even(rng, as_bits):
    hi = rng.integers(0, 2 ** 16, 2048).astype(np.uint32)
    hi = hi[((hi >> 7) & 0xFF) != 0xFF]  # finite
    tie = ((hi << 16) | 0x8000).view(np.float32)   # exactly half way
    below = ((hi << 16) | 0x7FFF).view(np.float32)
    above = ((hi << 16) | 0x8001).view(np.float32)
    even_up = np.where(hi & 1, hi + 1, hi).astype(np.uint16)
    assert (hi & 1).any() and (~hi & 1).any()
    np.testing.assert_array_equal(as_bits(ev(O.Cast(BF16), tie)), even_up)
    np.testing.assert_array_equal(as_bits(ev(O.Cast(BF16), below)), hi.astype(np.uint16))
    np.testing.assert_array_equal(as_bits(ev(O.Cast(BF16), above)), (hi + 1).astype(np.uint16))
    np.testing.assert_array_equal(as_bits(ev(O.Cast(BF16), tie)),
                                  as_bits(tie.astype(ml_dtypes.bfloat16)))
    specials = np.array([np.inf, -np.inf, 0.0, -0.0, 3.4e38, 1e-45], np.float32)
    got = ev(O.Cast(BF16), specials).astype(np.float32)
    assert list(got[:4]) == [np.inf, -np.inf, 0, 0] and got[4] == np.inf  # rounds past max
    assert np.signbit(got[3]) and np.isnan(ev(O.Cast(BF16), f32([np.nan])).astype(np.float32))


@pytest.mark.parametrize("to", [DType.F8E4M3, DType.F8E5M2, F16], ids=str)
def test_cast_f32_to_narrow_floats_matches_ml_dtypes(to, rng, as_bits):
    x = (rng.standard_normal(2048) * np.exp(rng.uniform(-12, 12, 2048))).astype(np.float32)
    ref = x.astype(to.numpy)
    np.testing.assert_array_equal(as_bits(ev(O.Cast(to), x)), as_bits(ref))
    # round trip through f32 is the identity on every representable value
    back = ev(O.Cast(F32), ref)
    np.testing.assert_array_equal(as_bits(ev(O.Cast(to), back)), as_bits(ref))


def test_cast_between_narrow_floats_widens_exactly_first(rand, as_bits):
    x = rand((500,), BF16, scale=100)
    np.testing.assert_array_equal(as_bits(ev(O.Cast(F16), x)),
                                  as_bits(x.astype(np.float32).astype(np.float16)))


def test_cast_float_to_int_truncates_and_saturates():
    x = f32([2.7, -2.7, 0.5, -0.5, 3e9, -3e9, np.inf, -np.inf, np.nan, 1e6])
    assert list(ev(O.Cast(I32), x)) == [2, -2, 0, 0, 2 ** 31 - 1, -2 ** 31, 2 ** 31 - 1,
                                        -2 ** 31, 0, 1000000]
    assert list(ev(O.Cast(DType.U8), x)) == [2, 0, 0, 0, 255, 0, 255, 0, 0, 255]


def test_cast_int_to_int_wraps_and_int_to_float(rand):
    x = rand((100,), I32, lo=-2 ** 31, hi=2 ** 31 - 1)
    np.testing.assert_array_equal(ev(O.Cast(DType.U8), x), x.astype(np.int64) % 256)
    np.testing.assert_array_equal(ev(O.Cast(U32), x), x.astype(np.int64) % 2 ** 32)
    np.testing.assert_array_equal(ev(O.Cast(DType.I8), x),
                                  (x.astype(np.int64) + 128) % 256 - 128)
    np.testing.assert_array_equal(ev(O.Cast(F32), x), x.astype(np.float64).astype(np.float32))


# -- shape and data movement -----------------------------------------------------------------
def test_shape_ops(rand):
    x = rand((2, 1, 3))
    np.testing.assert_array_equal(ev(O.Broadcast((4, 2, 5, 3)), x),
                                  np.broadcast_to(x, (4, 2, 5, 3)))
    np.testing.assert_array_equal(ev(O.Reshape((3, 2)), x), x.reshape(3, 2))
    np.testing.assert_array_equal(ev(O.Transpose((2, 0, 1)), x), x.transpose(2, 0, 1))
    y = rand((4, 6, 2))
    np.testing.assert_array_equal(ev(O.Slice(1, 2, 5), y), y[:, 2:5])
    np.testing.assert_array_equal(ev(O.Slice(-1, 1, 2), y), y[..., 1:2])
    z = rand((4, 3, 2))
    np.testing.assert_array_equal(ev(O.Concat(1), y, z), np.concatenate([y, z], 1))
    np.testing.assert_array_equal(ev(O.Concat(-1), y, y, y), np.concatenate([y] * 3, -1))


def test_iota():
    np.testing.assert_array_equal(ev(O.Iota((3, 4), 1, I32)),
                                  np.tile(np.arange(4, dtype=np.int32), (3, 1)))
    np.testing.assert_array_equal(ev(O.Iota((3, 4), -2, F32)),
                                  np.tile(np.arange(3, dtype=np.float32)[:, None], (1, 4)))


def test_gather(rng, rand):
    src = rand((5, 4, 3))
    idx = rng.integers(0, 4, (2, 6)).astype(np.int32)
    got = ev(O.Gather(1), src, idx)
    want = np.empty((5, 2, 6, 3), np.float32)
    for i in range(2):
        for j in range(6):
            want[:, i, j] = src[:, idx[i, j]]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(OutOfRange, match=r"Gather: index 4 outside \[0, 4\)"):
        ev(O.Gather(1), src, np.array([0, 4], np.int32))
    with pytest.raises(OutOfRange, match=r"Gather: index -1 outside"):
        ev(O.Gather(0), src, np.array([-1], np.int32))


def test_scatter_update(rng, rand):
    base = rand((8, 2, 3))
    src = rand((5, 2, 3))
    slots = np.array([6, -1, 0, 6, 3], np.int32)  # -1 writes nothing; row 3 wins slot 6
    got = ev(O.ScatterUpdate(), base, src, slots)
    want = base.copy()
    for t, s in enumerate(slots):
        if s != -1:
            want[s] = src[t]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[6], src[3])
    np.testing.assert_array_equal(ev(O.ScatterUpdate(), base, src, np.full(5, -1, np.int32)),
                                  base)
    with pytest.raises(OutOfRange, match=r"ScatterUpdate: index 8 outside \[-1, 8\)"):
        ev(O.ScatterUpdate(), base, src, np.array([0, 1, 2, 3, 8], np.int32))
    with pytest.raises(OutOfRange, match=r"index -2"):
        ev(O.ScatterUpdate(), base, src, np.array([0, 1, -2, 3, 4], np.int32))


@pytest.mark.parametrize("index", [0, 3, 5, 7, -2])
def test_dynamic_update_slice_clamps_the_index(index, rand):
    x, upd = rand((3, 8, 2)), rand((3, 3, 2))
    got = ev(O.DynamicUpdateSlice(1), x, upd, np.array([index], np.int32))
    start = min(max(index, 0), 8 - 3)
    want = x.copy()
    want[:, start:start + 3] = upd
    np.testing.assert_array_equal(got, want)
    got0 = ev(O.DynamicUpdateSlice(-2), x, upd, np.array(index, np.int32))
    np.testing.assert_array_equal(got0, want)


def test_argtopk_is_stable_largest_first(rng):
    x = rng.integers(0, 4, (6, 9)).astype(np.float32)  # many ties
    got = ev(O.ArgTopK(4), x)
    want = [sorted(range(9), key=lambda j: (-x[r, j], j))[:4] for r in range(6)]
    np.testing.assert_array_equal(got, want)
    assert list(ev(O.ArgTopK(3), f32([1, 5, 5, 2, 5]))) == [1, 2, 4]
    xi = rng.integers(-5, 5, (4, 7)).astype(np.int32)
    np.testing.assert_array_equal(ev(O.ArgTopK(7), xi),
                                  [sorted(range(7), key=lambda j: (-xi[r, j], j))
                                   for r in range(4)])


@pytest.mark.parametrize("dtype", [F32, BF16, F16, I32], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce(dtype, keepdim, rand):
    x = rand((3, 7, 4), dtype)
    for axis in (0, 1, -1):
        s = ev(O.Reduce(O.ReduceOp.Sum, axis, keepdim), x)
        m = ev(O.Reduce(O.ReduceOp.Max, axis, keepdim), x)
        x64 = x.astype(np.float64)
        np.testing.assert_array_equal(m, np.max(x, axis=axis, keepdims=keepdim))
        want = np.sum(x64, axis=axis, keepdims=keepdim)
        if dtype is I32:
            np.testing.assert_array_equal(s, want)
        else:  # f32 accumulation, one rounding to the dtype
            np.testing.assert_allclose(s.astype(np.float64), want, rtol=2.0 ** -7, atol=1e-5)
            np.testing.assert_array_equal(
                s, np.sum(x.astype(np.float32), axis=axis, keepdims=keepdim,
                          dtype=np.float32).astype(dtype.numpy))


def test_integer_sums_wrap(rand):
    x = rand((5, 9), I32, lo=2 ** 30, hi=2 ** 31 - 1)
    want = (x.astype(object).sum(1) + 2 ** 31) % 2 ** 32 - 2 ** 31
    np.testing.assert_array_equal(ev(O.Reduce(O.ReduceOp.Sum, 1), x), want.astype(np.int64))
    u = rand((4, 7), DType.U8, lo=0, hi=256)
    np.testing.assert_array_equal(ev(O.Reduce(O.ReduceOp.Sum, 1), u),
                                  u.astype(np.int64).sum(1) % 256)


def test_matmul_batched_broadcast(rand):
    a, b = rand((2, 1, 3, 5)), rand((4, 5, 6))
    got = ev(O.MatMul(), a, b)
    want = np.einsum("xymk,ykn->xymn", np.broadcast_to(a, (2, 4, 3, 5)).astype(np.float64),
                     b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    gemv = ev(O.MatMul(), rand((1, 5)), rand((5, 3)))
    assert gemv.shape == (1, 3)


def test_matmul_bf16_accumulates_in_f32_and_rounds_once(rand):
    a, b = rand((3, 64), BF16), rand((64, 4), BF16)
    got = ev(O.MatMul(), a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=2.0 ** -7, atol=1e-3)
    np.testing.assert_array_equal(got, (a.astype(np.float32) @ b.astype(np.float32))
                                  .astype(ml_dtypes.bfloat16))


def test_matmul_int_wraps(rand):
    a = rand((2, 3), I32, lo=-2 ** 31, hi=2 ** 31 - 1)
    b = rand((3, 2), I32, lo=-2 ** 31, hi=2 ** 31 - 1)
    want = [[wrap32(sum(int(a[i, k]) * int(b[k, j]) for k in range(3)) % 2 ** 32)
             for j in range(2)] for i in range(2)]
    np.testing.assert_array_equal(ev(O.MatMul(), a, b), np.array(want).reshape(2, 2))


def test_indexed_matmul(rng, rand):
    x, w = rand((6, 5)), rand((3, 5, 4))
    idx = rng.integers(0, 3, 6).astype(np.int32)
    got = ev(O.IndexedMatMul(), x, w, idx)
    want = np.stack([x[m].astype(np.float64) @ w[idx[m]].astype(np.float64) for m in range(6)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(OutOfRange, match="IndexedMatMul: index 3"):
        ev(O.IndexedMatMul(), x, w, np.array([0, 1, 2, 3, 0, 0], np.int32))


def test_packed_dequant_f16_words(rand):
    w16 = rand((4, 6), F16)
    words = np.frombuffer(w16.astype("<f2").tobytes(), "<u4").reshape(4, 3)
    got = ev(O.PackedDequant(PackedWeight("dense:f16words", (4, 6))), words)
    np.testing.assert_array_equal(got, w16.astype(np.float32))
    # element k sits in the low half of word k // 2 when k is even
    lo = (words & 0xFFFF).astype(np.uint16).view(np.float16)
    np.testing.assert_array_equal(got[:, 0::2], lo.astype(np.float32))


# -- binding -----------------------------------------------------------------------------------
def slot_graph():
    def f(x, pos, wm, sm):
        return poot.ops.add(x, poot.ops.cast(poot.ops.add(poot.ops.add(pos, wm), sm), "f32"))
    return poot.trace(f, poot.spec((3,), name="x"),
                      poot.spec((1,), "i32", name="pos", kind="slot", slot="Pos", bound=16),
                      poot.spec((3,), "i32", name="wm", kind="slot", slot="WriteMap", bound=8),
                      poot.spec((3,), "i32", name="sm", kind="slot", slot=SlotKind.SLOT_MAP,
                                bound=8))


def test_bind_errors_name_the_input_and_the_fix(rand):
    g = slot_graph()
    ok = {"x": rand((3,)), "pos": np.array([15]), "wm": np.array([-1, 0, 7]),
          "sm": np.array([0, 7, 1], np.int32)}
    (out,) = poot.evaluate(g, ok)
    np.testing.assert_array_equal(out, ok["x"] + f32([14, 22, 23]))
    cases = [
        ({"x": rand((4,))}, BindError, r"input x \(%0\) expects shape \(3,\), got \(4,\)"),
        ({"x": rand((3,)).astype(np.float64)}, BindError,
         r"input x \(%0\) expects dtype f32, got numpy float64; cast it first"),
        ({"x": rand((3,), F16)}, BindError, "expects dtype f32, got numpy float16"),
        ({"pos": np.array([2 ** 40])}, BindError, "values do not fit i32"),
        ({"pos": np.array([16])}, SlotRangeError,
         r"input pos: Pos slot values must lie in \[0, 16\); got \[16, 16\]"),
        ({"pos": np.array([-1])}, SlotRangeError, r"Pos slot values must lie in \[0, 16\)"),
        ({"wm": np.array([-1, 8, 0])}, SlotRangeError,
         r"WriteMap slot values must lie in \[0, 8\) or be -1; got \[0, 8\]"),
        ({"wm": np.array([-2, 1, 0])}, SlotRangeError, "WriteMap"),
        ({"sm": np.array([-1, 1, 0])}, SlotRangeError, r"SlotMap slot values must lie in \[0, 8\)"),
        ({"nope": 1}, BindError, r"unknown input 'nope'; inputs are \['x', 'pos', 'wm', 'sm'\]"),
    ]
    for change, err, msg in cases:
        with pytest.raises(err, match=msg):
            poot.evaluate(g, {**ok, **change})
    with pytest.raises(BindError, match=r"input sm \(Slot\(SlotMap <8\), i32\[3\]\) is not bound"):
        poot.evaluate(g, {k: v for k, v in ok.items() if k != "sm"})
    with pytest.raises(BindError, match="graph f takes 4 inputs, got 3"):
        poot.evaluate(g, list(ok.values())[:3])
    assert issubclass(SlotRangeError, BindError) and issubclass(BindError, PootError)


def test_float_slot_roles_are_range_checked_as_floats():
    k = SlotKind.declare("TestSamplerTemperature", F32, 0, 2, owner="tests")
    g = poot.trace(lambda t: poot.ops.mul(t, 2.0),
                   poot.spec((2,), "f32", name="temp", kind="slot", slot=k))
    np.testing.assert_array_equal(poot.evaluate(g, [f32([0.0, 1.5])])[0], [0, 3])
    for bad in ([-0.5, 1.0], [1.0, 2.0], [np.nan, 1.0]):  # -0.5 is not truncated to 0
        with pytest.raises(SlotRangeError, match=r"TestSamplerTemperature slot values must lie "
                                                 r"in \[0, 2\)"):
            poot.evaluate(g, [f32(bad)])


def test_an_ambiguous_input_name_is_refused(rand):
    g = poot.trace(poot.ops.add, poot.spec((2,), name="x"), poot.spec((2,), name="x"))
    with pytest.raises(BindError, match=r"input name 'x' names 2 inputs \[%0, %1\]; bind them "
                                        r"by ValueId or in order"):
        poot.evaluate(g, {"x": rand((2,))})
    a, b = rand((2,)), rand((2,))
    np.testing.assert_array_equal(poot.evaluate(g, [a, b])[0], a + b)


def test_evaluate_by_value_id_and_sequence(rand):
    g = slot_graph()
    vals = [rand((3,)), np.array([1], np.int32), np.array([0, 1, 2], np.int32),
            np.array([3, 4, 5], np.int32)]
    by_seq = poot.evaluate(g, vals)
    by_id = poot.evaluate(g, dict(zip(g.inputs(), vals, strict=True)))
    np.testing.assert_array_equal(by_seq[0], by_id[0])


@pytest.mark.parametrize("view", [lambda w: w.T, lambda w: w[:, 3:].T,
                                  lambda w: np.broadcast_to(w, (2, *w.shape)).transpose(0, 2, 1)],
                         ids=["transposed", "sliced", "broadcast"])
def test_a_large_strided_operand_is_copied_as_it_is(rand, view):
    """The block-wise copy of a large transposed operand (a tied head's weight) is the
    operand, C-contiguous, so a contraction over it sums as over numpy's own copy."""
    from poot.oracle.rules import contiguous

    x = view(rand((1100, 1000)))
    got = contiguous(x)
    assert got.flags.c_contiguous and got.dtype == x.dtype and x.size >= 1 << 20
    np.testing.assert_array_equal(got, x)
    a = rand((3, x.shape[-2]))
    np.testing.assert_array_equal(np.matmul(a, got), np.matmul(a, np.ascontiguousarray(x)))
