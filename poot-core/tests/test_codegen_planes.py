"""Bf16 planes for the warpgroup GEMM (lower/planes.py): where they are chosen, and that
the planes the first two kernels write (run by the interpreter) multiply to the
contraction within the split schedule's precision. The GEMM over them is the warpgroup
GEMM's (checked on the GPU: poot-backend-cuda/bench/wgmma_gemm.py)."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen.interp import run
from poot.codegen.lower import lower, planes
from poot.codegen.program import OUT, Wgmma
from poot.codegen.target import FEATURES, TMA, WGMMA
from poot.dtypes import DType
from poot.formats import PackedWeight, get_format
from poot.ir.ops import DenseContraction, PackedContraction
from poot.ir.types import TensorType

F32, BF16 = DType.F32, DType.BF16


def packed(fmt: str, m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    pw = PackedWeight(fmt, (n, k))
    ins = [TensorType((m, k), F32), *[s.type for s in pw.sources()]]
    srcs = [np.asarray(s) for s in get_format(fmt).quantize(
        rng.standard_normal((n, k)).astype(np.float32))]
    dense = np.asarray(pw.dequantize(srcs), np.float64).reshape(n, k)
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    return PackedContraction(pw), ins, [x, *srcs], dense


def plane_product(lowering, args) -> np.ndarray:
    """A' W' from the planes the first two kernels write."""
    arrays = {}
    for kernel in lowering.kernels[:2]:
        for b in kernel.buffers:
            if b.name not in arrays:
                arrays[b.name] = (np.zeros(b.count, b.dtype.numpy) if b.operand is None
                                  else np.ascontiguousarray(args[b.operand]).reshape(-1)
                                  .view(b.dtype.numpy))
        run(kernel, {b.name: arrays[b.name] for b in kernel.buffers})
    m, depth = args[0].shape[0], None
    a = arrays["a_planes"].astype(np.float64)
    depth = a.size // m
    w = arrays["w_planes"].astype(np.float64).reshape(depth, -1)
    return a.reshape(m, depth) @ w


def nmse(got, want) -> float:
    return float(np.sum((got - want) ** 2) / np.sum(want ** 2))


@pytest.mark.parametrize("fmt,m,n,k", [
    ("gguf:Q4_0", 64, 24, 320),     # runs of 64, a K of whole runs
    ("gguf:Q4_K", 70, 16, 256),     # ragged rows
    ("gguf:Q8_0", 64, 40, 96),
    ("fp8:e4m3", 64, 16, 64),       # no runs: pairs of decode_expr
])
def test_planes_multiply_to_the_contraction(fmt, m, n, k):
    op, ins, args, dense = packed(fmt, m, n, k, m + n + k)
    lowering = lower(op, ins, op.infer(ins), FEATURES)
    assert [s.name for s in lowering.scratch] == ["w_planes", "a_planes"]
    got = plane_product(lowering, args)
    assert nmse(got, args[0].astype(np.float64) @ dense.T) < 1e-10


def test_a_16_bit_weight_beside_f32_activations_takes_the_planes():
    rng = np.random.default_rng(3)
    ins = [TensorType((64, 48), F32), TensorType((32, 48), BF16)]
    lowering = lower(DenseContraction(), ins, DenseContraction().infer(ins), FEATURES)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    w = rng.standard_normal((32, 48)).astype(BF16.numpy)
    got = plane_product(lowering, [x, w])
    assert nmse(got, x.astype(np.float64) @ w.astype(np.float64).T) < 1e-10


def test_the_gemm_reads_the_planes_and_writes_the_output():
    op, ins, _, _ = packed("gguf:Q4_0", 128, 64, 256, 1)
    gemm = lower(op, ins, op.infer(ins), FEATURES).kernels[-1]
    assert any(isinstance(s, Wgmma) for s in gemm.statements())
    assert {b.name for b in gemm.buffers if b.operand is None} == {"a_planes", "w_planes"}
    assert any(b.operand == OUT for b in gemm.buffers)
    assert {t.buffer for t in gemm.tensor_maps} == {"a_planes", "w_planes"}


@pytest.mark.parametrize("case", ["few rows", "no wgmma", "no tma", "too large", "f32 weight"])
def test_the_split_or_fma_schedules_where_the_planes_do_not_apply(case, monkeypatch):
    features, m = FEATURES, 64
    op, ins, _, _ = packed("gguf:Q4_0", m, 64, 256, 2)
    if case == "few rows":
        op, ins, _, _ = packed("gguf:Q4_0", planes.PLANE_MIN_ROWS - 1, 64, 256, 2)
    elif case == "no wgmma":
        features = FEATURES - {WGMMA}
    elif case == "no tma":
        features = FEATURES - {TMA}
    elif case == "too large":
        monkeypatch.setattr(planes, "PLANE_MAX_BYTES", 6 * 256 * (64 + 64) - 1)
    else:
        op, ins = DenseContraction(), [TensorType((m, 64), F32), TensorType((32, 64), F32)]
    lowering = lower(op, ins, op.infer(ins), features)
    assert not any(s.name.endswith("planes") for s in lowering.scratch)



@pytest.mark.parametrize("m", [planes.IN_PLACE_MIN_ROWS - 1, planes.IN_PLACE_MIN_ROWS])
def test_a_weight_read_in_place_takes_the_planes_from_fewer_rows(m):
    """A bf16 weight the GEMM reads where it lies takes the planes from IN_PLACE_MIN_ROWS
    rows; a packed one, written to planes every step, only from PLANE_MIN_ROWS."""
    ins = [TensorType((m, 256), F32), TensorType((64, 256), BF16)]
    lowering = lower(DenseContraction(), ins, DenseContraction().infer(ins), FEATURES)
    assert [s.name for s in lowering.scratch if s.name.endswith("planes")] == \
        (["a_planes"] if m >= planes.IN_PLACE_MIN_ROWS else [])
    op, ins, _, _ = packed("gguf:Q4_0", m, 64, 256, 2)
    assert not any(s.name.endswith("planes") for s in lower(op, ins, op.infer(ins),
                                                                FEATURES).scratch)
