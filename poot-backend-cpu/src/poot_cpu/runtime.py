"""The cpu runtime: host memory, one compiled library per plan, one call per step.

Buffers are 256-byte aligned numpy byte arrays at stable addresses; `write` and `read`
copy bytes in place; `load` prints the plan's step function (poot_cpu.step), compiles it
once (cached by source) and binds the buffers' addresses, so `run()` is a single
ctypes call with no Python per kernel or element. The OpenMP threads are the C
runtime's ($OMP_NUM_THREADS, default one per core).
"""
from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from poot.errors import CapacityError

from poot_cpu import compiler
from poot_cpu.step import StepSource, build_step

ALIGN = 256


@dataclass(eq=False)
class CpuBuffer:
    nbytes: int
    label: str
    array: np.ndarray        # the aligned bytes

    @property
    def ptr(self) -> int:
        return self.array.ctypes.data


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
        self._fn(self._ptrs)
        self.recorded = True   # the compiled step is the recording: every run replays it
