"""The Vulkan runtime: device ranking, transfers, limits, recorded steps and their replay."""
import dataclasses

import numpy as np
import pytest
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Load, f32, ge, i32
from poot.codegen.program import Access, global_id
from poot.dtypes import DType
from poot.errors import DtypeLowering, LimitExceeded, LoweringError, UnsupportedOp
from poot_vulkan.barrier import FORMS
from poot_vulkan.compiler import cache_path, compile_glsl
from poot_vulkan.launch import run_kernels
from poot_vulkan.memory import Transfers, VulkanBuffer
from poot_vulkan.step import Copy

F32 = DType.F32


def _axpy(n: int, workgroup: int = 64):
    """y = a[0] * x + y over n elements."""
    gid = global_id()
    kb = KernelBuilder("axpy", grid=(-(-n // workgroup),), workgroup=(workgroup,))
    kb.buffer("a", F32, Access.READ, 1)
    kb.buffer("x", F32, Access.READ, n)
    kb.buffer("y", F32, Access.READ_WRITE, n)
    with kb.if_(ge(i32(n - 1), gid)):
        kb.store("y", gid, Load("a", i32(0), F32) * Load("x", gid, F32) + Load("y", gid, F32))
    return kb.finish()


def _limited(dev, **limits):
    return dataclasses.replace(dev.facts, limits={**dev.facts.limits, **limits})


def test_software_devices_rank_last_and_are_used_only_when_named(vulkan_target):
    from poot.plugin import select_backend

    backend, device = vulkan_target
    kinds = [dict(d.info)["device_type"] for d in backend.probe()]
    order = ["discrete", "integrated", "virtual", "other", "cpu"]
    assert kinds == sorted(kinds, key=order.index)
    if device.is_software:  # lavapipe: never picked automatically
        assert select_backend()[0].name != "vulkan"
    assert select_backend("vulkan") == (backend, device)


def test_capability_table_follows_the_device(vulkan_device):
    from poot.capability import Use
    from poot_vulkan.capability import capability_table

    facts = vulkan_device.facts
    table = capability_table(facts, "vulkan:0", frozenset())
    assert table.uses(DType.BF16) == Use.STORAGE | Use.CONVERT | Use.DOT  # storage-only
    bare = dataclasses.replace(facts, features=facts.features - {"shaderFloat16"})
    assert capability_table(bare, "vulkan:0", frozenset()).uses(DType.F16) == Use.NONE


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16])
def test_select_on_16_bit_floats_is_refused(vulkan_target, dtype):
    from poot.ir import ops as O
    from poot.ir.types import TensorType

    backend, device = vulkan_target
    t = TensorType((4,), dtype)
    with pytest.raises(DtypeLowering, match="SPIR-V"):
        backend.capabilities(device).check(O.Select(), [TensorType((4,), DType.I32), t, t], t)


def test_printer_refuses_dtypes_the_device_lacks(vulkan_device):
    from poot_vulkan.glsl import GlslPrinter

    kb = KernelBuilder("halve", grid=(1,), workgroup=(8,))
    kb.buffer("h", DType.F16, Access.READ_WRITE, 8)
    kb.store("h", global_id(), Load("h", global_id(), DType.F16))
    bare = dataclasses.replace(vulkan_device.facts,
                               features=vulkan_device.facts.features - {"shaderFloat16"})
    with pytest.raises(DtypeLowering, match="f16"):
        GlslPrinter(bare).source(kb.finish())


def test_limits_are_refused_before_anything_runs(vulkan_device):
    from poot_vulkan.glsl import GlslPrinter

    with pytest.raises(LimitExceeded, match="maxComputeWorkGroupInvocations"):
        GlslPrinter(_limited(vulkan_device, maxComputeWorkGroupInvocations=32)).source(
            _axpy(100, 64))
    with pytest.raises(LimitExceeded, match="maxStorageBufferRange"):
        GlslPrinter(_limited(vulkan_device, maxStorageBufferRange=256)).source(_axpy(100))
    kb = KernelBuilder("shared", grid=(1,), workgroup=(8,))
    kb.buffer("o", F32, Access.WRITE, 8)
    kb.shared("t", F32, 4096)
    kb.store("o", global_id(), f32(1.0))
    with pytest.raises(LimitExceeded, match="maxComputeSharedMemorySize"):
        GlslPrinter(_limited(vulkan_device, maxComputeSharedMemorySize=1024)).source(
            kb.finish())


def test_grid_over_the_per_dimension_limit_folds_into_y(vulkan_device):
    n = 64 * 10 - 3  # ten groups over a limit of 4: 4 x 3 with two idle groups
    rng = np.random.default_rng(2)
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    facts = _limited(vulkan_device, **{"maxComputeWorkGroupCount.x": 4})
    out, step = run_kernels(vulkan_device, [_axpy(n)],
                            {"a": np.array([3.0], np.float32), "x": x, "y": y.copy()}, facts)
    assert step.ops[0].groups == (4, 3, 1)
    np.testing.assert_allclose(out["y"], 3 * x + y, rtol=1e-6, atol=1e-6)


def test_dependent_dispatches_get_a_barrier_and_independent_ones_none(vulkan_device):
    n = 1000
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    out, step = run_kernels(vulkan_device, [_axpy(n), _axpy(n)],
                            {"a": np.array([2.0], np.float32), "x": x, "y": y.copy()})
    np.testing.assert_allclose(out["y"], 2 * x + (2 * x + y), rtol=1e-5, atol=1e-5)
    assert step.barriers == 1  # y is written then read: one barrier between the two


def test_unaligned_writes_and_reads_keep_neighbouring_bytes(vulkan_device):
    t = Transfers(vulkan_device)
    buf = VulkanBuffer(vulkan_device, 13, "bytes")
    t.write(buf, 0, np.arange(13, dtype=np.uint8))
    t.write(buf, 5, np.array([200, 201, 202], np.uint8))
    want = np.arange(13, dtype=np.uint8)
    want[5:8] = [200, 201, 202]
    np.testing.assert_array_equal(t.read(buf, 0, 13), want)
    np.testing.assert_array_equal(t.read(buf, 6, 3), want[6:9])


def test_compiled_kernels_are_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    src = f"#version 450\nlayout(local_size_x = 1) in;\nvoid main() {{ /* {tmp_path} */ }}\n"
    spirv = compile_glsl(src, "empty")
    assert spirv[:4] == b"\x03\x02\x23\x07"  # the SPIR-V magic number, little endian
    key = next(tmp_path.glob("vulkan/*/*.spv"))
    assert key.read_bytes() == spirv and key == cache_path(key.stem)


def test_invalid_glsl_is_a_lowering_error_with_the_source():
    with pytest.raises(LoweringError, match="(?s)glslang rejected.*int x = ;"):
        compile_glsl("#version 450\nlayout(local_size_x = 1) in;\nvoid main() { int x = ; }\n",
                     "broken")


def test_a_plan_replays_its_recording_with_slot_rewrites(vulkan_target):
    """A two-input graph on the public path: every step resubmits one command buffer
    whose first commands copy the slots from their staging twins (none where device
    memory is mapped: test_vulkan_validation.py runs both paths)."""
    import poot
    from poot.conformance.roles import input_role
    from poot.ir import ops as O
    from poot.ir.builder import Builder
    from poot.plan import plan
    from poot.runtime.executor import Executor

    b = Builder("replay", compiler=True)
    a, c = (b.slot(input_role(F32), (3, 70), f"x{i}") for i in range(2))
    e = b.eqn(O.Unary(O.UnaryOp.Exp), a)
    b.result(b.eqn(O.Binary(O.BinaryOp.Add), b.eqn(O.Binary(O.BinaryOp.Mul), e, c), a))
    graph = b.finish()
    ex = Executor(plan(poot.compile(graph, vulkan_target), vulkan_target), {})
    rng = np.random.default_rng(5)
    for _ in range(3):
        a, b = (rng.standard_normal((3, 70)).astype(np.float32) for _ in range(2))
        got = ex.step({"x0": a, "x1": b}).result
        np.testing.assert_allclose(got, np.exp(a) * b + a, rtol=1e-5, atol=1e-6)
    assert ex.executable.recorded and ex.executable.step.replays == 3
    from poot.plan import ARENA

    rt, (_, place) = ex.runtime, ex.plan.outputs[0]
    step = ex.executable.step
    if ex.buffers[ARENA].mapped is None:
        # the result was copied to the host by the step itself; a write to its buffer
        # drops that
        assert (ex.buffers[ARENA], place.offset, place.nbytes) in rt.fresh
        assert len(step.uploads) == 2
    else:  # mapped device memory: slots written and the result read in place
        assert not rt.fresh and not step.uploads
        assert not any(isinstance(op, Copy) for op in step.ops)
    rt.write(ex.buffers[ARENA], place.offset, np.zeros(place.nbytes, np.uint8))
    assert not rt.fresh
    assert not ex.read(place).any()


def test_the_profile_times_every_operation_and_polled_waits_match(vulkan_target,
                                                                  vulkan_device):
    """profile() gives each upload, dispatch and copy of a recorded step a GPU time, the
    times summing to the span; the step computes the same after it, whether its fence is
    polled (as on a GPU) or slept on, and recorded with every barrier form (sync2 refused
    where the device lacks it)."""
    from poot.conformance.roles import input_role
    from poot.ir import ops as O
    from poot.ir.builder import Builder
    from poot.plan import plan
    from poot.runtime.executor import Executor
    from poot_vulkan.profile import profile
    from poot_vulkan.step import RecordedStep

    b = Builder("profiled", compiler=True)
    x = b.slot(input_role(F32), (4, 50), "x0")
    b.result(b.eqn(O.Reduce(O.ReduceOp.Sum, 1), b.eqn(O.Unary(O.UnaryOp.Exp), x)))
    ex = Executor(plan(b.finish(), vulkan_target), {})
    a = np.random.default_rng(1).standard_normal((4, 50)).astype(np.float32)
    want = np.exp(a).sum(1)
    np.testing.assert_allclose(ex.step({"x0": a}).result, want, rtol=1e-5)
    step = ex.executable.step
    prof = profile(step, runs=3)
    assert len(prof.ops) == len(step.uploads) + len(step.ops)
    staged = 0 if vulkan_device.direct else 1  # the slot's upload; the readback
    # exp | sum, and with staging an upload before and a readback after
    assert sum(op.barrier for op in prof.ops) == step.barriers == 1 + 2 * staged
    assert all(op.ns >= 0 for op in prof.ops)
    assert prof.span_ns == pytest.approx(sum(op.ns for op in prof.ops))
    kinds = {k.kind: k.count for k in prof.by_kind()}
    assert kinds.pop("upload", 0) == staged and kinds.pop("copy", 0) == staged
    assert sum(kinds.values()) == ex.executable.dispatches
    assert "sum" in prof.table()
    spin = vulkan_device.spin
    try:
        for vulkan_device.spin in (True, False):
            np.testing.assert_allclose(ex.step({"x0": a}).result, want, rtol=1e-5)
    finally:
        vulkan_device.spin = spin
    for form in FORMS:
        if form == "sync2" and vulkan_device.barrier2 is None:
            with pytest.raises(UnsupportedOp, match="synchronization2"):
                RecordedStep(vulkan_device, step.ops, step.uploads, barrier=form)
            continue
        other = RecordedStep(vulkan_device, step.ops, step.uploads, barrier=form)
        other.submit()
        np.testing.assert_allclose(ex.read(ex.plan.outputs[0][1]).view(np.float32), want,
                                   rtol=1e-5)
        other.destroy()
