"""The cpu runtime: host memory, one compiled library per plan, one call per step.

Buffers are 256-byte aligned numpy byte arrays at stable addresses; `write` and `read`
copy bytes in place, except that a whole-buffer write of immutable bytes (a read-only
file mapping: a weight of a memory-mapped checkpoint; or a frozen array, such as the
loader's reordered q/k rows) adopts them instead of copying: the kernels only read
weights, and a copy would hold them in memory twice. `load`
prints the plan's step function (poot_cpu.step), compiles it once (cached by source)
and binds the buffers' addresses, so `run()` is a single ctypes call with no Python per
kernel or element. The OpenMP threads are the C runtime's ($OMP_NUM_THREADS, default one per core).
"""
from __future__ import annotations

import ctypes
import functools
import mmap
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from poot.errors import CapacityError

from poot_cpu import compiler
from poot_cpu.step import StepSource, build_step

ALIGN = 256
MAPPED_ALIGN = 32      # the least alignment of a GGUF tensor; what an adopted mapping needs


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

    def alloc(self, nbytes: int, label: str) -> CpuBuffer:
        return CpuBuffer(nbytes, label, _aligned(nbytes))

    def write(self, buf: CpuBuffer, offset: int, array: np.ndarray) -> None:
        if offset == 0 and array.nbytes == buf.nbytes and not buf.bound \
                and immutable(array) and array.ctypes.data % MAPPED_ALIGN == 0:
            buf.array = array.reshape(-1).view(np.uint8)  # its own bytes were never touched
            return
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        buf.array[offset:offset + data.size] = data

    def read(self, buf: CpuBuffer, offset: int, nbytes: int) -> np.ndarray:
        return buf.array[offset:offset + nbytes].copy()

    def load(self, plan, buffers: Mapping[str, CpuBuffer]) -> CpuExecutable:
        return CpuExecutable(self, build_step(plan), buffers)


class CpuExecutable:
    """A plan's compiled step function bound to its buffers; `run()` is one call."""

    def __init__(self, rt: CpuRuntime, step: StepSource, buffers: Mapping[str, CpuBuffer]):
        self.step, self.recorded = step, False
        self.library = compiler.load(step.source)
        self._fn = self.library.poot_step
        self._fn.argtypes = [ctypes.c_void_p]
        self._fn.restype = None
        bufs = [buffers[name] for name in step.regions]
        if step.scratch_bytes:
            bufs.append(rt.alloc(step.scratch_bytes, "scratch"))
        self._keep = bufs      # the addresses below stay valid while this plan lives
        self._ptrs = (ctypes.c_void_p * max(1, len(bufs)))(*[b.ptr for b in bufs])

    def run(self) -> None:
        if not self.recorded:
            release_freed_heap()
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
    first run, so what is freed here lowers the process's peak."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
