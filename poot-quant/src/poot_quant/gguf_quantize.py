"""Simple, valid quantizers for the GGUF types the `gguf` package cannot quantize.

They are not llama.cpp's error-minimising searches (no importance matrix, no
iterative refinement): each picks per-sub-block ranges, rounds the sub-block
scales to the type's scale bits against an f16 super-scale, and rounds values
to the nearest level. The packing reuses the decode layouts of gguf_blocks, and
the tests decode the result with the `gguf` package itself.
"""
from __future__ import annotations

import numpy as np

from poot_quant import gguf_blocks as L

F32 = np.float32


def _f16_at_least(x: np.ndarray) -> np.ndarray:
    """x rounded to f16, nudged up one f16 step where rounding went below x (x >= 0)."""
    h = x.astype(np.float16)
    low = h.astype(F32) < x
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h


def _safe_div(a, b):
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, F32), where=b != 0)


def pack_bits(out: np.ndarray, offset: int, layout, values: np.ndarray) -> None:
    """OR each element's bits into the bytes `layout` (gguf_blocks.*_at) gives it."""
    j = np.arange(values.shape[1], dtype=np.uint32)
    position, shift = (np.broadcast_to(a, j.shape) for a in layout(j))
    for s in np.unique(shift):  # within one shift every byte holds at most one element
        sel = shift == s
        out[:, offset + position[sel]] |= (values[:, sel].astype(np.uint32) << s).astype(np.uint8)


def _put_f16(out: np.ndarray, offset: int, h: np.ndarray) -> None:
    out[:, offset:offset + 2] = h.astype("<f2").reshape(-1, 1).view(np.uint8)


def _asymmetric(x: np.ndarray, sub: int, levels: int, scale_max: int):
    """Per sub-block (scale, min) with x ~ d*sc*q - dmin*m, q in 0..levels, sc/m in
    0..scale_max. Returns q [nb, 256], sc, m [nb, n_sub], d, dmin f16 [nb]."""
    nb = x.shape[0]
    s = x.reshape(nb, -1, sub)
    lo = np.minimum(s.min(-1), 0)
    hi = s.max(-1)
    dmin = _f16_at_least((-lo).max(-1) / scale_max)
    m = np.clip(np.ceil(_safe_div(-lo, dmin.astype(F32)[:, None])), 0, scale_max)
    eff_min = dmin.astype(F32)[:, None] * m
    need = (hi + eff_min) / levels
    d = _f16_at_least(need.max(-1) / scale_max)
    sc = np.clip(np.ceil(_safe_div(need, d.astype(F32)[:, None])), 0, scale_max)
    eff = d.astype(F32)[:, None] * sc
    q = np.clip(np.rint(_safe_div(s + eff_min[..., None], eff[..., None])), 0, levels)
    return q.reshape(nb, -1), sc.astype(np.uint32), m.astype(np.uint32), d, dmin


def _symmetric(x: np.ndarray, sub: int, qmin: int, scale_bits_max: int):
    """Per sub-block signed scale with x ~ d*sc*q, q in qmin..-qmin-1; the element of
    largest magnitude maps to qmin. Returns q [nb, 256], sc [nb, n_sub], d f16 [nb]."""
    nb = x.shape[0]
    s = x.reshape(nb, -1, sub)
    big = np.take_along_axis(s, np.abs(s).argmax(-1)[..., None], -1)[..., 0]
    scale = big / qmin
    d = _f16_at_least(np.abs(scale).max(-1) / scale_bits_max)
    # round the scale's magnitude up, so that no value needs more than the q range
    sc = np.sign(scale) * np.clip(np.ceil(_safe_div(np.abs(scale), d.astype(F32)[:, None])),
                                  0, scale_bits_max)
    eff = d.astype(F32)[:, None] * sc
    q = np.clip(np.rint(_safe_div(s, eff[..., None])), qmin, -qmin - 1)
    return q.reshape(nb, -1).astype(np.int32), sc.astype(np.int32), d


def _pack_scale_min6(out: np.ndarray, offset: int, sc: np.ndarray, m: np.ndarray) -> None:
    lo_sc, hi_sc, lo_m, hi_m = sc[:, :4], sc[:, 4:], m[:, :4], m[:, 4:]
    out[:, offset:offset + 4] = (lo_sc | (hi_sc >> 4) << 6).astype(np.uint8)
    out[:, offset + 4:offset + 8] = (lo_m | (hi_m >> 4) << 6).astype(np.uint8)
    out[:, offset + 8:offset + 12] = ((hi_sc & 15) | (hi_m & 15) << 4).astype(np.uint8)


def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    q, sc, m, d, dmin = _asymmetric(x, 16, 3, 15)
    out = np.zeros((x.shape[0], 84), np.uint8)
    out[:, :16] = (sc | m << 4).astype(np.uint8)
    pack_bits(out, 16, L.two_bits_at, q)
    _put_f16(out, 80, d)
    _put_f16(out, 82, dmin)
    return out


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    q, sc, d = _symmetric(x, 16, -4, 31)
    u = (q + 4).astype(np.uint32)
    out = np.zeros((x.shape[0], 110), np.uint8)
    pack_bits(out, 0, L.bit_plane_at, u >> 2)
    pack_bits(out, 32, L.two_bits_at, u & 3)
    s = (sc + 32).astype(np.uint32)
    pack_bits(out, 96, L.q3_scale_low_at, s & 15)
    pack_bits(out, 104, L.q3_scale_high_at, s >> 4)
    _put_f16(out, 108, d)
    return out


def _quantize_q45_k(x: np.ndarray, levels: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    q, sc, m, d, dmin = _asymmetric(x, 32, levels, 63)
    out = np.zeros((x.shape[0], size), np.uint8)
    _put_f16(out, 0, d)
    _put_f16(out, 2, dmin)
    _pack_scale_min6(out, 4, sc, m)
    return out, q.astype(np.uint32)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    out, q = _quantize_q45_k(x, 15, 144)
    pack_bits(out, 16, L.kquant_nibble_at, q)
    return out


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    out, q = _quantize_q45_k(x, 31, 176)
    pack_bits(out, 16, L.bit_plane_at, q >> 4)
    pack_bits(out, 48, L.kquant_nibble_at, q & 15)
    return out


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    q, sc, d = _symmetric(x, 16, -32, 127)
    u = (q + 32).astype(np.uint32)
    out = np.zeros((x.shape[0], 210), np.uint8)
    pack_bits(out, 0, L.q6_low_at, u & 15)
    pack_bits(out, 128, L.two_bits_at, u >> 4)
    out[:, 192:208] = sc.astype(np.int8).view(np.uint8)
    _put_f16(out, 208, d)
    return out


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    table = np.asarray(L.IQ4_NL_VALUES, F32)
    big = np.take_along_axis(x, np.abs(x).argmax(-1)[:, None], -1)[:, 0]
    d = (big / table[0]).astype(np.float16)
    scaled = _safe_div(x, d.astype(F32)[:, None])
    q = np.abs(scaled[..., None] - table).argmin(-1).astype(np.uint32)
    out = np.zeros((x.shape[0], 18), np.uint8)
    _put_f16(out, 0, d)
    pack_bits(out, 2, L.nibble32_at, q)
    return out
