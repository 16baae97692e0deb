"""The runtime on hand-written WGSL: arena layout, limits, recorded steps, replay, slots."""
import numpy as np
import pytest
from poot.errors import LimitExceeded, LoweringError
from poot_wgpu.kernel import Dispatch, KernelCache, workgroup_grid
from poot_wgpu.memory import Arena
from poot_wgpu.step import RecordedStep

# y = a * x + y, with `a` read from a one-word slot buffer; linear group id over x and y.
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


def _axpy_plan(dev, n, rng):
    arena = Arena(dev, {"a": 4, "x": 4 * n, "y": 4 * n})
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    arena.write("x", x)
    arena.write("y", y)
    kernel = KernelCache(dev).get(AXPY, 3, label="axpy")
    groups = workgroup_grid(dev, -(-n // 64))
    dispatch = Dispatch(kernel, kernel.bind(arena, ["a", "x", "y"]), groups)
    return arena, x, y, dispatch


def test_arena_aligns_regions_and_pads_to_words(wgpu_device):
    arena = Arena(wgpu_device, {"a": 3, "b": 40, "c": 1})
    align = wgpu_device.limit("min-storage-buffer-offset-alignment")
    offsets = [r.offset for r in arena.regions.values()]
    assert all(o % align == 0 for o in offsets) and len(set(offsets)) == 3
    assert arena.region("a").size == 4 and arena.region("c").size == 4
    data = np.arange(3, dtype=np.uint8) + 7
    arena.write("a", data)
    assert arena.read("a", np.uint8, (3,)).tolist() == data.tolist()


def test_arena_splits_over_buffers_at_max_buffer_size(limited):
    dev = limited(max_buffer_size=1024)
    arena = Arena(dev, {"a": 600, "b": 600, "c": 100})
    assert [r.arena for r in arena.regions.values()] == [0, 1, 1]
    assert len(arena.buffers) == 2
    with pytest.raises(LimitExceeded, match="max-buffer-size"):
        Arena(dev, {"huge": 2048})


def test_binding_over_the_storage_binding_limit_is_refused(limited):
    dev = limited(max_storage_buffer_binding_size=256)
    arena = Arena(dev, {"small": 256, "big": 260})
    arena.binding("small")
    with pytest.raises(LimitExceeded, match="max-storage-buffer-binding-size 256") as e:
        arena.binding("big")
    assert e.value.backend == "wgpu" and e.value.device == dev.name


def test_too_many_bindings_is_refused(limited):
    dev = limited(max_storage_buffers_per_shader_stage=2)
    with pytest.raises(LimitExceeded, match="max-storage-buffers-per-shader-stage"):
        KernelCache(dev).get(AXPY, 3)


def test_invalid_wgsl_is_a_lowering_error_with_the_source(wgpu_device):
    with pytest.raises(LoweringError, match="wgpu rejected kernel") as e:
        KernelCache(wgpu_device).get("fn main( {", 0, label="broken")
    assert "fn main( {" in str(e.value)


def test_recorded_step_replays_with_slot_rewrites(wgpu_device):
    rng = np.random.default_rng(1)
    n = 1000
    arena, x, y, axpy = _axpy_plan(wgpu_device, n, rng)
    step = RecordedStep(wgpu_device, [axpy, axpy])  # two dependent dispatches, one submit
    expect = y.copy()
    for a in rng.uniform(0.5, 2.0, 3).astype(np.float32):
        arena.write("a", np.array([a], np.float32))  # the slot, rewritten in place
        step.submit()
        expect = a * x + (a * x + expect)
        np.testing.assert_allclose(arena.read("y", np.float32, (n,)), expect, rtol=1e-5)
    assert step.replays == 3


def test_grid_over_the_per_dimension_limit_folds_into_y(limited):
    dev = limited(max_compute_workgroups_per_dimension=4)
    n = 64 * 10 - 3  # ten groups, the last partial: folds to 4 x 3 with two idle groups
    rng = np.random.default_rng(2)
    arena, x, y, axpy = _axpy_plan(dev, n, rng)
    assert axpy.groups == (4, 3, 1)
    arena.write("a", np.array([3.0], np.float32))
    RecordedStep(dev, [axpy]).submit()
    np.testing.assert_allclose(arena.read("y", np.float32, (n,)), 3 * x + y, rtol=1e-6)
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
    rng = np.random.default_rng(3)
    h = rng.standard_normal(32).astype(np.float16)
    arena = Arena(wgpu_device, {"h": h.nbytes, "s": 4})
    arena.write("h", h)
    kernel = KernelCache(wgpu_device).get(src, 2)
    RecordedStep(wgpu_device, [Dispatch(kernel, kernel.bind(arena, ["h", "s"]), (1, 1, 1))]
                 ).submit()
    np.testing.assert_array_equal(arena.read("h", np.float16, (32,)), h * np.float16(2))
    # one subgroup holds lanes 0..size-1; its sum is a prefix of the doubled values
    s = arena.read("s", np.float32, (1,))[0]
    prefixes = np.cumsum((h * 2).astype(np.float32))
    assert np.isclose(prefixes, s, rtol=1e-5).any()
