"""CUDA printing: refusals, the cache, and the shape of the printed code."""
from __future__ import annotations

import pytest
from poot.codegen.lower import lower
from poot.dtypes import DType
from poot.errors import DtypeLowering
from poot.ir.ops import Binary, BinaryOp, Reduce, ReduceOp
from poot.ir.types import TensorType
from poot_cuda import compiler
from poot_cuda.printer import CudaPrinter

F32, BF16 = DType.F32, DType.BF16


def test_printer_refuses_a_dtype_its_device_lacks():
    t = TensorType((4, 8), BF16)
    kernel = lower(Binary(BinaryOp.Add), [t, t], t).kernels[0]
    printer = CudaPrinter("sm_75", supported={F32, DType.I32, DType.U32, DType.F16})
    with pytest.raises(DtypeLowering) as e:
        printer.source(kernel)
    assert "bf16" in str(e.value) and "sm_75" in str(e.value) and "cuda" in str(e.value)


def test_workgroup_reduction_uses_warp_shuffles_then_shared_memory():
    t = TensorType((3, 1000), F32)
    kernel = lower(Reduce(ReduceOp.Max, -1, False), [t], TensorType((3,), F32)).kernels[0]
    src = CudaPrinter().source(kernel)
    assert "__shfl_xor_sync" in src and "__syncthreads();" in src
    assert 'extern "C" __global__' in src and "poot_fmax" in src


def test_cache_key_follows_source_and_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    t = TensorType((5,), F32)
    kernel = lower(Binary(BinaryOp.Mul), [t, t], t).kernels[0]
    src = CudaPrinter().source(kernel)
    a = compiler.compile_cubin(src, kernel.name, "sm_90")
    assert len(list((tmp_path / "cuda").glob("*.cubin"))) == 1
    assert compiler.compile_cubin(src, kernel.name, "sm_90") == a
    src80 = CudaPrinter("sm_80").source(kernel)       # no programmatic launch protocol
    assert "griddepcontrol" in src and "griddepcontrol" not in src80
    compiler.compile_cubin(src80, kernel.name, "sm_80")
    assert compiler.cache_key(src, "sm_90") != compiler.cache_key(src, "sm_80")
    assert len(list((tmp_path / "cuda").glob("*.cubin"))) == 2


def test_cache_key_follows_the_headers_not_their_path(tmp_path, monkeypatch):
    """A fresh environment with the same headers elsewhere finds its kernels in the cache;
    a changed header builds them again."""
    import shutil

    src = 'extern "C" __global__ void k() {}'
    key = compiler.cache_key(src, "sm_90")
    copy = tmp_path / "include"
    shutil.copytree(compiler.include_dirs()[0], copy)
    monkeypatch.setattr(compiler, "include_dirs", lambda: (str(copy),))
    compiler.headers_digest.cache_clear()
    try:
        assert compiler.cache_key(src, "sm_90") == key
        header = copy / "cuda_fp16.h"
        header.write_bytes(header.read_bytes() + b"\n")
        compiler.headers_digest.cache_clear()
        assert compiler.cache_key(src, "sm_90") != key
    finally:
        compiler.headers_digest.cache_clear()


def test_a_batch_compiles_kernels_in_one_program_cached_apart(tmp_path, monkeypatch):
    """Inside compiler.batch() kernels of one header share an NVRTC program, cached under
    its own key: the kernel's own key still names only the CUBIN of the kernel alone."""
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    t = TensorType((5,), F32)
    kernels = [lower(Binary(op), [t, t], t).kernels[0] for op in (BinaryOp.Mul, BinaryOp.Sub)]
    sources = [CudaPrinter().source(k) for k in kernels]
    with compiler.batch():
        refs = [compiler.defer(src, k.name, "sm_90") for src, k in zip(sources, kernels)]
        assert not list((tmp_path / "cuda").glob("*"))      # nothing built yet
    unit = refs[0].load()
    assert refs[1].load() == unit
    assert all(f".text.{k.name}\0".encode() in unit for k in kernels)
    assert [p.name.startswith("unit-") for p in (tmp_path / "cuda").glob("*.cubin")] == [True]
    alone = compiler.compile_cubin(sources[0], kernels[0].name, "sm_90")
    assert alone != unit and refs[0].load() == alone     # the kernel's own build, once made


def test_a_batch_names_the_kernel_nvrtc_rejects(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    t = TensorType((5,), F32)
    kernel = lower(Binary(BinaryOp.Mul), [t, t], t).kernels[0]
    good = CudaPrinter().source(kernel)
    broken = compiler.split(good)[0] + 'extern "C" __global__ void broken() { nope; }\n'
    with pytest.raises(compiler.CompileError) as e:
        with compiler.batch():
            compiler.defer(good, kernel.name, "sm_90")
            compiler.defer(broken, "broken", "sm_90")
    assert "kernel broken" in str(e.value) and "nope" in str(e.value)


def test_compile_error_carries_the_nvrtc_log():
    with pytest.raises(compiler.CompileError) as e:
        compiler.compile_cubin('extern "C" __global__ void broken() { nope; }', "broken")
    assert "nope" in str(e.value)


@pytest.mark.parametrize("width", [4, None])
def test_reduction_in_a_workgroup_smaller_than_a_warp_compiles(width):
    """Ragged workgroups (not a multiple of 32) reduce through shared memory."""
    from poot.codegen.builder import KernelBuilder
    from poot.codegen.program import OUT, Access, global_id

    kb = KernelBuilder("ragged", (3,), (24,))
    x = kb.buffer("in0", F32, Access.READ, 72, operand=0)
    kb.buffer("out", F32, Access.WRITE, 72, operand=OUT)
    s = kb.reduce("s", ReduceOp.Sum, x[global_id()], width)
    kb.store("out", global_id(), s)
    src = CudaPrinter().source(kb.finish())
    assert "__shfl_xor_sync" not in src and "poot_red_s[" in src
    assert compiler.compile_cubin(src, "ragged")[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch, dp2a", [("sm_90", True), ("sm_60", False)])
def test_integer_gemv_prints_dp2a_where_the_target_has_it(arch, dp2a):
    """sm_61+ declares DOT2: a Q4_0 GEMV takes the integer schedule and prints dp2a calls;
    printed for an older target, Dot2 becomes plain multiply-adds."""
    import poot_quant  # noqa: F401 - registers the formats
    from poot.formats import PackedWeight
    from poot.ir.ops import PackedContraction
    from poot_cuda.capability import kernel_features, parse_arch

    pw = PackedWeight("gguf:Q4_0", (8, 1024))
    op = PackedContraction(pw)
    ins = [TensorType((1, 1024), F32)] + [s.type for s in pw.sources()]
    kernel = lower(op, ins, op.infer(ins), kernel_features(9, 0)).kernels[0]
    src = CudaPrinter(arch).source(kernel)
    assert ("poot_dp2a_lo(" in src.split("__global__")[1]) is dp2a
    assert kernel_features(*parse_arch(arch)) >= ({"dot2.i16.u8"} if dp2a else set())


@pytest.mark.parametrize("shape", [(576, 576), (4096, 4096)], ids=["one-trip", "staged"])
def test_integer_gemv_loads_its_weights_before_awaiting_inputs(shape):
    """The integer GEMV issues its first trip's weight loads, then griddepcontrol.wait, then
    reads the activations: the weight latency overlaps the kernel before it, and the
    launch overlaps only where the weight operands are plan constants."""
    import poot_quant  # noqa: F401 - registers the formats
    from poot.formats import PackedWeight
    from poot.ir.ops import PackedContraction
    from poot_cuda.capability import kernel_features
    from poot_cuda.kernels import may_overlap

    pw = PackedWeight("gguf:Q4_0", shape)
    op = PackedContraction(pw)
    ins = [TensorType((1, shape[1]), F32)] + [s.type for s in pw.sources()]
    kernel = lower(op, ins, op.infer(ins), kernel_features(9, 0)).kernels[0]
    weights = frozenset(range(1, len(ins)))
    assert kernel.early_reads() == weights
    body = CudaPrinter("sm_90").source(kernel).split("__global__")[1]
    wait = body.index("griddepcontrol.wait")
    assert body.count("griddepcontrol.wait") == 1
    assert body.index("in1[") < wait < body.index("in0[")
    assert may_overlap(kernel, weights) and not may_overlap(kernel, frozenset())
    assert "griddepcontrol" not in CudaPrinter("sm_80").source(kernel)
