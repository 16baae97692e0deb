"""Every scalar expression kind the WGSL printer lowers, on the device, against numpy."""
import zlib

import numpy as np
import pytest
from poot.codegen.expr import Bin, Bitcast, Cast, Const, Sel, Un
from poot.dtypes import DType
from poot.errors import DtypeLowering
from poot.ir.ops.elementwise import BinaryOp, UnaryOp
from poot_wgpu.exprcheck import assert_bits_equal, assert_close, inputs_for, load, run_exprs

N = 300
D = DType
INT_DTYPES = [D.I32, D.U32, D.I16, D.U16, D.I8, D.U8]
CAST_DTYPES = [D.F32, D.F16, D.BF16, *INT_DTYPES]


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))  # stable seed


@pytest.mark.parametrize("dtype", [D.F32, D.F16])
def test_float_unary(wgpu_device, rng, dtype):
    x = inputs_for(dtype, N, rng)
    x[7] = 1e-30  # lavapipe's log flushes subnormal inputs (Vulkan allows it): keep them out
    exprs = {op.name: Un(op, load("x", dtype)) for op in UnaryOp if not op.bitwise}
    results = run_exprs(wgpu_device, {"x": x}, exprs)
    assert_bits_equal(*results.pop("Neg"), f"Neg {dtype}")
    for name, (got, want) in results.items():
        # Vulkan allows exp 3 + 2|x| ulp (lavapipe: 3e-6 relative at x = 80); f16: one ulp
        rtol = (2e-5 if name == "Exp" else 2e-6) if dtype is D.F32 else 1e-3
        assert_close(got, want, f"{name} {dtype}", rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("dtype", [D.F32, D.F16])
def test_float_binary(wgpu_device, rng, dtype):
    a, b = inputs_for(dtype, N, rng), inputs_for(dtype, N, rng)[::-1].copy()
    ops = [BinaryOp.Add, BinaryOp.Sub, BinaryOp.Mul, BinaryOp.Div, BinaryOp.Max, BinaryOp.Ge]
    exprs = {op.name: Bin(op, load("a", dtype), load("b", dtype)) for op in ops}
    for name, (got, want) in run_exprs(wgpu_device, {"a": a, "b": b}, exprs).items():
        if dtype is D.F32:  # Vulkan lets a device flush f32 subnormals (the H200's does)
            flushed = _oracle_flushed(exprs[name], a, b)
            got = np.where(_bits(got) == _bits(flushed), want, got)
        if name == "Div":
            # WGSL promises 2.5 ulp for |b| in [2^-126, 2^126] only (the H200 returns 0 for
            # -21.9 / 3e38); quotients near the subnormal range may flush
            domain = (np.abs(b.astype(np.float32)) >= 2.0**-126) & \
                (np.abs(b.astype(np.float32)) <= 2.0**126)
            tiny = 4 * float(np.finfo(np.float32).tiny)
            assert_close(got[domain], want[domain], f"{name} {dtype}",
                         rtol=3e-7 if dtype is D.F32 else 1e-3, atol=tiny)
        else:
            assert_bits_equal(got, want, f"{name} {dtype}")


def _bits(x):
    return x.view(np.uint32)


def _oracle_flushed(e, a, b):
    """The oracle's value of `e` with f32 subnormal inputs and results flushed to +-0."""
    def flush(x):
        x = np.asarray(x, np.float32).copy()
        tiny = (x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)
        x[tiny] = np.copysign(np.float32(0), x[tiny])
        return x

    from poot.codegen.expr import evaluate
    from poot.codegen.program import global_id

    env = {global_id().name: np.arange(a.size, dtype=np.int32)}
    out = np.asarray(evaluate(e, env, {"a": flush(a), "b": flush(b)}))
    return flush(out) if out.dtype == np.float32 else out.astype(np.float32)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_arithmetic_wraps_and_divides_by_zero_to_zero(wgpu_device, rng, dtype):
    a = inputs_for(dtype, N, rng)
    b = inputs_for(dtype, N, rng)[::-1].copy()
    b[10:40] = 0  # x / 0 = 0
    if dtype.is_signed:
        a[40:50], b[40:50] = np.iinfo(dtype.numpy).min, -1  # MIN / -1 wraps
        b[50:60] = rng.integers(-5, 5, 10)
    ops = [BinaryOp.Add, BinaryOp.Sub, BinaryOp.Mul, BinaryOp.Div, BinaryOp.Max, BinaryOp.Ge]
    exprs = {op.name: Bin(op, load("a", dtype), load("b", dtype)) for op in ops}
    if dtype in (D.I32, D.I16, D.I8):
        exprs["Neg"] = Un(UnaryOp.Neg, load("a", dtype))
    for name, (got, want) in run_exprs(wgpu_device, {"a": a, "b": b}, exprs).items():
        assert_bits_equal(got, want, f"{name} {dtype}")


@pytest.mark.parametrize("dtype", [D.I32, D.U32])
def test_bit_ops_and_shifts_past_the_word(wgpu_device, rng, dtype):
    a = inputs_for(dtype, N, rng)
    b = rng.integers(-40, 40, N).astype(np.int64).astype(dtype.numpy)  # >= 32 and negative
    b[:6] = [0, 31, 32, 33, 255, 1 << 20]
    a[N // 2:N // 2 + 3] = 0  # clz(0) = 32
    ops = [BinaryOp.And, BinaryOp.Or, BinaryOp.Xor, BinaryOp.Shl, BinaryOp.Shr, BinaryOp.GeU]
    exprs = {op.name: Bin(op, load("a", dtype), load("b", dtype)) for op in ops}
    exprs.update({op.name: Un(op, load("a", dtype)) for op in (UnaryOp.Not, UnaryOp.Clz)})
    for name, (got, want) in run_exprs(wgpu_device, {"a": a, "b": b}, exprs).items():
        assert_bits_equal(got, want, f"{name} {dtype}")


@pytest.mark.parametrize("src", CAST_DTYPES)
def test_casts_from(wgpu_device, rng, src):
    x = inputs_for(src, N, rng)
    if src.is_float:  # in-range values for the narrow integer targets, and exact halves
        x[10:60] = rng.integers(-300, 300, 50) + rng.choice([0.0, 0.5, -0.5, 0.25], 50)
    exprs = {f"to_{to.value}": Cast(to, load("x", src)) for to in CAST_DTYPES if to is not src}
    for name, (got, want) in run_exprs(wgpu_device, {"x": x}, exprs).items():
        assert_bits_equal(got, want, f"cast {src} {name}")


def test_bitcasts(wgpu_device, rng):
    x = inputs_for(D.F32, N, rng)
    exprs = {"u": Bitcast(D.U32, load("x", D.F32)), "i": Bitcast(D.I32, load("x", D.F32)),
             "back": Bitcast(D.F32, Bitcast(D.I32, load("x", D.F32)))}
    for name, (got, want) in run_exprs(wgpu_device, {"x": x}, exprs).items():
        assert_bits_equal(got, want, name)


@pytest.mark.parametrize("dtype", [D.F32, D.I32, D.U32])
def test_select_moves_bits(wgpu_device, rng, dtype):
    c = rng.integers(-2, 3, N).astype(np.int32)
    t, f = inputs_for(dtype, N, rng), inputs_for(dtype, N, rng)[::-1].copy()
    if dtype is D.F32:  # NaN payloads and signed zeros must survive untouched
        t[20:30] = np.array([0x7fc01234, 0xffa00001] * 5, np.uint32).view(np.float32)
        f[30:40] = -0.0
    e = Sel(load("c", D.I32), load("t", dtype), load("f", dtype))
    (got, want), = run_exprs(wgpu_device, {"c": c, "t": t, "f": f}, {"s": e}).values()
    assert np.array_equal(_raw(got), _raw(want))


def _raw(a):
    return a.view(np.uint32 if a.itemsize == 4 else np.uint16)


@pytest.mark.parametrize("dtype", [D.F16, D.BF16])
def test_select_on_16_bit_floats_is_refused(wgpu_device, dtype):
    e = Sel(load("c", D.I32), load("t", dtype), load("t", dtype))
    c, t = np.ones(N, np.int32), np.ones(N, dtype.numpy)
    with pytest.raises(DtypeLowering, match="Select") as err:
        run_exprs(wgpu_device, {"c": c, "t": t}, {"s": e})
    assert (err.value.op, err.value.dtype, err.value.backend) == ("Select", str(dtype), "wgpu")
    assert err.value.device == wgpu_device.name


def test_bf16_arithmetic_is_refused(wgpu_device):
    e = Bin(BinaryOp.Add, load("x", D.BF16), load("x", D.BF16))
    with pytest.raises(DtypeLowering, match="storage-and-conversion only"):
        run_exprs(wgpu_device, {"x": np.ones(N, D.BF16.numpy)}, {"y": e})


def test_fp8_is_refused(wgpu_device):
    e = Cast(D.F32, load("x", D.F8E4M3))
    with pytest.raises(DtypeLowering, match="f8e4m3"):
        run_exprs(wgpu_device, {"x": np.ones(N, D.F8E4M3.numpy)}, {"y": e})


def test_constants_fold_with_the_oracle_rules(wgpu_device, rng):
    x = inputs_for(D.F32, N, rng)
    int_min = Const(-2**31, D.I32)
    exprs = {
        "inf": Un(UnaryOp.Recip, Const(0.0, D.F32)),
        "nan": Un(UnaryOp.Log, Const(-1.0, D.F32)),
        "wrap": Un(UnaryOp.Neg, int_min) + Cast(D.I32, load("x", D.F32)) * Const(0, D.I32),
        "div0": Bin(BinaryOp.Div, Const(7, D.I32), Const(0, D.I32)),
        "tiny": Const(1e-40, D.F32),
        "half": Const(65504.0, D.F16) - Cast(D.F16, load("x", D.F32)),
    }
    for name, (got, want) in run_exprs(wgpu_device, {"x": x}, exprs).items():
        assert_bits_equal(got, want, name)
