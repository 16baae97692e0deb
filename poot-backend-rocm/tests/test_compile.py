"""hiprtc without a GPU: the toolchain, refused targets, the cache, batched units,
compile errors, and code-object metadata."""
from __future__ import annotations

import pytest
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Load
from poot.codegen.program import Access, local_index
from poot.dtypes import DType
from poot_rocm import codeobject, compiler, toolchain
from poot_rocm.archs import target
from poot_rocm.printer import HipPrinter

F32 = DType.F32


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh $POOT_CACHE (the toolchain's own facts included)."""
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    return tmp_path / "rocm"


def scale_kernel(name: str, factor: float):
    kb = KernelBuilder(name, (2,), (64,))
    kb.buffer("x", F32, Access.READ, 128)
    kb.buffer("out", F32, Access.WRITE, 128)
    i = kb.let("i", local_index())
    kb.store("out", i, Load("x", i, F32) * factor)
    return kb.finish()


def test_toolchain_is_found_and_versioned():
    tc = toolchain.locate()
    assert tc.version > 0 and tc.release.count(".") == 2
    assert (tc.root / "lib" / "libhiprtc.so").exists()


def test_a_target_the_toolchain_cannot_build_is_refused_by_name(cache):
    ok, why = toolchain.buildable("gfx90a")
    assert ok, why
    tc = toolchain.locate()
    if toolchain.buildable("gfx942")[0]:
        pytest.skip(f"{tc} builds gfx942")
    with pytest.raises(toolchain.UnsupportedTarget) as e:
        toolchain.require("gfx942")       # ROCm 5.2's hiprtc aborts on it: asked in a child
    assert "gfx942" in str(e.value) and tc.release in str(e.value)
    assert e.value.backend == "rocm" and e.value.device == "gfx942"


def test_code_objects_are_cached_by_source_target_and_toolchain(cache, monkeypatch):
    t = target("gfx90a")
    src = HipPrinter(t).source(scale_kernel("k_scale", 2.0))
    ref = compiler.compile_code(src, "k_scale", t)
    co = codeobject.read(ref.load())[0]
    assert co.gfx == "gfx90a" and co.kernel("k_scale").wavefront == 64
    monkeypatch.setattr(compiler, "hiprtc", lambda *a: pytest.fail("cache missed"))
    assert compiler.compile_code(src, "k_scale", t) == ref
    assert compiler.cache_key(src, target("gfx1030")) != ref.key


def test_a_batch_builds_one_unit_for_many_kernels(cache):
    t = target("gfx1030")
    p = HipPrinter(t)
    items = [(f"k_{i}", p.source(scale_kernel(f"k_{i}", float(i)))) for i in range(5)]
    with compiler.batch(workers=1):
        refs = [compiler.compile_code(src, name, t) for name, src in items]
        with pytest.raises(compiler.CompileError, match="has not ended"):
            refs[0].load()
    codes = {r.load() for r in refs}
    assert len(codes) == 1                     # one unit's code object holds all five
    co = codeobject.read(codes.pop())[0]
    assert sorted(k.name for k in co.kernels) == sorted(n for n, _ in items)
    assert all(k.wavefront == 32 for k in co.kernels)


def test_a_bad_kernel_in_a_unit_is_named(cache):
    t = target("gfx90a")
    good = HipPrinter(t).source(scale_kernel("k_good", 3.0))
    bad = good.replace("k_good", "k_bad").replace("out[i] =", "out[i] = undeclared +")
    with pytest.raises(compiler.CompileError) as e:
        with compiler.batch(workers=1):
            compiler.build([("k_good", good), ("k_bad", bad)], t)
    assert e.value.op == "k_bad" and "undeclared" in str(e.value)
    assert compiler.cached(compiler.cache_key(good, t)) is not None


def test_wavefront_guard_stops_a_mismatched_build(cache):
    src = HipPrinter("gfx1030:w64").source(scale_kernel("k_w64", 1.0))
    with pytest.raises(compiler.CompileError, match="printed for wave64"):
        compiler.hiprtc(src, "k_w64", target("gfx1030"))    # built as wave32


def test_damaged_code_objects_are_refused():
    with pytest.raises(codeobject.CodeObjectError):
        codeobject.read(b"not a code object")
    with pytest.raises(codeobject.CodeObjectError):
        codeobject.read(codeobject.BUNDLE_MAGIC + b"\x02\x00")
    bundle = codeobject.BUNDLE_MAGIC + (1).to_bytes(8, "little") + \
        (10 ** 9).to_bytes(8, "little") + (8).to_bytes(8, "little") + (6).to_bytes(8, "little") \
        + b"amdgcn"
    with pytest.raises(codeobject.CodeObjectError, match="past the end"):
        codeobject.read(bundle)


def test_planning_for_an_unbuildable_target_is_refused_before_any_compile():
    import poot
    from poot import ops
    from poot.plan import plan
    from poot_rocm.backend import RocmBackend

    if toolchain.buildable("gfx942")[0]:
        pytest.skip(f"{toolchain.locate()} builds gfx942")
    b = RocmBackend()
    dev = b.compile_only_device("gfx942")
    g = poot.trace(lambda x: ops.exp(x), poot.spec((4, 8), name="x"))
    with pytest.raises(toolchain.UnsupportedTarget, match="cannot build code for gfx942"):
        plan(poot.compile(g, (b, dev)), (b, dev))


def test_warpgroup_statements_are_refused_by_name(monkeypatch):
    """HIP shares the CUDA-style dialect but not sm_90a's bulk copies and warpgroup
    products: a kernel holding them is refused, never printed half-way (a small tile, so
    that the shared-memory limit is not what refuses it)."""
    from poot.codegen.lower import lower, wgmma
    from poot.codegen.target import FEATURES
    from poot.errors import UnsupportedOp
    from poot.ir.ops import MatMul
    from poot.ir.types import TensorType

    small = wgmma.Schedule(bm=64, bn=64, stages=2)
    monkeypatch.setattr(wgmma, "SCHEDULE", small)
    monkeypatch.setattr(wgmma, "NARROW", small)
    ins = [TensorType((128, 64), DType.BF16), TensorType((64, 128), DType.BF16)]
    kernel = lower(MatMul(), ins, MatMul().infer(ins), FEATURES).kernels[0]
    with pytest.raises(UnsupportedOp, match="prints no (RegisterBudget|Mbar|TmaLoad|Wgmma)"):
        HipPrinter(target("gfx90a")).source(kernel)
