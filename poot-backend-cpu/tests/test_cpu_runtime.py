"""The cpu runtime's host buffers: a read-only file mapping or a frozen array written whole
is adopted (the weights of a memory-mapped checkpoint and the loader's reordered rows are
not held twice); anything else is copied."""
import numpy as np
from poot.models.weights import frozen_stack
from poot_cpu.runtime import CpuRuntime


def _mapped(tmp_path, data: np.ndarray) -> np.ndarray:
    path = tmp_path / "w.bin"
    data.tofile(path)
    return np.memmap(path, np.uint8, mode="r")


def test_a_read_only_mapping_is_adopted(tmp_path):
    rt = CpuRuntime("cpu:0")
    data = np.arange(4096, dtype=np.uint8)
    mapped = _mapped(tmp_path, data)
    buf = rt.alloc(mapped.nbytes, "w")
    rt.write(buf, 0, mapped)
    assert buf.ptr == mapped.ctypes.data
    assert np.array_equal(rt.read(buf, 0, 4096), data)


def test_writable_partial_or_bound_writes_copy(tmp_path):
    rt = CpuRuntime("cpu:0")
    data = np.arange(4096, dtype=np.uint8)
    mapped = _mapped(tmp_path, data)
    copy_mode = np.memmap(tmp_path / "w.bin", np.uint8, mode="c")   # private, writable
    for array, offset, size in ((data, 0, 4096), (copy_mode, 0, 4096),
                                (mapped[:2048], 0, 4096), (mapped[:2048], 2048, 4096)):
        buf = rt.alloc(size, "w")
        rt.write(buf, offset, array)
        assert buf.ptr not in (array.ctypes.data, mapped.ctypes.data)
        assert np.array_equal(rt.read(buf, offset, array.nbytes), data[:array.nbytes])
    bound = rt.alloc(4096, "w")
    ptr = bound.ptr                  # handed to a step function: must stay where it is
    rt.write(bound, 0, mapped)
    assert bound.ptr == ptr
    assert np.array_equal(rt.read(bound, 0, 4096), data)


def test_frozen_rows_are_adopted_and_a_writable_owner_is_copied():
    rt = CpuRuntime("cpu:0")
    source = np.arange(64 * 20, dtype=np.uint8).reshape(64, 20)
    order = np.arange(64)[::-1].copy()
    frozen = frozen_stack([source], [order])
    assert np.array_equal(frozen, source[order]) and not frozen.flags.writeable
    buf = rt.alloc(frozen.nbytes, "w")
    rt.write(buf, 0, frozen)
    assert buf.ptr == frozen.ctypes.data
    owner = source[order]                      # a writable owner behind a read-only view
    view = owner.view()
    view.flags.writeable = False
    buf = rt.alloc(view.nbytes, "w")
    rt.write(buf, 0, view)
    assert buf.ptr != view.ctypes.data
    assert np.array_equal(rt.read(buf, 0, view.nbytes).reshape(64, 20), source[order])
