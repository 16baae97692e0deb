"""The toy's Runtime (poot.contract.Runtime): host bytes as device memory, a step runs
each planned kernel over numpy views of its places."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from poot.ir import Lit

ALIGN = 256


@dataclass(eq=False)
class ToyBuffer:
    data: np.ndarray     # uint8, 256-aligned, never reallocated
    nbytes: int
    label: str


class ToyExecutable:
    recorded = False

    def __init__(self, calls):
        self.calls = calls

    def run(self) -> None:
        with np.errstate(all="ignore"):
            for call in self.calls:
                call()


class ToyRuntime:
    def __init__(self, device):
        self.device = device

    def alloc(self, nbytes: int, label: str) -> ToyBuffer:
        raw = np.zeros(nbytes + ALIGN, np.uint8)
        skip = (-raw.ctypes.data) % ALIGN
        return ToyBuffer(raw[skip: skip + nbytes], nbytes, label)

    def write(self, buf: ToyBuffer, offset: int, array) -> None:
        src = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        buf.data[offset: offset + src.size] = src

    def read(self, buf: ToyBuffer, offset: int, nbytes: int) -> np.ndarray:
        return buf.data[offset: offset + nbytes].copy()

    def load(self, plan, buffers) -> ToyExecutable:
        def view(place):
            if place.strides is not None:  # the toy never accepts strided operands
                raise ValueError(f"toy: strided place {place}")
            t = place.type
            return np.ndarray(t.shape, t.dtype.numpy, buffers[place.region].data, place.offset)

        calls = []
        for step in plan.steps:
            args = [np.asarray(x.value, x.dtype.numpy) if isinstance(x, Lit) else view(x)
                    for x in step.inputs]
            calls.append(_call(step.lowering.program, args, view(step.out)))
        for c in plan.copies:
            src, dst = view(c.src), view(c.dst)
            calls.append(lambda s=src, d=dst: np.copyto(d, s))
        return ToyExecutable(calls)


def _call(fn, args, out):
    def call():
        out[...] = np.asarray(fn(*args)).astype(out.dtype)
    return call
