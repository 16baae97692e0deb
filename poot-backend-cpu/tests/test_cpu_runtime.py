"""The cpu runtime's host buffers: a frozen array written whole is adopted (the loader's
reordered rows are not held twice); a read-only file mapping written whole is copied into
the weight arena's huge pages, its file pages dropped (held once, too); anything else is
copied."""
import numpy as np
from poot.models.weights import frozen_stack
from poot_cpu.runtime import CpuRuntime


def _mapped(tmp_path, data: np.ndarray) -> np.ndarray:
    path = tmp_path / "w.bin"
    data.tofile(path)
    return np.memmap(path, np.uint8, mode="r")


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
    assert np.array_equal(rt.read(buf, 0, frozen.nbytes).reshape(64, 20), source[order])
    owner = source[order]                      # a writable owner behind a read-only view
    view = owner.view()
    view.flags.writeable = False
    buf = rt.alloc(view.nbytes, "w")
    rt.write(buf, 0, view)
    assert buf.ptr != view.ctypes.data
    assert np.array_equal(rt.read(buf, 0, view.nbytes).reshape(64, 20), source[order])


def _resident(array: np.ndarray) -> int:
    """Bytes of `array`'s mapping resident in this process (its /proc/self/smaps Rss)."""
    at = array.ctypes.data
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= at < hi
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("mapping not found")


def test_a_mapped_weight_is_copied_into_the_arena_and_its_file_pages_dropped(
        tmp_path, monkeypatch):
    """Whole writes of read-only file mappings land one after another in the arena, ALIGN
    apart, copied a chunk at a time; the file's pages they touched are no longer resident
    in the process; a weight larger than what is left gets a mapping of its own."""
    from poot_cpu import runtime

    monkeypatch.setattr(runtime, "ARENA_BYTES", runtime.HUGE)
    monkeypatch.setattr(runtime, "CHUNK", 8192)
    rng = np.random.default_rng(0)
    rt = CpuRuntime("cpu:0")
    bufs = []
    for i, size in enumerate((3 * 8192 + 4096, 100, runtime.HUGE + 4096)):
        (tmp_path / str(i)).mkdir()
        data = rng.integers(0, 256, size, dtype=np.uint8)
        mapped = _mapped(tmp_path / str(i), data)
        buf = rt.alloc(mapped.nbytes, "w")
        rt.write(buf, 0, mapped)
        assert buf.ptr != mapped.ctypes.data and buf.ptr % runtime.ALIGN == 0
        assert np.array_equal(rt.read(buf, 0, size), data)
        assert _resident(mapped) == 0
        bufs.append(buf)
    assert bufs[1].ptr == bufs[0].ptr + -(-(3 * 8192 + 4096) // runtime.ALIGN) * runtime.ALIGN
    assert bufs[2].ptr % runtime.HUGE == 0


def test_the_arena_gives_back_what_it_has_not_handed_out(tmp_path):
    """After its weights are written, the arena's space not handed out holds no resident
    pages (a huge page faulted in whole for the last weight's first bytes included); the
    weights keep their bytes, and a later weight is taken from that space as before."""
    from poot_cpu import runtime

    rt = CpuRuntime("cpu:0")
    data = np.arange(3 * 4096 + 100, dtype=np.uint8)
    mapped = _mapped(tmp_path, data)
    first = rt.alloc(mapped.nbytes, "w")
    rt.write(first, 0, mapped)
    rt.arena.release_unused()
    assert _resident(first.array) <= -(-data.nbytes // 4096) * 4096
    assert np.array_equal(rt.read(first, 0, data.nbytes), data)
    (tmp_path / "b").mkdir()
    second = rt.alloc(mapped.nbytes, "w")
    rt.write(second, 0, _mapped(tmp_path / "b", data[::-1].copy()))
    assert second.ptr == first.ptr + -(-data.nbytes // runtime.ALIGN) * runtime.ALIGN
    assert np.array_equal(rt.read(second, 0, data.nbytes), data[::-1])
    assert np.array_equal(rt.read(first, 0, data.nbytes), data)
