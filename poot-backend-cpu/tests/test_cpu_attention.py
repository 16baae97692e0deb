"""The attention rows kernel against numpy at prefill shapes: tiles of query rows with a
part tile, key counts that are no multiple of eight, masks with holes and a row with no
live key, and the same bits from its AVX2 path as from the plain C loops."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from poot.dtypes import DType
from poot.ir.ops import Attention
from poot.ir.types import TensorType
from poot_cpu import compiler
from poot_cpu.attention import attention_program
from poot_cpu.printer import HostCPrinter

F32 = DType.F32


def _run(q, k, v, mask, scale, flags=compiler.FLAGS):
    types = [TensorType(x.shape, DType.of(x)) for x in (q, k, v, mask)]
    out = TensorType(q.shape[:-1] + (v.shape[-1],), F32)
    compiled = attention_program(Attention(scale), types, out, HostCPrinter())
    (kernel,) = compiled.kernels
    src = HostCPrinter().prelude(simd=True) + kernel.source + (
        "void run(const float* q, const void* k, const void* v, const float* m, float* o) {\n"
        f"  #pragma omp parallel\n  {kernel.kernel.name}(q, k, v, m, o);\n}}\n")
    fn = compiler.load(src, flags).run
    fn.argtypes = [ctypes.c_void_p] * 5
    o = np.zeros(out.shape, np.float32)
    fn(*(x.ctypes.data for x in (q, k, v, mask, o)))
    return o


def _want(q, k, v, mask, scale):
    g = q.shape[-3] // k.shape[-3]
    k, v = (np.repeat(x.astype(np.float64), g, axis=-3) for x in (k, v))
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale + mask
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        return p / p.sum(-1, keepdims=True) @ v


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
