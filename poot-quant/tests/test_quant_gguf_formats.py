"""GGUF block types: against a plain scalar statement of each block layout (written here in
the shape of ggml's C dequantize_row_* loops), against the gguf package, and round trips."""
from __future__ import annotations

import struct

import gguf
import gguf.quants
import numpy as np
import poot_quant
import pytest
from poot.errors import FormatError

f32 = np.float32
GGUF_NAMES = [n for n in poot_quant.formats() if n.startswith("gguf:")]


def half(raw: bytes, offset: int) -> np.float32:
    return f32(np.frombuffer(raw, "<f2", 1, offset)[0])


def i8(v: int) -> int:
    return v - 256 if v >= 128 else v


# -- the independent statement: one block in, its values out, plain loops ----------------
def ref_q4_0(b):
    d, qs = half(b, 0), b[2:18]
    return [d * f32((qs[i] & 15) - 8) for i in range(16)] + \
           [d * f32((qs[i] >> 4) - 8) for i in range(16)]


def ref_q4_1(b):
    d, m, qs = half(b, 0), half(b, 2), b[4:20]
    return [d * f32(qs[i] & 15) + m for i in range(16)] + \
           [d * f32(qs[i] >> 4) + m for i in range(16)]


def ref_q5(b, has_min):
    d = half(b, 0)
    m = half(b, 2) if has_min else f32(0)
    off = 4 if has_min else 2
    (qh,) = struct.unpack_from("<I", b, off)
    qs = b[off + 4:off + 20]
    bias = 0 if has_min else 16
    lo = [((qs[j] & 15) | (((qh >> j) << 4) & 0x10)) - bias for j in range(16)]
    hi = [((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - bias for j in range(16)]
    return [d * f32(q) + m if has_min else d * f32(q) for q in lo + hi]


def ref_q8_0(b):
    d = half(b, 0)
    return [d * f32(i8(b[2 + j])) for j in range(32)]


def ref_q2_k(b):
    scales, q, d, dmin = b[0:16], b[16:80], half(b, 80), half(b, 82)
    y, is_ = [], 0
    for n in (0, 32):
        for shift in (0, 2, 4, 6):
            for part in (0, 16):
                sc = scales[is_]
                is_ += 1
                dl, ml = d * f32(sc & 15), dmin * f32(sc >> 4)
                y += [dl * f32((q[n + part + ll] >> shift) & 3) - ml for ll in range(16)]
    return y


def ref_q3_k(b):
    hm, q, d = b[0:32], b[32:96], half(b, 108)
    aux = list(struct.unpack("<3I", b[96:108]))
    tmp, k1, k2 = aux[2], 0x03030303, 0x0F0F0F0F
    words = [(aux[0] & k2) | (((tmp >> 0) & k1) << 4), (aux[1] & k2) | (((tmp >> 2) & k1) << 4),
             ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4),
             ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4)]
    scales = [i8(x) for x in struct.pack("<4I", *words)]
    y, is_, m = [], 0, 1
    for n in (0, 32):
        for shift in (0, 2, 4, 6):
            for part in (0, 16):
                dl = d * f32(scales[is_] - 32)
                is_ += 1
                for ll in range(16):
                    low = (q[n + part + ll] >> shift) & 3
                    y.append(dl * f32(low - (0 if hm[part + ll] & m else 4)))
            m <<= 1
    return y


def scale_min_k4(j, s):
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def ref_q45_k(b, five):
    d, dmin, s = half(b, 0), half(b, 2), b[4:16]
    qh, ql = (b[16:48], b[48:176]) if five else (None, b[16:144])
    y, u1, u2 = [], 1, 2
    for c in range(4):
        sc1, m1 = scale_min_k4(2 * c, s)
        sc2, m2 = scale_min_k4(2 * c + 1, s)
        q = ql[32 * c:32 * c + 32]
        halves = ((sc1, m1, [v & 15 for v in q], u1), (sc2, m2, [v >> 4 for v in q], u2))
        for sc, mn, nib, u in halves:
            high = [16 if five and qh[ll] & u else 0 for ll in range(32)]
            y += [(d * f32(sc)) * f32(nib[ll] + high[ll]) - dmin * f32(mn) for ll in range(32)]
        u1, u2 = u1 << 2, u2 << 2
    return y


def ref_q6_k(b):
    ql, qh, sc, d = b[0:128], b[128:192], [i8(v) for v in b[192:208]], half(b, 208)
    y = [f32(0)] * 256
    for n in (0, 1):
        L, H, S = ql[64 * n:], qh[32 * n:], sc[8 * n:]
        for ll in range(32):
            is_ = ll // 16
            qs = [((L[ll] & 15) | (((H[ll] >> 0) & 3) << 4)) - 32,
                  ((L[ll + 32] & 15) | (((H[ll] >> 2) & 3) << 4)) - 32,
                  ((L[ll] >> 4) | (((H[ll] >> 4) & 3) << 4)) - 32,
                  ((L[ll + 32] >> 4) | (((H[ll] >> 6) & 3) << 4)) - 32]
            for r in range(4):
                y[128 * n + ll + 32 * r] = (d * f32(S[is_ + 2 * r])) * f32(qs[r])
    return y


IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
E2M1_TIMES_2 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def ref_iq4_nl(b):
    d, qs = half(b, 0), b[2:18]
    return [d * f32(IQ4NL[v & 15]) for v in qs] + [d * f32(IQ4NL[v >> 4]) for v in qs]


def ref_mxfp4(b):
    e, qs = b[0], b[1:17]
    d = f32(2.0 ** (e - 128))  # ggml: half of the E8M0 value, paired with doubled E2M1
    return [d * f32(E2M1_TIMES_2[v & 15]) for v in qs] + \
           [d * f32(E2M1_TIMES_2[v >> 4]) for v in qs]


REFERENCES = {
    "gguf:Q4_0": ref_q4_0, "gguf:Q4_1": ref_q4_1, "gguf:Q5_0": lambda b: ref_q5(b, False),
    "gguf:Q5_1": lambda b: ref_q5(b, True), "gguf:Q8_0": ref_q8_0, "gguf:Q2_K": ref_q2_k,
    "gguf:Q3_K": ref_q3_k, "gguf:Q4_K": lambda b: ref_q45_k(b, False),
    "gguf:Q5_K": lambda b: ref_q45_k(b, True), "gguf:Q6_K": ref_q6_k,
    "gguf:IQ4_NL": ref_iq4_nl, "gguf:MXFP4": ref_mxfp4,
}


def finite_random_block(fmt, rng) -> bytes:
    """Random bytes with every f16 field set to a finite value in [-2, 2]."""
    raw = bytearray(rng.integers(0, 256, fmt.type_size, dtype=np.uint8).tobytes())
    f16_fields = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
                  "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
                  "IQ4_NL": [0], "MXFP4": []}[fmt.qtype.name]
    for off in f16_fields:
        raw[off:off + 2] = np.float16(rng.uniform(-2, 2)).tobytes()
    return bytes(raw)


@pytest.mark.parametrize("name", GGUF_NAMES)
def test_decode_matches_scalar_statement_of_the_layout(name, rng):
    fmt = poot_quant.get(name)
    blocks = [finite_random_block(fmt, rng) for _ in range(3)]
    raw = np.frombuffer(b"".join(blocks), np.uint8).reshape(1, -1)
    got = fmt.dequantize([raw], (1, 3 * fmt.block_size))
    want = np.array([v for b in blocks for v in REFERENCES[name](b)], np.float32)
    np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=0)


def test_hand_written_q8_0_and_q4_0_blocks():
    q8 = np.float16(0.25).tobytes() + bytes([0x80, 0xFF, 0, 1, 0x7F] + [2] * 27)
    got = poot_quant.get("gguf:Q8_0").dequantize([np.frombuffer(q8, np.uint8)], (1, 32))
    assert got[0, :6].tolist() == [-32.0, -0.25, 0.0, 0.25, 31.75, 0.5]
    q4 = np.float16(-2.0).tobytes() + bytes([0x0F] + [0x88] * 15)  # elements 0 -> 15, 16 -> 0
    got = poot_quant.get("gguf:Q4_0").dequantize([np.frombuffer(q4, np.uint8)], (1, 32))
    assert got[0, 0] == -2.0 * (15 - 8) and got[0, 16] == -2.0 * (0 - 8)
    assert set(got[0, 1:16].tolist()) == {0.0}


def test_hand_written_q4_k_block():
    # d = 1, dmin = 0.5; sub-block 0: scale 2, min 4; sub-block 5: scale 0b110011 = 51 (low
    # 4 bits in byte 8+1, top 2 bits in bits 6-7 of byte 1) and min 1; every q nibble = 3
    scales = bytearray(12)
    scales[0], scales[4] = 2, 4
    scales[1] = 0b11 << 6
    scales[9] = (1 << 4) | 0b0011
    block = (np.float16(1).tobytes() + np.float16(0.5).tobytes() + bytes(scales)
             + bytes([0x33] * 128))
    got = poot_quant.get("gguf:Q4_K").dequantize([np.frombuffer(block, np.uint8)], (1, 256))[0]
    assert got[0] == 2 * 3 - 0.5 * 4 and got[31] == got[0]
    assert got[5 * 32] == 51 * 3 - 0.5 * 1


@pytest.mark.parametrize("name", GGUF_NAMES)
def test_decode_matches_gguf_package_bit_for_bit(name, rng, bitwise):
    fmt = poot_quant.get(name)
    raw = rng.integers(0, 256, (4, 3 * fmt.type_size), dtype=np.uint8)
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw, fmt.qtype).reshape(4, -1)
    assert bitwise(fmt.dequantize([raw], (4, 3 * fmt.block_size)), want)


# relative RMS error bounds for N(0, 1) weights: the level spacing of each type
ROUND_TRIP_RMS = {"Q2_K": 0.40, "Q3_K": 0.20, "Q4_0": 0.10, "Q4_1": 0.10, "Q4_K": 0.10,
                  "IQ4_NL": 0.10, "MXFP4": 0.15, "Q5_0": 0.05, "Q5_1": 0.05, "Q5_K": 0.05,
                  "Q6_K": 0.025, "Q8_0": 0.008}


@pytest.mark.parametrize("name", GGUF_NAMES)
def test_quantize_round_trip(name, rng):
    fmt = poot_quant.get(name)
    w = rng.standard_normal((8, 2 * max(fmt.block_size, 256))).astype(np.float32)
    (blocks,) = fmt.quantize(w)
    assert blocks.dtype == np.uint8 and blocks.shape == fmt.roles(w.shape, {})[0].type.shape
    back = fmt.dequantize([blocks], w.shape)
    # the gguf package reads what we wrote the same way
    assert np.array_equal(back, gguf.quants.dequantize(blocks, fmt.qtype).reshape(w.shape))
    rel = np.sqrt(np.mean((back - w) ** 2) / np.mean(w ** 2))
    assert rel < ROUND_TRIP_RMS[fmt.qtype.name], rel
    # and a constant-zero weight stays exactly zero
    (zero_blocks,) = fmt.quantize(np.zeros_like(w))
    assert not fmt.dequantize([zero_blocks], w.shape).any()


def test_bad_sources_are_refused():
    fmt = poot_quant.get("gguf:Q4_K")
    with pytest.raises(FormatError, match="multiple of the block size 256"):
        fmt.roles((2, 100), {})
    with pytest.raises(FormatError, match="'blocks' has 100 elements"):
        fmt.dequantize([np.zeros(100, np.uint8)], (2, 256))
    with pytest.raises(FormatError, match="dtype float32"):
        fmt.dequantize([np.zeros(72, np.float32)], (2, 256))
    with pytest.raises(FormatError, match="expects 1 sources"):
        fmt.dequantize([], (2, 256))
    with pytest.raises(FormatError, match="unknown packed weight format 'gguf:IQ2_XXS'"):
        poot_quant.get("gguf:IQ2_XXS")
