"""The warpgroup GEMM on CUDA without a GPU: which architectures declare the features,
what the printer makes of the statements, and that NVRTC builds it for sm_90a."""
from __future__ import annotations

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
