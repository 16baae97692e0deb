"""The cpu runtime: host memory, one compiled library per plan, one call per step.

Buffers are 256-byte aligned numpy byte arrays at stable addresses; `write` and `read`
copy bytes in place, except that a whole-buffer write of immutable bytes (a read-only
file mapping: a weight of a memory-mapped checkpoint; or a frozen array, such as the
loader's reordered q/k rows) adopts them instead of copying: the kernels only read
weights, and a copy would hold them in memory twice. A weight of a file mapping is the
exception: it is copied into the runtime's WeightArena, anonymous memory in transparent
huge pages (the file's 4 KiB pages cost a decode step's GEMVs a TLB walk per page, and
the hardware prefetcher stops at each page boundary), a chunk at a time, each chunk's
file pages dropped once copied, so the process still holds its bytes once and its peak
grows by a chunk at most; an adopted frozen array's pages are collapsed into huge pages
in place. `load`
prints the plan's step function (poot_cpu.step), compiles it once (cached by source)
and binds the buffers' addresses, so `run()` is a single ctypes call with no Python per
kernel or element. The OpenMP threads are the C runtime's ($OMP_NUM_THREADS, default one per core).
"""
from __future__ import annotations

import ctypes
import functools
import gc
import mmap
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from poot.errors import CapacityError

from poot_cpu import compiler
from poot_cpu.step import StepSource, build_step

ALIGN = 256
MAPPED_ALIGN = 32      # the least alignment of a GGUF tensor; what an adopted mapping needs
HUGE = 2 << 20         # the huge page size (x86-64 and arm64 with 4 KiB base pages)
ARENA_BYTES = 32 << 20  # the WeightArena maps this much at a time (more for a larger weight)
CHUNK = 4 << 20        # a mapped weight is copied this many bytes at a time
#: the span a file page fault maps around the faulting page (Linux's fault_around_bytes
#: default, aligned to it): reading a small weight maps its neighbours' pages too
FAULT_AROUND = 64 << 10
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


@dataclass(eq=False)
class CpuBuffer:
    nbytes: int
    label: str
    array: np.ndarray        # the aligned bytes, or an adopted read-only mapping
    bound: bool = False      # its address was handed out: it can no longer be replaced

    @property
    def ptr(self) -> int:
        self.bound = True
        return self.array.ctypes.data


def immutable(array: np.ndarray) -> bool:
    """True when nothing can change `array`'s bytes while a plan reads them: a view of a
    memory map opened read-only, or of a frozen owner (an array that owns its bytes and
    is not writable, such as poot.models.weights.frozen_stack)."""
    if array.flags.writeable or not array.flags.c_contiguous:
        return False
    base = array
    while isinstance(base, np.ndarray):
        if base.base is None:
            return not base.flags.writeable
        base = base.base
    return isinstance(base, mmap.mmap) and memoryview(base).readonly


def mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """The read-only file mapping `array` views, or None."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base if isinstance(base, mmap.mmap) and memoryview(base).readonly else None


def drop_pages(mapping: mmap.mmap, array: np.ndarray, around: int = mmap.PAGESIZE) -> None:
    """Unmap the pages that hold `array` (a view of the read-only file `mapping`) from this
    process, the pages it shares with its neighbours too, widened to whole `around`-aligned
    spans: the bytes stay the file's, and a later read of any of them faults it in from the
    page cache again."""
    start = array.ctypes.data - np.frombuffer(mapping, np.uint8).ctypes.data
    first = start // around * around
    last = min(-(-(start + array.nbytes) // around) * around, len(mapping))
    if last > first and hasattr(mapping, "madvise"):
        mapping.madvise(mmap.MADV_DONTNEED, first, last - first)


@functools.cache
def _madvise():
    """libc's madvise, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


def advise_huge(array: np.ndarray) -> None:
    """Ask the kernel for transparent huge pages behind the whole huge pages of `array`
    (before its pages are first touched); where it has none to give, nothing changes."""
    madvise = _madvise()
    start = -(-array.ctypes.data // HUGE) * HUGE
    stop = (array.ctypes.data + array.nbytes) // HUGE * HUGE
    if madvise is not None and stop > start:
        madvise(start, stop - start, MADV_HUGEPAGE)


def collapse_huge(array: np.ndarray) -> None:
    """Ask the kernel to move the huge pages that `array`'s bytes (already written) lie in
    into transparent huge pages now (MADV_COLLAPSE, Linux 6.1 and later: the contents stay
    as they are, the neighbours' bytes in those pages too); where it cannot, nothing
    changes. For a frozen weight that the runtime adopts: the loader's small arrays come
    from the C heap's 4 KiB pages."""
    madvise = _madvise()
    start = array.ctypes.data // HUGE * HUGE
    stop = -(-(array.ctypes.data + array.nbytes) // HUGE) * HUGE
    if madvise is not None:
        madvise(start, stop - start, MADV_COLLAPSE)


class WeightArena:
    """Read-only weights packed one after another into anonymous mappings that start on
    a huge page and are advised into transparent huge pages (where the kernel gives none,
    they are ordinary pages). Pages never touched cost nothing, so the unused end of a
    mapping is free. A mapping lives while a weight taken from it does (each is a view of
    it) or while it is the one taken from next: a model's weights go with its buffers."""

    def __init__(self):
        self._space = np.empty(0, np.uint8)

    def release_unused(self) -> None:
        """Give back the pages of the space not handed out yet that weights' copies made
        resident: the rest of the huge page the last weight ends in (a later `take` faults
        them in again, zeroed)."""
        space = self._space
        if not space.size:
            return
        madvise = _madvise()
        start = -(-space.ctypes.data // mmap.PAGESIZE) * mmap.PAGESIZE
        stop = space.ctypes.data + space.size
        if madvise is not None and stop > start:
            madvise(start, stop - start, mmap.MADV_DONTNEED)

    def take(self, nbytes: int) -> np.ndarray:
        """`nbytes` bytes, ALIGN-aligned, for the life of the runtime."""
        need = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if need > self._space.size:
            size = max(ARENA_BYTES, -(-need // HUGE) * HUGE)
            try:
                # private: a shared anonymous mapping is shmem, which THP leaves alone
                mm = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            except OSError:
                raise CapacityError(f"cpu: cannot map {size} bytes of host memory for "
                                    "weights") from None
            self.release_unused()   # the old mapping's rest is never handed out
            raw = np.frombuffer(mm, np.uint8)
            start = -raw.ctypes.data % HUGE
            self._space = raw[start:start + size]
            advise_huge(self._space)
        out, self._space = self._space[:nbytes], self._space[need:]
        return out


def _aligned(nbytes: int) -> np.ndarray:
    try:
        raw = np.empty(max(nbytes, 1) + ALIGN, np.uint8)
    except MemoryError:
        raise CapacityError(f"cpu: cannot allocate {nbytes} bytes of host memory") from None
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes]


class CpuRuntime:
    def __init__(self, device):
        self.device = device
        self.arena = WeightArena()
        #: id(plan) -> (plan, its StepSource) printed by `prepare`, taken by `load`
        self._prepared: dict[int, tuple] = {}

    def alloc(self, nbytes: int, label: str) -> CpuBuffer:
        return CpuBuffer(nbytes, label, _aligned(nbytes))

    def alloc_zeroed(self, nbytes: int, label: str) -> CpuBuffer:
        """A buffer of zeros in its own anonymous mapping (page-aligned): a page becomes
        resident when first written, so a KV cache holds memory for the positions used,
        not for its whole capacity (writing zeros, or the C heap's reused pages, would)."""
        try:
            mm = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError:
            raise CapacityError(f"cpu: cannot map {nbytes} bytes of host memory") from None
        return CpuBuffer(nbytes, label, np.frombuffer(mm, np.uint8)[:nbytes])

    def write(self, buf: CpuBuffer, offset: int, array: np.ndarray) -> None:
        if offset == 0 and array.nbytes == buf.nbytes and not buf.bound \
                and immutable(array) and array.ctypes.data % MAPPED_ALIGN == 0:
            mapping = mapping_of(array)
            src = array.reshape(-1).view(np.uint8)
            if mapping is None:
                buf.array = src               # its own bytes were never touched
                collapse_huge(src)
                return
            buf.array = self.arena.take(src.size)
            for at in range(0, src.size, CHUNK):
                buf.array[at:at + CHUNK] = src[at:at + CHUNK]
                drop_pages(mapping, src[at:at + CHUNK])
            drop_pages(mapping, src, FAULT_AROUND)  # and what fault-around mapped with it
            return
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        buf.array[offset:offset + data.size] = data

    def read(self, buf: CpuBuffer, offset: int, nbytes: int) -> np.ndarray:
        return buf.array[offset:offset + nbytes].copy()

    def prepare(self, plan) -> None:
        """Build the plan's library into the kernel cache, so that its `load` only loads
        it; it touches no buffer (Session.prepare calls it, on any thread)."""
        step = build_step(plan)
        compiler.build(step.source)
        self._prepared[id(plan)] = (plan, step)
        release_freed_heap()   # planning's garbage, before this plan's weights are written

    def load(self, plan, buffers: Mapping[str, CpuBuffer]) -> CpuExecutable:
        prepared = self._prepared.pop(id(plan), None)
        step = prepared[1] if prepared is not None and prepared[0] is plan else \
            build_step(plan)
        return CpuExecutable(self, step, buffers)


class CpuExecutable:
    """A plan's compiled step function bound to its buffers; `run()` is one call."""

    def __init__(self, rt: CpuRuntime, step: StepSource, buffers: Mapping[str, CpuBuffer]):
        self.step, self.recorded = step, False
        self.library = compiler.load(step.source)
        self._fn = self.library.poot_step
        self._fn.argtypes = [ctypes.c_void_p]
        self._fn.restype = None
        self._arena = rt.arena
        bufs = [buffers[name] for name in step.regions]
        if step.scratch_bytes:
            bufs.append(rt.alloc(step.scratch_bytes, "scratch"))
        self._keep = bufs      # the addresses below stay valid while this plan lives
        self._ptrs = (ctypes.c_void_p * max(1, len(bufs)))(*[b.ptr for b in bufs])

    def run(self) -> None:
        if not self.recorded:     # the plan's weights are written by now
            release_freed_heap()
            self._arena.release_unused()
        self._fn(self._ptrs)
        self.recorded = True   # the compiled step is the recording: every run replays it


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_heap() -> None:
    """Give the heap that planning freed back to the OS before a plan first runs: the
    tracer, planner and printer leave megabytes of freed small blocks that the C heap
    keeps, and the weights' pages are added to the resident set only after that, on the
    first run, so what is freed here lowers the process's peak. The cyclic garbage that
    tracing and planning leave (graphs and their values refer to each other) is collected
    first, or its blocks would stay until the collector's next full pass."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
