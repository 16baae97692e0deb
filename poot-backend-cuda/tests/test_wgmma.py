"""The warpgroup GEMM on CUDA without a GPU: which architectures declare the features,
what the printer makes of the statements, and that NVRTC builds it for sm_90a."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen.lower import lower, wgmma
from poot.codegen.target import TMA, WGMMA
from poot.dtypes import DType
from poot.ir.ops import MatMul
from poot.ir.types import TensorType
from poot_cuda.capability import arch_of, kernel_features
from poot_cuda.compiler import compile_cubin
from poot_cuda.printer import CudaPrinter, dynamic_shared_bytes


@pytest.mark.parametrize("major,minor,arch,declared", [
    (9, 0, "sm_90a", True), (9, 0, "sm_90", False), (8, 0, "sm_80", False),
    (12, 0, "sm_120", False)])
def test_warpgroup_features_need_an_sm_90a_build(major, minor, arch, declared):
    assert ({WGMMA, TMA} <= kernel_features(major, minor, arch)) is declared


def test_9_0_devices_build_for_sm_90a():
    assert arch_of(9, 0) == "sm_90a" and arch_of(8, 9) == "sm_89"


def _kernel(m=200, k=136, n=520):
    a, w = TensorType((m, k), DType.BF16), TensorType((k, n), DType.BF16)
    features = kernel_features(9, 0, "sm_90a")
    return lower(MatMul(), [a, w], MatMul().infer([a, w]), features).kernels[0]


@pytest.mark.parametrize("m,n,sc", [(2048, 2056, wgmma.SCHEDULE), (200, 520, wgmma.NARROW)])
def test_printer_renders_tensor_maps_copies_and_warpgroup_products(m, n, sc):
    kernel = _kernel(m, 136, n)
    src = CudaPrinter("sm_90a").source(kernel)
    assert "const __grid_constant__ poot_tensor_map map_a" in src
    assert "__launch_bounds__(384, 1)" in src            # setmaxnreg needs the cap
    assert "cp.async.bulk.tensor.2d" in src and "mbarrier.try_wait.parity" in src
    assert f"wgmma.mma_async.sync.aligned.m64n{sc.bn}k16.f32.bf16.bf16" in src
    assert "setmaxnreg.inc.sync.aligned.u32 232" in src
    assert "__syncwarp();" in src and "*reinterpret_cast<uint4*>(&out[" in src   # staged rows
    # the dynamic block is moved up to the 1024-byte swizzle alignment, with room for it;
    # past the tiles and barriers each consumer warp's 16 staged rows of 64 + 8 values
    tiles_and_barriers = sc.stages * sc.stage_bytes(DType.BF16) + 4 * 4 * sc.stages
    staged = sc.consumers * 4 * 16 * (64 + 8) * 2
    assert "& 1023u" in src
    assert dynamic_shared_bytes(kernel) == tiles_and_barriers + staged + 1024 - 16


def test_nvrtc_builds_the_warpgroup_kernel_for_sm_90a(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    kernel = _kernel(256, 128, 256)
    cubin = compile_cubin(CudaPrinter("sm_90a").source(kernel), kernel.name, "sm_90a")
    assert cubin[:4] == b"\x7fELF"


def test_the_backend_declares_the_features_of_the_arch_it_builds_for():
    from poot_cuda.backend import CudaBackend

    backend = CudaBackend()
    assert {WGMMA, TMA} <= backend.features(backend.compile_only_device("sm_90a"))
    assert not {WGMMA, TMA} & backend.features(backend.compile_only_device("sm_90"))


@pytest.mark.parametrize("fmt", ["gguf:Q4_K", "gguf:Q4_0"])
def test_nvrtc_builds_the_planes_of_a_packed_prefill_for_sm_90a(fmt, tmp_path, monkeypatch):
    """A packed contraction of 128 rows: its weight and activation planes, then the
    warpgroup GEMM over them (poot.codegen.lower.planes)."""
    from poot.formats import PackedWeight
    from poot.ir.ops import PackedContraction

    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    pw = PackedWeight(fmt, (1024, 4096))
    ins = [TensorType((128, 4096), DType.F32), *[s.type for s in pw.sources()]]
    op = PackedContraction(pw)
    program = lower(op, ins, op.infer(ins), kernel_features(9, 0, "sm_90a"))
    names = [k.name.rsplit("_", 1)[-1] for k in program.kernels]
    assert names[:2] == ["wplanes", "aplanes"]
    for kernel in program.kernels:
        cubin = compile_cubin(CudaPrinter("sm_90a").source(kernel), kernel.name, "sm_90a")
        assert cubin[:4] == b"\x7fELF"


def test_a_bf16_weight_is_read_in_place_beside_two_activation_planes():
    """A dense bf16 weight at prefill rows (poot.codegen.lower.planes): no weight planes;
    the activation's [hi | lo] planes, a note per tile row of whether any lo is nonzero,
    then the warpgroup GEMM reading the weight K-major through a bf16 view of its operand.
    The first two kernels run in the interpreter: a tile row of bf16 values (the `fast`
    precision's activations) is noted 0, so the GEMM multiplies its first plane only."""
    import ml_dtypes
    from poot.codegen.interp import operand_words, run
    from poot.ir.ops import DenseContraction

    m, k, n = 256, 512, 256
    ins = [TensorType((m, k), DType.F32), TensorType((n, k), DType.BF16)]
    op = DenseContraction()
    program = lower(op, ins, op.infer(ins), kernel_features(9, 0, "sm_90a"))
    planes, notes, gemm = program.kernels
    assert [planes.name[-8:], notes.name[-7:]] == ["_aplanes", "_lorows"]
    view = next(b for b in gemm.buffers if b.name == "w_tile")
    assert (view.dtype, view.operand, view.count) == (DType.BF16, 1, n * k)
    (map_w,) = [t for t in gemm.tensor_maps if t.name == "map_w"]
    assert (map_w.rows, map_w.cols, map_w.box_cols) == (n, k, 64)
    src = CudaPrinter("sm_90a").source(gemm)
    assert "k_tiles = (lo_rows[" in src and f"? {2 * k // 64} : {k // 64})" in src

    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:128] = x[:128].astype(ml_dtypes.bfloat16).astype(np.float32)   # tile row 0: bf16
    arrays = {}
    for kernel in (planes, notes):
        for b in kernel.buffers:
            if b.name not in arrays:
                arrays[b.name] = operand_words(x, b) if b.operand == 0 else \
                    np.zeros(b.count, b.dtype.numpy)
        run(kernel, {b.name: arrays[b.name] for b in kernel.buffers})
    a = arrays["a_planes"].reshape(m, 2, k).astype(np.float32)
    def bf16(v):        # halfway cases away from zero, as mma_operands.bf16_bits rounds
        return ((v.view(np.uint32) + np.uint32(0x8000)) & np.uint32(0xFFFF0000)).view(np.float32)
    hi = bf16(x)
    assert np.array_equal(a[:, 0], hi) and np.array_equal(a[:, 1], bf16(x - hi))
    assert not a[:128, 1].any() and a[128:, 1].any()
    assert list(arrays["lo_rows"]) == [0, 1]
