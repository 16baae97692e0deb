"""The CUDA runtime: device memory, plan loading, launches and CUDA graph replay.

`CudaRuntime` follows poot.runtime.protocol: buffers at stable addresses from
cuMemAlloc, synchronous write/read, and `load(plan, buffers)` building every
launch once. `CudaExecutable.run()` records the whole step into a CUDA graph on
the first call (stream capture) and replays the instantiated graph afterwards.

Graph replay is the default. `POOT_CUDA_REPLAY=0` (or `false`/`no`/`off`, read when a plan is
loaded), or `executable.replay = False` on one loaded plan, launches every kernel of the step
directly instead, each step: for measuring what replay saves, and for debugging.
On sm_90+ kernels are launched as programmatic dependent launches (each kernel's launch
overlaps the previous one's work; the kernel waits inside until its inputs are written):
`POOT_CUDA_OVERLAP=0`, read when a plan is loaded, launches them the ordinary way.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from poot.codegen.program import OUT
from poot.errors import UnsupportedOp
from poot.ir.graph import Lit

from poot_cuda.driver import Context, Graph, Launch
from poot_cuda.kernels import CompiledProgram, ModuleCache, bind

REPLAY_ENV = "POOT_CUDA_REPLAY"
OVERLAP_ENV = "POOT_CUDA_OVERLAP"


def _env_on(name: str) -> bool:
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def replay_default() -> bool:
    """Whether loaded plans replay a recorded CUDA graph: yes unless $POOT_CUDA_REPLAY says no."""
    return _env_on(REPLAY_ENV)


def overlap_default(device) -> bool:
    """Programmatic dependent launches (each kernel's launch overlaps the previous kernel;
    sm_90+): on unless $POOT_CUDA_OVERLAP says no."""
    return dict(device.info).get("major", 0) >= 9 and _env_on(OVERLAP_ENV)


@dataclass
class CudaBuffer:
    nbytes: int
    label: str
    ptr: int


class CudaRuntime:
    def __init__(self, device):
        self.device = device
        self.ctx = Context(device.index)
        self.modules = ModuleCache(self.ctx)
        self._buffers: list[CudaBuffer] = []

    def alloc(self, nbytes: int, label: str) -> CudaBuffer:
        buf = CudaBuffer(nbytes, label, self.ctx.alloc(nbytes))  # cuMemAlloc: 256-aligned
        self._buffers.append(buf)
        return buf

    def write(self, buf: CudaBuffer, offset: int, array: np.ndarray) -> None:
        self.ctx.write(buf.ptr + offset, array)

    def read(self, buf: CudaBuffer, offset: int, nbytes: int) -> np.ndarray:
        return self.ctx.read(buf.ptr + offset, nbytes)

    def load(self, plan, buffers: Mapping[str, CudaBuffer]) -> CudaExecutable:
        return CudaExecutable(self, plan, buffers)

    def close(self) -> None:
        for b in self._buffers:
            self.ctx.free(b.ptr)
        self._buffers.clear()


class CudaExecutable:
    """One plan bound to its buffers: a list of queued actions, recorded once.

    `replay` (default from $POOT_CUDA_REPLAY, on) picks how `run()` runs a step: replay the
    graph recorded on the first run, or launch every action directly."""

    def __init__(self, rt: CudaRuntime, plan, buffers: Mapping[str, CudaBuffer]):
        self.rt, self.recorded = rt, False
        self.replay = replay_default()
        self.overlap = overlap_default(rt.device)
        self._graph: Graph | None = None
        self._actions: list = []

        def ptr(place) -> int:
            if place.strides is not None:
                raise UnsupportedOp("cuda kernels read contiguous operands; the plan gave a "
                                    f"strided view {place}", backend="cuda")
            return buffers[place.region].ptr + place.offset

        for step in plan.steps:
            compiled = step.lowering.program
            if not isinstance(compiled, CompiledProgram):
                raise UnsupportedOp(f"step {step.index} ({step.eqn.op.name}) was not lowered "
                                    "by the cuda backend", op=step.eqn.op.name, backend="cuda")
            operands = {i: ptr(p) for i, p in enumerate(step.inputs) if not isinstance(p, Lit)}
            operands[OUT] = ptr(step.out)
            alias = compiled.program.alias
            if alias is not None and not step.inplace and operands[alias] != operands[OUT]:
                # the kernel updates in place: start from a copy of the operand it updates
                self._actions.append(("copy", operands[OUT], operands[alias], step.out.nbytes))
            scratch = {b.name: rt.alloc(b.nbytes, f"scratch:{step.index}:{b.name}").ptr
                       for b in compiled.program.scratch}
            for launch in bind(compiled, rt.modules, operands, scratch, self.overlap):
                self._actions.append(("launch", launch))
        for c in plan.copies:
            self._actions.append(("copy", ptr(c.dst), ptr(c.src), c.src.nbytes))

    def _enqueue(self) -> None:
        ctx = self.rt.ctx
        for action in self._actions:
            if action[0] == "launch":
                launch: Launch = action[1]
                launch(ctx)
            else:
                _, dst, src, nbytes = action
                ctx.copy(dst, src, nbytes)

    def run(self) -> None:
        if not self.replay:
            self.run_eager()
            return
        if self._graph is None:
            self._graph = Graph(self.rt.ctx, self._enqueue)
            self.recorded = True
        self._graph.launch()
        self.rt.ctx.sync()

    def run_eager(self) -> None:
        """Launch every action directly (no graph), for comparison and debugging."""
        self._enqueue()
        self.rt.ctx.sync()
