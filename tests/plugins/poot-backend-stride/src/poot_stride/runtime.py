"""The stride backend's Runtime (poot.contract.Runtime): host bytes as device memory; a
step calls each planned kernel on numpy views of its places, strided where the plan says
so."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from poot.contract import ALIGN
from poot.ir import Lit


@dataclass(eq=False)
class HostBytes:
    data: np.ndarray     # uint8, ALIGN-aligned, never reallocated
    nbytes: int
    label: str


class StrideExecutable:
    recorded = False     # runs the plan directly; nothing to record

    def __init__(self, calls):
        self.calls = calls

    def run(self) -> None:
        with np.errstate(all="ignore"):
            for call in self.calls:
                call()


class StrideRuntime:
    def __init__(self, device):
        self.device = device

    def alloc(self, nbytes: int, label: str) -> HostBytes:
        raw = np.empty(nbytes + ALIGN, np.uint8)
        skip = (-raw.ctypes.data) % ALIGN
        return HostBytes(raw[skip: skip + nbytes], nbytes, label)

    def write(self, buf: HostBytes, offset: int, array) -> None:
        src = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        buf.data[offset: offset + src.size] = src

    def read(self, buf: HostBytes, offset: int, nbytes: int) -> np.ndarray:
        return buf.data[offset: offset + nbytes].copy()

    def load(self, plan, buffers) -> StrideExecutable:
        def view(place):
            t = place.type
            item = t.dtype.itemsize
            strides = None if place.strides is None else tuple(s * item for s in place.strides)
            return np.ndarray(t.shape, t.dtype.numpy, buffers[place.region].data, place.offset,
                              strides)

        def operand(x):
            return np.asarray(x.value, x.type.dtype.numpy) if isinstance(x, Lit) else view(x)

        calls = []
        for step in plan.steps:
            out, args = view(step.out), [operand(x) for x in step.inputs]
            calls.append(lambda fn=step.lowering.program, out=out, args=args: fn(out, *args))
        for c in plan.copies:
            src, dst = view(c.src), view(c.dst)
            calls.append(lambda s=src, d=dst: np.copyto(d, s))
        return StrideExecutable(calls)
