"""GPTQ and AWQ: hand-packed words with their published layouts, act-order, v1/v2 zeros,
round trips."""
from __future__ import annotations

import numpy as np
import poot_quant
import pytest
from poot.errors import FormatError

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ GEMM: nibble i holds column order[i]


def gptq_reference(q, zeros, scales, g_idx):
    """W[n, k] = (q[k, n] - zero[g(k), n]) * scale[g(k), n], as plain loops."""
    k_rows, n_cols = q.shape
    w = np.zeros((n_cols, k_rows), np.float32)
    for n in range(n_cols):
        for k in range(k_rows):
            g = g_idx[k]
            w[n, k] = np.float32(int(q[k, n]) - int(zeros[g, n])) * np.float32(scales[g, n])
    return w


def pack_words(values, bits, order=None):
    """Small ints -> one uint32 word, value i at bit position (order or identity)[i]*bits."""
    word = 0
    for i, pos in enumerate(order or range(len(values))):
        word |= int(values[i]) << (pos * bits)
    return word


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_gptq_hand_packed(bits, version, rng):
    per, k_rows, n_cols, gs = 32 // bits, 16, 8, 8
    q = rng.integers(0, 1 << bits, (k_rows, n_cols))
    zeros = rng.integers(1, 1 << bits, (2, n_cols))
    scales = rng.uniform(0.1, 2, (2, n_cols)).astype(np.float16)
    # qweight [K/per, N]: word [r, n] holds rows r*per .. r*per+per-1 of column n
    qweight = np.array([[pack_words(q[r * per:(r + 1) * per, n], bits) for n in range(n_cols)]
                        for r in range(k_rows // per)], np.uint32).view(np.int32)
    stored = zeros - (1 if version == "v1" else 0)
    qzeros = np.array([[pack_words(stored[g, c * per:(c + 1) * per], bits)
                        for c in range(n_cols // per)] for g in range(2)], np.uint32).view(np.int32)
    attrs = {"group_size": gs, "version": version}
    got = poot_quant.get(f"gptq:int{bits}").dequantize([qweight, qzeros, scales], (n_cols, k_rows),
                                                       **attrs)
    np.testing.assert_array_equal(got, gptq_reference(q, zeros, scales, np.arange(k_rows) // gs))


def test_gptq_act_order_uses_g_idx(rng):
    k_rows, n_cols = 16, 8
    q = rng.integers(0, 16, (k_rows, n_cols))
    zeros = np.full((2, n_cols), 8)
    scales = np.array([[1.0] * n_cols, [-3.0] * n_cols], np.float16)
    g_idx = np.array([1, 0] * 8, np.int32)
    qweight = np.array([[pack_words(q[r * 8:(r + 1) * 8, n], 4) for n in range(n_cols)]
                        for r in range(2)], np.uint32).view(np.int32)
    qzeros = np.array([[pack_words([7] * 8, 4)]] * 2, np.uint32).view(np.int32)  # v1: 8 - 1
    fmt = poot_quant.get("gptq:int4")
    attrs = {"group_size": 8, "act_order": True}
    got = fmt.dequantize([qweight, qzeros, scales, g_idx], (n_cols, k_rows), **attrs)
    np.testing.assert_array_equal(got, gptq_reference(q, zeros, scales, g_idx))
    with pytest.raises(FormatError, match="g_idx holds groups"):
        fmt.dequantize([qweight, qzeros, scales, g_idx + 1], (n_cols, k_rows), **attrs)


def test_awq_gemm_packing_order():
    # row 0: columns 0..7 hold 0..7, so nibble i holds order[i]: the word reads 0x75316420
    assert pack_words(np.array(AWQ_ORDER), 4) == 0x75316420
    qweight = np.array([[0x75316420], [0x01234567]], np.uint32).view(np.int32)
    qzeros = np.zeros((1, 1), np.int32)
    scales = np.ones((1, 8), np.float16)
    got = poot_quant.get("awq:int4").dequantize([qweight, qzeros, scales], (8, 2), group_size=2)
    assert got[:, 0].tolist() == list(range(8))
    # 0x01234567: nibble i = 7 - i, and nibble i is column order[i]
    assert got[:, 1].tolist() == [7 - AWQ_ORDER.index(c) for c in range(8)]


def test_awq_groups_zeros_and_scales(rng):
    k_rows, n_cols, gs = 6, 16, 3
    q = rng.integers(0, 16, (k_rows, n_cols))
    zeros = rng.integers(0, 16, (2, n_cols))
    scales = rng.uniform(-1, 1, (2, n_cols)).astype(np.float16)

    def pack_row(row):
        return [pack_words([row[c * 8 + o] for o in AWQ_ORDER], 4) for c in range(n_cols // 8)]

    qweight = np.array([pack_row(r) for r in q], np.uint32).view(np.int32)
    qzeros = np.array([pack_row(z) for z in zeros], np.uint32).view(np.int32)
    got = poot_quant.get("awq:int4").dequantize([qweight, qzeros, scales], (n_cols, k_rows),
                                                group_size=gs)
    np.testing.assert_array_equal(got, gptq_reference(q, zeros, scales, np.arange(k_rows) // gs))


@pytest.mark.parametrize("name,attrs,bound", [
    ("gptq:int4", {"group_size": 32}, 0.13),
    ("gptq:int4", {"group_size": 32, "sym": False, "act_order": True}, 0.10),
    ("gptq:int4", {"group_size": -1, "sym": False, "version": "v2"}, 0.12),
    ("gptq:int8", {"group_size": 64, "sym": False}, 0.006),
    ("awq:int4", {"group_size": 32}, 0.10),
])
def test_round_trip(name, attrs, bound, rng):
    fmt = poot_quant.get(name)
    w = rng.standard_normal((32, 128)).astype(np.float32)
    sources = fmt.quantize(w, **attrs)
    assert [s.shape for s in sources] == [r.type.shape for r in fmt.roles(w.shape, attrs)]
    back = fmt.dequantize(sources, w.shape, **attrs)
    rel = np.sqrt(np.mean((back - w) ** 2) / np.mean(w ** 2))
    assert rel < bound, rel


def test_refusals():
    gptq = poot_quant.get("gptq:int4")
    with pytest.raises(FormatError, match="multiples of 8"):
        gptq.roles((8, 12), {})
    with pytest.raises(FormatError, match="version"):
        gptq.roles((8, 16), {"version": "v3"})
    with pytest.raises(FormatError, match="GEMM"):
        poot_quant.get("awq:int4").roles((8, 16), {"version": "gemv"})
    with pytest.raises(FormatError, match="'scales' has dtype float32"):
        gptq.dequantize([np.zeros((2, 8), np.int32), np.zeros((1, 1), np.int32),
                         np.zeros((1, 8), np.float32)], (8, 16), group_size=16)
