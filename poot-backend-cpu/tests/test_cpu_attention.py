"""The attention rows kernel against numpy at prefill shapes: tiles of query rows with a
part tile, key counts that are no multiple of eight, masks with holes and a row with no
live key, and the same bits from its AVX2 path as from the plain C loops; 16-bit and q8_0
keys and values read in place give the bits of the kernel over their f32 values."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.ir.ops import (
    Q8_BLOCK,
    Attention,
    PagedAttention,
    PagedQ8KVAttention,
    Q8KVAttention,
    Q8KVSinkAttention,
    SinkAttention,
)
from poot.ir.types import TensorType
from poot_cpu import compiler
from poot_cpu.attention import attention_program
from poot_cpu.printer import HostCPrinter

F32 = DType.F32


def _run(q, k, v, mask, scale, flags=compiler.FLAGS):
    return _run_op(Attention(scale), [q, k, v, mask], flags)


def _run_op(op, ins, flags=compiler.FLAGS):
    """The kernel of `op` over arrays `ins` (its operands, in order)."""
    types = [TensorType(x.shape, DType.of(x)) for x in ins]
    out = op.infer(types)
    compiled = attention_program(op, types, out, HostCPrinter())
    (kernel,) = compiled.kernels
    n = len(ins) + 1
    params = ", ".join(f"void* a{i}" for i in range(n))
    args = ", ".join(f"a{i}" for i in range(n))
    src = HostCPrinter().prelude(simd=True) + kernel.source + (
        f"void run({params}) {{\n  #pragma omp parallel\n  {kernel.kernel.name}({args});\n}}\n")
    fn = compiler.load(src, flags).run
    fn.argtypes = [ctypes.c_void_p] * n
    o = np.zeros(out.shape, np.float32)
    held = [np.ascontiguousarray(x) for x in ins]      # alive through the call
    fn(*(x.ctypes.data for x in held), o.ctypes.data)
    return o


def _want(q, k, v, mask, scale, sinks=None):
    """The definition in float64; `sinks` [Hq] join each row's max and denominator."""
    g = q.shape[-3] // k.shape[-3]
    k, v = (np.repeat(x.astype(np.float64), g, axis=-3) for x in (k, v))
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale + mask
    sink = -np.inf if sinks is None else sinks.astype(np.float64)[:, None, None]
    with np.errstate(invalid="ignore"):
        m = np.maximum(s.max(-1, keepdims=True), sink)
        p = np.exp(s - m)
        return p / (p.sum(-1, keepdims=True) + np.exp(sink - m)) @ v


@pytest.mark.parametrize("t, s", [(13, 45), (32, 328), (1, 20)])
def test_attention_rows_match_numpy_and_the_plain_loops(cpu_backend, t, s):
    rng = np.random.default_rng(t)
    q = rng.standard_normal((1, 6, t, 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, s, 64)).astype(np.float32) for _ in range(2))
    mask = np.where(rng.random((t, s)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[:, s - 5:] = -np.inf                     # dead keys at the end, as in a KV cache
    if t > 1:
        mask[1] = -np.inf                         # a row with no live key: NaN
    got = _run(q, k, v, mask, 0.125)
    want = _want(q, k, v, mask, 0.125)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    live = ~np.isnan(want)
    assert np.allclose(got[live], want[live], rtol=1e-5, atol=1e-6)
    plain = _run(q, k, v, mask, 0.125, compiler.FLAGS + ("-mno-avx2",))
    assert np.array_equal(got, plain, equal_nan=True)


@pytest.mark.parametrize("kv", [DType.F16, DType.BF16])
@pytest.mark.parametrize("t, s", [(5, 37), (1, 20)])
def test_16_bit_keys_give_the_bits_of_their_f32_widening(cpu_backend, kv, t, s):
    """f16 and bf16 K/V (an f16 KV cache read in place) are widened as they are loaded: the
    same bits as the kernel over the f32 widening, on the AVX2 path and the plain loops."""
    rng = np.random.default_rng(s)
    q = rng.standard_normal((1, 4, t, 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, s, 64)).astype(kv.numpy) for _ in range(2))
    mask = np.where(rng.random((t, s)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[:, 0] = 0.0
    k32, v32 = k.astype(np.float32), v.astype(np.float32)
    for flags in (compiler.FLAGS, compiler.FLAGS + ("-mno-avx2",)):
        assert np.array_equal(_run(q, k, v, mask, 0.125, flags),
                              _run(q, k32, v32, mask, 0.125, flags))


def _q8(rng, shape):
    """q8_0 codes [..., D] and scales [..., D/32] as a cache holds them, and their f32
    dequantization (f32(code) * scale, the definition's one rounding)."""
    codes = rng.integers(-127, 128, size=shape).astype(np.int8)
    scales = (rng.random(shape[:-1] + (shape[-1] // Q8_BLOCK,)) * 0.03).astype(np.float32)
    rows = codes.astype(np.float32).reshape(shape[:-1] + (-1, Q8_BLOCK)) * scales[..., None]
    return codes, scales, rows.reshape(shape)


@pytest.mark.parametrize("t, s, dv", [(5, 37, 64), (1, 20, 32)])
def test_q8_0_keys_give_the_bits_of_their_f32_dequantization(cpu_backend, t, s, dv):
    """Q8KVAttention dequantizes each code as it loads it: the same bits as the f32 kernel
    over the dequantized copy, on the AVX2 path and the plain loops."""
    rng = np.random.default_rng(t + s)
    q = rng.standard_normal((1, 4, t, 64)).astype(np.float32)
    (kc, ks, k32), (vc, vs, v32) = _q8(rng, (1, 2, s, 64)), _q8(rng, (1, 2, s, dv))
    mask = np.where(rng.random((t, s)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[:, 0] = 0.0
    for flags in (compiler.FLAGS, compiler.FLAGS + ("-mno-avx2",)):
        assert np.array_equal(_run_op(Q8KVAttention(0.125), [q, kc, ks, vc, vs, mask], flags),
                              _run(q, k32, v32, mask, 0.125, flags))


def test_per_sequence_masks_and_long_q8_caches(cpu_backend):
    """A paged batch's mask [B, 1, 1, T, S] (rows per sequence) is read per sequence; a q8_0
    cache past MAX_S keys keeps its score row on the heap."""
    from poot_cpu.attention import MAX_S

    rng = np.random.default_rng(3)
    q = rng.standard_normal((3, 4, 1, 32)).astype(np.float32)
    k, v = (rng.standard_normal((3, 2, 13, 32)).astype(np.float32) for _ in range(2))
    mask = np.where(rng.random((3, 1, 1, 1, 13)) < 0.4, -np.inf, 0.0).astype(np.float32)
    mask[..., 0] = 0.0
    want = _want(q, k, v, mask[:, :, 0], 0.25)
    assert np.allclose(_run(q, k, v, mask, 0.25), want, rtol=1e-5, atol=1e-6)
    s = MAX_S + 9
    (kc, ks, k32), (vc, vs, v32) = _q8(rng, (1, s, 32)), _q8(rng, (1, s, 32))
    q, mask = q[0, :2], np.zeros((1, s), np.float32)
    got = _run_op(Q8KVAttention(0.25), [q, kc, ks, vc, vs, mask])
    assert np.allclose(got, _want(q, k32, v32, mask, 0.25), rtol=1e-4, atol=1e-6)


def test_q8_0_attention_the_kernel_cannot_read_is_refused_by_name(cpu_backend):
    """Q8KVAttention has no shared lowering: a mask that differs by head is a typed
    refusal naming the op, not a missing kernel."""
    rng = np.random.default_rng(4)
    (kc, ks, _), (vc, vs, _) = _q8(rng, (2, 7, 32)), _q8(rng, (2, 7, 32))
    q, mask = np.zeros((4, 1, 32), np.float32), np.zeros((4, 1, 7), np.float32)
    types = [TensorType(x.shape, DType.of(x)) for x in (q, kc, ks, vc, vs, mask)]
    op = Q8KVAttention(0.25)
    with pytest.raises(UnsupportedOp, match="Q8KVAttention.*mask"):
        attention_program(op, types, op.infer(types), HostCPrinter())


@pytest.mark.parametrize("kv", [DType.F32, DType.F16])
def test_pool_rows_read_through_the_slot_map_give_the_gathered_bits(cpu_backend, kv):
    """PagedAttention reads each sequence's pool rows through its slot map: the bits of the
    kernel over the gathered [B, Hkv, S, D] copy, on the AVX2 path and the plain loops."""
    rng = np.random.default_rng(11)
    b, s = 3, 21
    q = rng.standard_normal((b, 4, 2, 64)).astype(np.float32)
    k, v = (rng.standard_normal((40, 2, 64)).astype(kv.numpy) for _ in range(2))
    smap = rng.integers(0, 40, (b, s)).astype(np.int32)
    mask = np.where(rng.random((b, 1, 1, 2, s)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[..., 0] = 0.0
    mask[1, ..., 9:] = -np.inf                  # a shorter sequence
    kg, vg = (x[smap].transpose(0, 2, 1, 3) for x in (k, v))
    for flags in (compiler.FLAGS, compiler.FLAGS + ("-mno-avx2",)):
        assert np.array_equal(_run_op(PagedAttention(0.125), [q, k, v, smap, mask], flags),
                              _run(q, kg, vg, mask, 0.125, flags))
    if kv is DType.F32:          # q8_0 pools: codes and scales read through the slot map
        (kc, ks, _), (vc, vs, _) = _q8(rng, (40, 2, 64)), _q8(rng, (40, 2, 64))
        rows = [x[smap].transpose(0, 2, 1, 3) for x in (kc, ks, vc, vs)]
        assert np.array_equal(
            _run_op(PagedQ8KVAttention(0.125), [q, kc, ks, vc, vs, smap, mask]),
            _run_op(Q8KVAttention(0.125), [q, *rows, mask]))


@pytest.mark.parametrize("t, s", [(13, 45), (1, 20)])
def test_sink_logits_join_the_max_and_the_denominator(cpu_backend, t, s):
    """SinkAttention (gpt-oss) against its definition in float64, a row with no live key
    included (0 there: the sink alone takes the softmax), the AVX2 path's bits the plain
    loops'; f16 keys and values give the bits of their f32 widening, q8_0 ones
    (Q8KVSinkAttention) those of their f32 dequantization."""
    rng = np.random.default_rng(t)
    q = rng.standard_normal((1, 4, t, 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, s, 64)).astype(np.float32) for _ in range(2))
    sinks = (rng.standard_normal(4) * 2).astype(np.float32)
    mask = np.where(rng.random((t, s)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[:, s - 5:] = -np.inf
    if t > 1:
        mask[1] = -np.inf
    op = SinkAttention(0.125)
    got = _run_op(op, [q, k, v, mask, sinks])
    assert np.allclose(got, _want(q, k, v, mask, 0.125, sinks), rtol=1e-5, atol=1e-6)
    if t > 1:
        assert not got[:, :, 1].any()
    assert not np.allclose(got, _run(q, k, v, mask, 0.125), equal_nan=True)
    plain = _run_op(op, [q, k, v, mask, sinks], compiler.FLAGS + ("-mno-avx2",))
    assert np.array_equal(got, plain)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    assert np.array_equal(_run_op(op, [q, k16, v16, mask, sinks]),
                          _run_op(op, [q, k16.astype(np.float32), v16.astype(np.float32),
                                       mask, sinks]))
    (kc, ks, k32), (vc, vs, v32) = _q8(rng, (1, 2, s, 64)), _q8(rng, (1, 2, s, 64))
    for flags in (compiler.FLAGS, compiler.FLAGS + ("-mno-avx2",)):
        assert np.array_equal(
            _run_op(Q8KVSinkAttention(0.125), [q, kc, ks, vc, vs, mask, sinks], flags),
            _run_op(op, [q, k32, v32, mask, sinks], flags))
