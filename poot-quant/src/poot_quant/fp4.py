"""E2M1 (FP4) weights, two per byte, with block scales.

Both formats pack W[n, 2i] in the low nibble and W[n, 2i+1] in the high nibble
of byte [n, i] of "weight"/"blocks" (uint8 [N, K/2]).

nvfp4 (NVIDIA ModelOpt): "weight_scale" E4M3 [N, K/16] per 16 values along K and
  "weight_scale_2" f32 [1]; W = (e2m1 * f32(scale)) * global, in that order.
mxfp4 (OCP MX, as in gpt-oss `*_blocks` / `*_scales`): "scales" E8M0 [N, K/32],
  W = e2m1 * 2^(e - 127); e = 255 is NaN.
"""
from __future__ import annotations

import numpy as np
from poot.dtypes import DType

from poot_quant import exprs
from poot_quant.base import Format, spec

E2M1_MAX = 6.0


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """uint8 [N, K/2] -> f32 [N, K] (low nibble first)."""
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    return codes.view(DType.F4E2M1.numpy).astype(np.float32)


def pack_e2m1(values: np.ndarray) -> np.ndarray:
    """f32 [N, K] -> uint8 [N, K/2], rounding to nearest E2M1 (saturating at +-6)."""
    codes = np.clip(values, -E2M1_MAX, E2M1_MAX).astype(DType.F4E2M1.numpy)
    codes = codes.view(np.uint8).reshape(values.shape[0], -1, 2) & 15
    return (codes[..., 0] | codes[..., 1] << 4).astype(np.uint8)


class BlockFP4(Format):
    """E2M1 pairs plus one scale per `group` values along K."""

    packed_role: str
    scale_role: str
    scale_dtype: DType
    group: int

    def roles(self, shape, attrs):
        n, k = self.check_shape(shape, attrs)
        if k % self.group:
            self.fail(f"K = {k} must be a multiple of {self.group}")
        return [spec(self.packed_role, (n, k // 2), DType.U8),
                spec(self.scale_role, (n, k // self.group), self.scale_dtype)]

    def e2m1_expr(self, load, n, k, shape):
        byte = exprs.Words(load, self.packed_role).byte(n * (shape[1] // 2) + (k >> 1))
        return exprs.e2m1_bits_to_f32((byte >> ((k & 1) << 2)) & 15)

    def scale_byte_expr(self, load, n, k, shape):
        group_shift = self.group.bit_length() - 1
        return exprs.Words(load, self.scale_role).byte(n * (shape[1] // self.group)
                                                      + (k >> group_shift))

    def group_scales(self, scales: np.ndarray) -> np.ndarray:
        """f32 [N, K/group] scales repeated to [N, K]."""
        return np.repeat(scales.astype(np.float32), self.group, axis=1)

    def check_quantize_input(self, w, attrs) -> np.ndarray:
        w = np.asarray(w, np.float32)
        if w.ndim != 2:
            self.fail(f"quantize takes a 2-D [N, K] weight, got shape {list(w.shape)}")
        self.roles(w.shape, attrs)
        return w

    def group_amax(self, w) -> np.ndarray:
        return np.abs(w).reshape(w.shape[0], -1, self.group).max(-1)


class NVFP4(BlockFP4):
    name = "nvfp4"
    packed_role, scale_role, scale_dtype, group = "weight", "weight_scale", DType.F8E4M3, 16

    def roles(self, shape, attrs):
        return super().roles(shape, attrs) + [spec("weight_scale_2", (1,), DType.F32)]

    def decode(self, arrays, shape, attrs):
        values = unpack_e2m1(arrays["weight"]) * self.group_scales(arrays["weight_scale"])
        return values * arrays["weight_scale_2"].reshape(1, 1)

    def decode_expr(self, load, n, k, shape, attrs):
        self.check_expr_sources(shape, attrs)
        n, k = exprs.as_u32(n), exprs.as_u32(k)
        scale = exprs.e4m3_bits_to_f32(self.scale_byte_expr(load, n, k, shape))
        global_scale = exprs.Words(load, "weight_scale_2").f32(0)
        return (self.e2m1_expr(load, n, k, shape) * scale) * global_scale

    def quantize(self, w, **attrs):
        w = self.check_quantize_input(w, attrs)
        import ml_dtypes  # here, not at import: only quantizing needs finfo

        e4m3_max = float(ml_dtypes.finfo(DType.F8E4M3.numpy).max)
        amax = float(np.abs(w).max())
        global_scale = np.float32(amax / (e4m3_max * E2M1_MAX) if amax > 0 else 1.0)
        scale = (self.group_amax(w) / E2M1_MAX / global_scale).astype(DType.F8E4M3.numpy)
        step = self.group_scales(scale) * global_scale
        packed = pack_e2m1(np.divide(w, step, out=np.zeros_like(w), where=step != 0))
        return [packed, scale, np.array([global_scale], np.float32)]


class MXFP4(BlockFP4):
    name = "mxfp4"
    packed_role, scale_role, scale_dtype, group = "blocks", "scales", DType.F8E8M0, 32

    def decode(self, arrays, shape, attrs):
        return unpack_e2m1(arrays["blocks"]) * self.group_scales(arrays["scales"])

    def decode_expr(self, load, n, k, shape, attrs):
        self.check_expr_sources(shape, attrs)
        n, k = exprs.as_u32(n), exprs.as_u32(k)
        scale = exprs.e8m0_bits_to_f32(self.scale_byte_expr(load, n, k, shape))
        return self.e2m1_expr(load, n, k, shape) * scale

    def quantize(self, w, **attrs):
        w = self.check_quantize_input(w, attrs)
        amax = self.group_amax(w)
        with np.errstate(divide="ignore"):
            # the largest value lands in [4, 8): E2M1's top binade (4, 6), 8 saturates to 6
            exponent = np.where(amax > 0, np.floor(np.log2(amax)) - 2, -127)
        biased = np.clip(exponent + 127, 0, 254).astype(np.uint8)
        scale = biased.view(DType.F8E8M0.numpy)
        step = self.group_scales(scale)
        return [pack_e2m1(w / step), scale]


FP4_FORMATS = [NVFP4(), MXFP4()]
