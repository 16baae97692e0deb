"""The ROCm runtime: device memory, plan loading, launches and HIP graph replay.

`RocmRuntime` follows poot.runtime.protocol: buffers at stable addresses from
hipMalloc, writes queued on the stream, reads that wait for it, and
`load(plan, buffers)` binding every launch once. `RocmExecutable.run()` records the
whole step into a HIP graph on the first call (stream capture) and replays the
instantiated graph afterwards, as the CUDA backend does with CUDA graphs.

`POOT_ROCM_REPLAY=0` (or `false`/`no`/`off`, read when a plan is loaded), or
`executable.replay = False`, launches every kernel of the step directly instead.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from poot.codegen.program import OUT
from poot.errors import UnsupportedOp
from poot.ir.graph import Lit

from poot_rocm.driver import Context, Graph, Launch
from poot_rocm.kernels import CompiledProgram, ModuleCache, bind

REPLAY_ENV = "POOT_ROCM_REPLAY"


def replay_default() -> bool:
    """Whether loaded plans replay a recorded HIP graph: yes unless $POOT_ROCM_REPLAY says no."""
    return os.environ.get(REPLAY_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class RocmBuffer:
    nbytes: int
    label: str
    ptr: int


class RocmRuntime:
    def __init__(self, device, context: Context | None = None):
        self.device = device
        self.ctx = context or Context(device.index)
        self.modules = ModuleCache(self.ctx)
        self._buffers: list[RocmBuffer] = []

    def alloc(self, nbytes: int, label: str) -> RocmBuffer:
        buf = RocmBuffer(nbytes, label, self.ctx.alloc(nbytes))  # hipMalloc: 256-aligned
        self._buffers.append(buf)
        return buf

    def write(self, buf: RocmBuffer, offset: int, array: np.ndarray) -> None:
        self.ctx.write(buf.ptr + offset, array)

    def read(self, buf: RocmBuffer, offset: int, nbytes: int) -> np.ndarray:
        return self.ctx.read(buf.ptr + offset, nbytes)

    def load(self, plan, buffers: Mapping[str, RocmBuffer]) -> RocmExecutable:
        return RocmExecutable(self, plan, buffers)

    def close(self) -> None:
        self.ctx.sync()
        for b in self._buffers:
            self.ctx.free(b.ptr)
        self._buffers.clear()


class RocmExecutable:
    """One plan bound to its buffers: a list of queued actions, recorded once."""

    def __init__(self, rt: RocmRuntime, plan, buffers: Mapping[str, RocmBuffer]):
        self.rt, self.recorded = rt, False
        self.replay = replay_default()
        self._graph: Graph | None = None
        self._actions: list = []

        def ptr(place) -> int:
            if place.strides is not None:
                raise UnsupportedOp("rocm kernels read contiguous operands; the plan gave a "
                                    f"strided view {place}", backend="rocm")
            return buffers[place.region].ptr + place.offset

        for step in plan.steps:
            compiled = step.lowering.program
            if not isinstance(compiled, CompiledProgram):
                raise UnsupportedOp(f"step {step.index} ({step.eqn.op.name}) was not lowered "
                                    "by the rocm backend", op=step.eqn.op.name, backend="rocm")
            operands = {i: ptr(p) for i, p in enumerate(step.inputs) if not isinstance(p, Lit)}
            operands[OUT] = ptr(step.out)
            alias = compiled.program.alias
            if alias is not None and not step.inplace and operands[alias] != operands[OUT]:
                # the kernel updates in place: start from a copy of the operand it updates
                self._actions.append(("copy", operands[OUT], operands[alias], step.out.nbytes))
            scratch = {b.name: rt.alloc(b.nbytes, f"scratch:{step.index}:{b.name}").ptr
                       for b in compiled.program.scratch}
            for launch in bind(compiled, rt.modules, operands, scratch):
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
