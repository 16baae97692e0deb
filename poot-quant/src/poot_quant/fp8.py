"""FP8 weights (OCP E4M3 "fn" and E5M2) with an f32 scale: W[n, k] = f32(w[n, k]) * scale.

Sources: "weight" [N, K] (one byte per value) and "weight_scale" f32, whose
shape follows the attr `scale`:
  "tensor"  [1]                               one scale (compressed-tensors, modelopt)
  "channel" [N]                               one per output row
  "block"   [ceil(N/bn), ceil(K/bk)]          one per bn x bk tile (`weight_scale_inv`
                                              of DeepSeek-style checkpoints; attr
                                              `block` = (bn, bk), default (128, 128))
"""
from __future__ import annotations

import functools

import numpy as np
from poot.dtypes import DType

from poot_quant import exprs
from poot_quant.base import Format, ceil_div, spec

SCALE_KINDS = ("tensor", "channel", "block")


class FP8(Format):
    attr_names = frozenset({"scale", "block"})

    def __init__(self, kind: str):
        self.name = f"fp8:{kind}"
        self.dtype = {"e4m3": DType.F8E4M3, "e5m2": DType.F8E5M2}[kind]
        self.to_f32 = {"e4m3": exprs.e4m3_bits_to_f32, "e5m2": exprs.e5m2_bits_to_f32}[kind]

    @functools.cached_property
    def max_finite(self) -> float:
        import ml_dtypes  # on first use: a process without fp8 weights does not load it

        return float(ml_dtypes.finfo(self.dtype.numpy).max)

    def scale_kind(self, attrs) -> str:
        kind = attrs.get("scale", "tensor")
        if kind not in SCALE_KINDS:
            self.fail(f"scale must be one of {', '.join(SCALE_KINDS)}, got {kind!r}")
        return kind

    def block(self, attrs) -> tuple[int, int]:
        b = attrs.get("block", (128, 128))
        bn, bk = (b, b) if isinstance(b, int) else tuple(int(x) for x in b)
        if bn <= 0 or bk <= 0:
            self.fail(f"block must be positive, got {b!r}")
        return bn, bk

    def scale_shape(self, shape, attrs) -> tuple[int, ...]:
        n, k = shape
        kind = self.scale_kind(attrs)
        if kind == "tensor":
            return (1,)
        if kind == "channel":
            return (n,)
        bn, bk = self.block(attrs)
        return ceil_div(n, bn), ceil_div(k, bk)

    def roles(self, shape, attrs):
        n, k = self.check_shape(shape, attrs)
        return [spec("weight", (n, k), self.dtype),
                spec("weight_scale", self.scale_shape((n, k), attrs), DType.F32)]

    def decode(self, arrays, shape, attrs):
        w = arrays["weight"].astype(np.float32)
        return w * self.scale_per_element(arrays["weight_scale"], shape, attrs)

    def scale_per_element(self, s, shape, attrs) -> np.ndarray:
        kind = self.scale_kind(attrs)
        if kind == "tensor":
            return s.reshape(1, 1)
        if kind == "channel":
            return s.reshape(-1, 1)
        bn, bk = self.block(attrs)
        n, k = shape
        return s[(np.arange(n) // bn)[:, None], (np.arange(k) // bk)[None, :]]

    def decode_expr(self, load, n, k, shape, attrs):
        self.check_expr_sources(shape, attrs)
        n, k = exprs.as_u32(n), exprs.as_u32(k)
        value = self.to_f32(exprs.Words(load, "weight").byte(n * shape[1] + k))
        scales = exprs.Words(load, "weight_scale")
        kind = self.scale_kind(attrs)
        if kind == "tensor":
            scale = scales.f32(0)
        elif kind == "channel":
            scale = scales.f32(n)
        else:
            bn, bk = self.block(attrs)
            scale = scales.f32(exprs.div_const(n, bn) * ceil_div(shape[1], bk)
                                + exprs.div_const(k, bk))
        return value * scale

    def quantize(self, w, **attrs) -> list[np.ndarray]:
        w = np.asarray(w, np.float32)
        if w.ndim != 2:
            self.fail(f"quantize takes a 2-D [N, K] weight, got shape {list(w.shape)}")
        self.roles(w.shape, attrs)
        kind = self.scale_kind(attrs)
        a = np.abs(w)
        if kind == "tensor":
            amax = a.max(keepdims=True).reshape(1)
        elif kind == "channel":
            amax = a.max(1)
        else:
            bn, bk = self.block(attrs)
            n, k = w.shape
            padded = np.zeros((ceil_div(n, bn) * bn, ceil_div(k, bk) * bk), np.float32)
            padded[:n, :k] = a
            amax = padded.reshape(padded.shape[0] // bn, bn, -1, bk).max((1, 3))
        scale = np.where(amax > 0, amax / self.max_finite, 1).astype(np.float32)
        per_element = self.scale_per_element(scale, w.shape, attrs)
        q = np.clip(w / per_element, -self.max_finite, self.max_finite).astype(self.dtype.numpy)
        return [q, scale]


FP8_FORMATS = [FP8("e4m3"), FP8("e5m2")]
