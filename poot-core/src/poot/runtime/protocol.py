"""The Runtime contract: what a backend's `runtime(device)` returns.

One Runtime per backend device. It owns device memory and runs planned steps;
it knows nothing about graphs beyond the Plan it is handed. The Executor
(`poot.runtime.Executor`) drives it:

    rt = backend.runtime(device)
    arena = rt.alloc(plan.arena_size, "arena")           # once, before the first step
    w = rt.alloc(nbytes, "w:blk.0.attn_q"); rt.write(w, 0, array)   # each weight once
    exe = rt.load(plan, {region.name: buffer for every region of the plan})
    for each step:
        rt.write(slot_buffer, 0, token_ids)               # slots rewritten in place
        exe.run()                                         # one step
        rt.read(arena, place.offset, place.nbytes)        # outputs, as bytes

Rules every runtime keeps (the conformance suite checks them):
- `alloc` returns memory at a stable address: a Buffer never moves or changes size, so a
  recorded step (CUDA graph, Vulkan command buffer) stays valid for the buffer's life.
- `write` and `read` are synchronous with respect to `run`: a write issued before `run`
  is seen by that step; a read issued after `run` sees the step's results.
- `load` builds everything a step needs (kernels, pipelines, bind groups, launch
  arguments) once per plan; `Executable.run()` allocates nothing and compiles nothing.
- A GPU runtime records the step on the first `run()` and replays the recording on
  every later call (buffers are at stable addresses and slots are rewritten in place,
  so the recording stays valid). The reference runtime runs the plan directly.
  Recording is therefore implicit in `run()`; `Executable.recorded` says whether the
  next `run()` replays a recording.

The layout `load` receives is fixed by the Plan (`poot.plan.Plan`): every value of a
step lives in a `Place` (a region name, a byte offset, a tensor type and optional
element strides); `buffers` maps each `plan.regions` name to the Buffer holding it.
Region kinds: "arena" (all Device intermediates, one buffer), "weight" (a bound const or
a bind-time folded value, shared through the weight cache), "slot" (per-step inputs,
rewritten by the host), "state" (carried across steps, donated: updated in place).

What a step does, in order: every `plan.steps` entry (one eqn each: `step.lowering` is what
the backend's `lower` chose, `step.inputs` a Place per Value operand and the Lit itself per
literal, `step.out` the result's Place), then every `plan.copies` entry (a state_out value
copied into its state buffer). A step with `inplace=True` is a DynamicUpdateSlice or
ScatterUpdate whose result Place is its first operand's Place (the donated state buffer):
writing only the update is enough. Places with `strides` occur only where the lowering
said `strided_inputs=True`. `plan.notes` (aliases, views, bind-time folds) dispatch nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from poot.backend import Device
    from poot.plan import Plan


@runtime_checkable
class Buffer(Protocol):
    """A block of device memory at a stable address.

    `nbytes` is its size and `label` a name for messages and `poot plan`. A backend adds
    whatever it needs (a device pointer, a wgpu buffer, a numpy array).
    """

    nbytes: int
    label: str


@runtime_checkable
class Executable(Protocol):
    """A plan loaded onto a runtime with its buffers bound: one call of `run()` is one step."""

    #: True once a recording exists, so the next `run()` replays it (always False for
    #: runtimes that run the plan directly, such as the reference runtime)
    recorded: bool

    def run(self) -> None:
        """Run one step: every planned kernel in order, then the plan's end-of-step copies.

        Reads slots, state and weights from their buffers and writes the arena and the
        donated state buffers in place. Allocates nothing. A GPU runtime records the
        step on the first call and replays it afterwards; it returns when the step is
        complete (a following `Runtime.read` sees its results).
        """
        ...


@runtime_checkable
class Runtime(Protocol):
    """Memory and execution on one device of one backend."""

    device: Device

    def alloc(self, nbytes: int, label: str) -> Buffer:
        """Device memory of `nbytes` bytes at a stable address (contents undefined).

        Alignment: at least 256 bytes, so every arena offset the planner hands out
        (multiples of 256) is aligned for any dtype and for storage-buffer binding.
        Raises `poot.errors.CapacityError` when the device is out of memory.
        """
        ...

    def write(self, buf: Buffer, offset: int, array: np.ndarray) -> None:
        """Copy the bytes of `array` (C order) from the host into `buf` at byte `offset`,
        in place (the buffer keeps its address)."""
        ...

    def read(self, buf: Buffer, offset: int, nbytes: int) -> np.ndarray:
        """`nbytes` bytes of `buf` from byte `offset`, as a fresh host uint8 array."""
        ...

    def load(self, plan: Plan, buffers: Mapping[str, Buffer]) -> Executable:
        """Build the plan's kernels once and bind them to `buffers` (one Buffer per
        `plan.regions` name). Raises the backend's typed LoweringError for anything it
        cannot run, before any step runs."""
        ...


__all__ = ["Buffer", "Executable", "Runtime"]
