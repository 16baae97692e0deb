"""Runtimes over a stream-and-graph GPU API (the CUDA driver, HIP): what they share.

A backend's context holds one device and one stream (`alloc`, `free`, `write`
queued on the stream, `read` that waits, device-to-device `copy`, `sync`): a
poot.runtime.stream_driver.StreamContext with the driver's calls.
`StreamRuntime` gives poot.contract.Runtime's buffers at stable addresses on it;
`StreamExecutable` binds a plan once into a list of actions (kernel launches with
their pointers fixed, device copies) and `run()` records the whole step into a graph
on the first call (stream capture) and replays the instantiated graph afterwards.
With `replay` off it launches every action directly, each step (for measuring what
replay saves, and for debugging).

A backend subclasses both: the executable names its `backend`, its `graph` class
(constructed as graph(ctx, record) to capture `record`'s stream work; `launch()`
queues a replay) and `launches(compiled, operands, scratch)`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from poot.codegen.program import OUT
from poot.errors import UnsupportedOp
from poot.ir.graph import Lit


def env_on(name: str) -> bool:
    """A switch read from the environment: on unless it says 0, false, no or off."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class DeviceBuffer:
    nbytes: int
    label: str
    ptr: int


class StreamRuntime:
    """Device memory of one context; `executable` is the backend's StreamExecutable."""

    executable: type

    def __init__(self, device, ctx):
        self.device, self.ctx = device, ctx
        self._buffers: list[DeviceBuffer] = []
        #: this rank's membership of a tensor-parallel group (poot.contract.Communicator
        #: with `all_reduce`/`all_gather(src, dst, count, dtype, stream)` over device
        #: pointers), set before a plan holding collectives is loaded
        self.communicator = None

    def alloc(self, nbytes: int, label: str) -> DeviceBuffer:
        buf = DeviceBuffer(nbytes, label, self.ctx.alloc(nbytes))   # 256-byte aligned
        self._buffers.append(buf)
        return buf

    def write(self, buf: DeviceBuffer, offset: int, array: np.ndarray) -> None:
        self.ctx.write(buf.ptr + offset, array)

    def read(self, buf: DeviceBuffer, offset: int, nbytes: int) -> np.ndarray:
        return self.ctx.read(buf.ptr + offset, nbytes)

    def copy(self, dst: DeviceBuffer, dst_offset: int, src: DeviceBuffer, src_offset: int,
             nbytes: int) -> None:
        """Device-to-device copy, queued on the stream after the work queued before it."""
        self.ctx.copy(dst.ptr + dst_offset, src.ptr + src_offset, nbytes)

    def read_later(self, buf: DeviceBuffer, offset: int, nbytes: int):
        """Queue a read of `nbytes` behind the stream's work; returns `wait()`, which
        returns the bytes once they are here (waiting for that read alone, not for work
        queued after it). A context without queued reads reads now."""
        later = getattr(self.ctx, "read_later", None)
        if later is None:
            raw = self.read(buf, offset, nbytes)
            return lambda: raw
        return later(buf.ptr + offset, nbytes)

    def load(self, plan, buffers: Mapping[str, DeviceBuffer]):
        return self.executable(self, plan, buffers)

    def close(self) -> None:
        self.ctx.sync()
        for b in self._buffers:
            self.ctx.free(b.ptr)
        self._buffers.clear()


class StreamExecutable:
    """One plan bound to its buffers: a list of queued actions, recorded once."""

    backend = ""
    graph: type

    def __init__(self, rt: StreamRuntime, plan, buffers: Mapping[str, DeviceBuffer],
                 replay: bool = True):
        from poot.kernel_backend import CompiledProgram

        self.rt, self.recorded, self.replay = rt, False, replay
        self._graph = None
        self._actions: list = []
        #: a plan with collectives runs its first step unrecorded: the communicator's first
        #: calls set up its connections, which stream capture cannot record
        self._warm = not any(s.lowering.extra.get("collective") for s in plan.steps)

        def ptr(place) -> int:
            if place.strides is not None:
                raise UnsupportedOp(f"{self.backend} kernels read contiguous operands; the "
                                    f"plan gave a strided view {place}", backend=self.backend)
            return buffers[place.region].ptr + place.offset

        # steps run one after another on the stream (a launch that overlaps the one before
        # reads only weights until it waits for it), so every step's scratch shares one
        # allocation, as large as the largest step's
        need = max((_scratch_bytes(s.lowering.program) for s in plan.steps), default=0)
        pool = rt.alloc(need, "scratch").ptr if need else 0
        for step in plan.steps:
            if step.lowering.extra.get("collective"):
                self._actions.append(("launch", self.collective(step, ptr)))
                continue
            compiled = step.lowering.program
            if not isinstance(compiled, CompiledProgram):
                raise UnsupportedOp(f"step {step.index} ({step.eqn.op.name}) was not lowered "
                                    f"by the {self.backend} backend", op=step.eqn.op.name,
                                    backend=self.backend)
            operands = {i: ptr(p) for i, p in enumerate(step.inputs) if not isinstance(p, Lit)}
            operands[OUT] = ptr(step.out)
            constants = frozenset(i for i, p in enumerate(step.inputs) if not isinstance(p, Lit)
                                  and plan.regions[p.region].kind == "weight")
            alias = compiled.program.alias
            if alias is not None and not step.inplace and operands[alias] != operands[OUT]:
                # the kernel updates in place: start from a copy of the operand it updates
                self._actions.append(("copy", operands[OUT], operands[alias], step.out.nbytes))
            scratch = {b.name: pool + at for b, at in _scratch_offsets(compiled)}
            for launch in self.launches(compiled, operands, scratch, constants):
                self._actions.append(("launch", launch))
        for c in plan.copies:
            self._actions.append(("copy", ptr(c.dst), ptr(c.src), c.src.nbytes))

    def collective(self, step, ptr):
        """A collective step as an action queued on the stream (captured into the step's
        graph like a launch): the communicator's call over the operand's and the result's
        device pointers; `count` is the operand's element count (per rank, for AllGather)."""
        op, comm = step.eqn.op, self.rt.communicator
        if comm is None or comm.ranks != op.ranks:
            have = "none" if comm is None else comm.ranks
            raise UnsupportedOp(f"{op!r} needs a communicator of {op.ranks} ranks; this "
                                f"runtime has {have}", op=op.name, backend=self.backend,
                                device=str(self.rt.device))
        src, dst = ptr(step.inputs[0]), ptr(step.out)
        t = step.inputs[0].type
        run = comm.all_reduce if op.name == "AllReduce" else comm.all_gather
        count = 1
        for d in t.shape:
            count *= d
        return lambda ctx: run(src, dst, count, t.dtype, ctx.stream)

    def launches(self, compiled, operands: dict[int, int], scratch: dict[str, int],
                 constants: frozenset[int] = frozenset()) -> list:
        """The backend's bound launches of one step (callables taking the context);
        `constants`: the operands bound to weight regions, which no step writes."""
        raise NotImplementedError

    def _enqueue(self) -> None:
        ctx = self.rt.ctx
        for action in self._actions:
            if action[0] == "launch":
                action[1](ctx)
            else:
                _, dst, src, nbytes = action
                ctx.copy(dst, src, nbytes)

    def run(self) -> None:
        self.launch()
        self.rt.ctx.sync()

    def launch(self) -> None:
        """Queue the step on the stream without waiting for it."""
        if not self.replay or not self._warm:
            self._warm = True
            self._enqueue()
            return
        if self._graph is None:
            self._graph = self.graph(self.rt.ctx, self._enqueue)
            self.recorded = True
        self._graph.launch()

    def run_eager(self) -> None:
        """Launch every action directly (no graph), for comparison and debugging."""
        self._enqueue()
        self.rt.ctx.sync()


SCRATCH_ALIGN = 256


def _scratch_offsets(compiled) -> list:
    """(buffer, byte offset) of each scratch buffer of a step's CompiledProgram in the
    shared pool (none for a step of another kind)."""
    out, at = [], 0
    for b in getattr(getattr(compiled, "program", None), "scratch", ()):
        out.append((b, at))
        at += -(-b.nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
    return out


def _scratch_bytes(compiled) -> int:
    return sum(-(-b.nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
               for b, _ in _scratch_offsets(compiled))


__all__ = ["DeviceBuffer", "StreamExecutable", "StreamRuntime", "env_on"]
