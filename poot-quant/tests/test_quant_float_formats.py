"""FP8, NVFP4 and MXFP4: every code against ml_dtypes, hand-written bytes, scale layouts,
round trips; the integer-op conversions of poot_quant.exprs for every code."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import poot_quant
import pytest
from poot.codegen.expr import Var, evaluate
from poot.dtypes import DType
from poot_quant import exprs


def codes(n):
    return np.arange(n, dtype=np.uint32)


@pytest.mark.parametrize("convert,dtype,count", [
    (exprs.e4m3_bits_to_f32, ml_dtypes.float8_e4m3fn, 256),
    (exprs.e5m2_bits_to_f32, ml_dtypes.float8_e5m2, 256),
    (exprs.e2m1_bits_to_f32, ml_dtypes.float4_e2m1fn, 16),
    (exprs.e8m0_bits_to_f32, ml_dtypes.float8_e8m0fnu, 256),
])
def test_conversion_programs_match_ml_dtypes_for_every_code(convert, dtype, count):
    got = evaluate(convert(Var("c", DType.U32)), {"c": codes(count)}, {})
    want = codes(count).astype(np.uint8).view(dtype).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # NaNs included


def test_half_conversion_matches_numpy_for_every_code(bitwise):
    got = evaluate(exprs.half_bits_to_f32(Var("h", DType.U32)), {"h": codes(1 << 16)}, {})
    assert bitwise(got, codes(1 << 16).astype(np.uint16).view(np.float16).astype(np.float32))


def test_ggml_half_e8m0_scale():
    got = evaluate(exprs.e8m0_half_bits_to_f32(Var("e", DType.U32)), {"e": codes(256)}, {})
    want = np.array([2.0 ** (e - 128) for e in range(256)], np.float64).astype(np.float32)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("kind,dtype", [("e4m3", ml_dtypes.float8_e4m3fn),
                                         ("e5m2", ml_dtypes.float8_e5m2)])
def test_fp8_every_code_against_ml_dtypes(kind, dtype, bitwise):
    weight = codes(256).astype(np.uint8).view(dtype).reshape(16, 16)
    got = poot_quant.get(f"fp8:{kind}").dequantize([weight, np.array([0.5], np.float32)],
                                                   (16, 16), scale="tensor")
    assert bitwise(got, weight.astype(np.float32) * np.float32(0.5))


def test_fp8_scale_layouts():
    fmt = poot_quant.get("fp8:e4m3")
    weight = np.ones((3, 5), ml_dtypes.float8_e4m3fn)
    channel = fmt.dequantize([weight, np.array([1, 2, 3], np.float32)], (3, 5), scale="channel")
    assert channel[:, 0].tolist() == [1, 2, 3] and (channel == channel[:, :1]).all()
    # 2x2 blocks over a 3x5 weight: a 2x3 grid of scales, the last row/column partial
    grid = np.arange(6, dtype=np.float32).reshape(2, 3)
    block = fmt.dequantize([weight, grid], (3, 5), scale="block", block=(2, 2))
    assert block.tolist() == [[0, 0, 1, 1, 2], [0, 0, 1, 1, 2], [3, 3, 4, 4, 5]]
    assert fmt.roles((300, 257), {"scale": "block"})[1].type.shape == (3, 3)


@pytest.mark.parametrize("name,attrs,bound", [
    ("fp8:e4m3", {"scale": "tensor"}, 0.04), ("fp8:e4m3", {"scale": "channel"}, 0.04),
    ("fp8:e4m3", {"scale": "block"}, 0.04), ("fp8:e5m2", {"scale": "channel"}, 0.08),
    ("nvfp4", {}, 0.12), ("mxfp4", {}, 0.15),
])
def test_round_trip(name, attrs, bound, rng):
    fmt = poot_quant.get(name)
    w = (rng.standard_normal((130, 256)) * rng.uniform(0.01, 10, (130, 1))).astype(np.float32)
    sources = fmt.quantize(w, **attrs)
    back = fmt.dequantize(sources, w.shape, **attrs)
    rel = np.sqrt(np.mean((back - w) ** 2, axis=1) / np.mean(w ** 2, axis=1)).max()
    assert rel < bound, rel


def test_nvfp4_hand_written():
    # byte 0xF1: element 0 = code 1 (0.5), element 1 = code 15 (-6); scale E4M3 0x40 = 2.0
    weight = np.array([[0xF1] + [0] * 7], np.uint8)
    scale = np.array([[0x40]], np.uint8).view(ml_dtypes.float8_e4m3fn)
    got = poot_quant.get("nvfp4").dequantize([weight, scale, np.array([0.5], np.float32)], (1, 16))
    assert got[0, :3].tolist() == [0.5, -6.0, 0.0]


def test_mxfp4_hand_written_and_nan_scale():
    # byte 0x72: element 0 = code 2 (1.0), element 1 = code 7 (6.0); scale 128 = 2^1
    blocks = np.array([[0x72] + [0] * 15 + [0x72] + [0] * 15], np.uint8)
    scales = np.array([[128, 255]], np.uint8)
    got = poot_quant.get("mxfp4").dequantize([blocks, scales], (1, 64))
    assert got[0, :3].tolist() == [2.0, 12.0, 0.0]
    assert np.isnan(got[0, 32:]).all()  # E8M0 0xFF is NaN (OCP MX)


def test_gguf_mxfp4_equals_ocp_mxfp4_after_repacking(rng):
    """The same E2M1 values and exponent, in ggml's block order and in OCP pair order."""
    n_blocks = 8
    exps = rng.integers(0, 255, n_blocks, dtype=np.uint8)  # 255 differs: NaN vs 2^127
    qs = rng.integers(0, 256, (n_blocks, 16), dtype=np.uint8)
    gguf_raw = np.concatenate([exps[:, None], qs], axis=1).reshape(1, -1)
    values = np.concatenate([qs & 15, qs >> 4], axis=1)  # element order within the block
    pairs = (values[:, 0::2] | values[:, 1::2] << 4).astype(np.uint8).reshape(1, -1)
    a = poot_quant.get("gguf:MXFP4").dequantize([gguf_raw], (1, 32 * n_blocks))
    b = poot_quant.get("mxfp4").dequantize([pairs, exps.reshape(1, -1)], (1, 32 * n_blocks))
    assert np.array_equal(a, b)
