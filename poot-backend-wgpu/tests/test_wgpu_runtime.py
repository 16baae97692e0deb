"""The runtime on hand-written WGSL: buffers, transfers, limits, recorded steps, replay."""
import numpy as np
import pytest
from poot.errors import BindError, LimitExceeded, LoweringError
from poot_wgpu import memory
from poot_wgpu.kernel import Dispatch, KernelCache, workgroup_grid
from poot_wgpu.step import BufferCopy, RecordedStep

# y = a * x + y, with `a` read from a one-word slot; linear group id over x and y.
AXPY = """
@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let i = (wid.x + wid.y * nwg.x) * 64u + lid;
  if (i >= arrayLength(&y)) { return; }
  y[i] = a[0] * x[i] + y[i];
}
"""


def _axpy(dev, n, rng):
    """One buffer holding a, x, y at 256-byte aligned offsets (a plan's arena)."""
    offsets = {"a": 0, "x": 256, "y": 256 + memory.align(4 * n, 256)}
    arena = memory.WgpuBuffer(dev, offsets["y"] + 4 * n, "arena")
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    memory.write(dev, arena, offsets["x"], x)
    memory.write(dev, arena, offsets["y"], y)
    kernel = KernelCache(dev).get(AXPY, 3, label="axpy")
    group = kernel.bind([memory.storage_binding(dev, arena, offsets[k], 4 if k == "a" else 4 * n,
                                                k) for k in "axy"])
    return arena, offsets, x, y, Dispatch(kernel, group, workgroup_grid(dev, -(-n // 64)))


def test_unaligned_writes_and_reads_keep_neighbouring_bytes(wgpu_device):
    buf = memory.WgpuBuffer(wgpu_device, 13, "bytes")
    assert buf.gpu.size == 16
    memory.write(wgpu_device, buf, 0, np.arange(1, 14, dtype=np.uint8))
    memory.write(wgpu_device, buf, 5, np.array([200, 201, 202], np.uint8))  # inside words
    got = memory.read(wgpu_device, buf, 3, 7)
    assert got.tolist() == [4, 5, 200, 201, 202, 9, 10]
    with pytest.raises(BindError):
        memory.write(wgpu_device, buf, 14, np.zeros(4, np.uint8))


def test_buffer_over_max_buffer_size_is_refused(limited):
    dev = limited(max_buffer_size=1024)
    memory.WgpuBuffer(dev, 1024, "fits")
    with pytest.raises(LimitExceeded, match="max-buffer-size 1024"):
        memory.WgpuBuffer(dev, 1025, "too big")


def test_binding_limits_are_typed_refusals(limited):
    dev = limited(max_storage_buffer_binding_size=256)
    buf = memory.WgpuBuffer(dev, 1024, "arena")
    memory.storage_binding(dev, buf, 256, 256, "fits")
    with pytest.raises(LimitExceeded, match="max-storage-buffer-binding-size 256") as e:
        memory.storage_binding(dev, buf, 0, 260, "big")
    assert e.value.backend == "wgpu" and e.value.device == dev.name
    with pytest.raises(LimitExceeded, match="min-storage-buffer-offset-alignment"):
        memory.storage_binding(dev, buf, 4, 16, "misaligned")
    with pytest.raises(BindError, match="past the end"):
        memory.storage_binding(dev, buf, 896, 256, "overrun")


def test_too_many_bindings_is_refused(limited):
    dev = limited(max_storage_buffers_per_shader_stage=2)
    with pytest.raises(LimitExceeded, match="max-storage-buffers-per-shader-stage"):
        KernelCache(dev).get(AXPY, 3)


def test_invalid_wgsl_is_a_lowering_error_with_the_source(wgpu_device):
    with pytest.raises(LoweringError, match="wgpu rejected kernel") as e:
        KernelCache(wgpu_device).get("fn main( {", 0, label="broken")
    assert "fn main( {" in str(e.value)


def test_kernel_cache_compiles_a_source_once(wgpu_device):
    cache = KernelCache(wgpu_device)
    assert cache.get(AXPY, 3) is cache.get(AXPY, 3) and len(cache) == 1


def test_recorded_step_replays_with_slot_rewrites_and_copies(wgpu_device):
    rng = np.random.default_rng(1)
    n = 1000
    arena, off, x, y, axpy = _axpy(wgpu_device, n, rng)
    keep = memory.WgpuBuffer(wgpu_device, 4 * n, "state")
    copy = BufferCopy(arena.gpu, off["y"], keep.gpu, 0, 4 * n)
    step = RecordedStep(wgpu_device, [axpy, axpy], [copy])  # two dependent dispatches
    expect = y.copy()
    for a in rng.uniform(0.5, 2.0, 3).astype(np.float32):
        memory.write(wgpu_device, arena, off["a"], np.array([a], np.float32))  # the slot
        step.submit()
        expect = a * x + (a * x + expect)
        got = memory.read(wgpu_device, arena, off["y"], 4 * n).view(np.float32)
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)  # GPUs may fuse a*x+y
        np.testing.assert_array_equal(memory.read(wgpu_device, keep, 0, 4 * n).view(np.float32),
                                      got)
    assert step.replays == 3


def test_a_step_encoded_ahead_sees_the_slot_writes_queued_after_its_encode(wgpu_device):
    results = []
    for ahead in (True, False):
        arena, off, x, y, axpy = _axpy(wgpu_device, 500, np.random.default_rng(5))
        step = RecordedStep(wgpu_device, [axpy], ahead=ahead)
        for a in (1.5, -2.0, 0.25, 3.0):
            memory.write(wgpu_device, arena, off["a"], np.array([a], np.float32))
            step.submit()
        results.append(memory.read(wgpu_device, arena, off["y"], 4 * 500))
        assert (step._next is not None) == ahead  # a replayed step holds its next buffer
    np.testing.assert_array_equal(results[0], results[1])
    want = y + np.float32(1.5 - 2.0 + 0.25 + 3.0) * x
    np.testing.assert_allclose(results[0].view(np.float32), want, rtol=1e-5, atol=1e-5)


def test_native_and_public_encoding_give_the_same_step(wgpu_device):
    from poot_wgpu.step import native_pass_functions

    assert native_pass_functions() is not None  # the fast path exists for this wgpu-py
    results = []
    for native in (True, False):
        arena, off, x, y, axpy = _axpy(wgpu_device, 333, np.random.default_rng(4))
        memory.write(wgpu_device, arena, off["a"], np.array([1.5], np.float32))
        RecordedStep(wgpu_device, [axpy, axpy, axpy], native=native).submit()
        results.append(memory.read(wgpu_device, arena, off["y"], 4 * 333))
    np.testing.assert_array_equal(results[0], results[1])
    assert not np.array_equal(results[0].view(np.float32), y)  # the step did run


def test_grid_over_the_per_dimension_limit_folds_into_y(limited):
    dev = limited(max_compute_workgroups_per_dimension=4)
    n = 64 * 10 - 3  # ten groups, the last partial: folds to 4 x 3 with two idle groups
    arena, off, x, y, axpy = _axpy(dev, n, np.random.default_rng(2))
    assert axpy.groups == (4, 3, 1)
    memory.write(dev, arena, off["a"], np.array([3.0], np.float32))
    RecordedStep(dev, [axpy]).submit()
    got = memory.read(dev, arena, off["y"], 4 * n).view(np.float32)
    np.testing.assert_allclose(got, 3 * x + y, rtol=1e-6, atol=1e-6)  # a GPU may fuse it
    with pytest.raises(LimitExceeded):
        workgroup_grid(dev, 17)


def test_subgroup_and_f16_features_work_when_present(wgpu_device):
    if not (wgpu_device.has("subgroup") and wgpu_device.has("shader-f16")):
        pytest.skip(f"adapter lacks subgroup or shader-f16: {sorted(wgpu_device.features)}")
    src = """enable f16;
@group(0) @binding(0) var<storage, read_write> h: array<f16>;
@group(0) @binding(1) var<storage, read_write> s: array<f32>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) lid: u32) {
  h[lid] = h[lid] * 2.0h;
  let total = subgroupAdd(f32(h[lid]));
  if (lid == 0u) { s[0] = total; }
}
"""
    h = np.random.default_rng(3).standard_normal(32).astype(np.float16)
    buf = memory.WgpuBuffer(wgpu_device, 256 + 4, "hs")
    memory.write(wgpu_device, buf, 0, h)
    kernel = KernelCache(wgpu_device).get(src, 2)
    group = kernel.bind([memory.storage_binding(wgpu_device, buf, 0, h.nbytes, "h"),
                         memory.storage_binding(wgpu_device, buf, 256, 4, "s")])
    RecordedStep(wgpu_device, [Dispatch(kernel, group, (1, 1, 1))]).submit()
    doubled = memory.read(wgpu_device, buf, 0, h.nbytes).view(np.float16)
    np.testing.assert_array_equal(doubled, h * np.float16(2))
    # one subgroup holds lanes 0..size-1; its sum is a prefix sum of the doubled values
    s = memory.read(wgpu_device, buf, 256, 4).view(np.float32)[0]
    assert np.isclose(np.cumsum(doubled.astype(np.float32)), s, rtol=1e-5).any()
