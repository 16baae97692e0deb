"""A recorded step: the dispatch list of a plan, replayed as one submit per step.

wgpu command buffers are single-use (a finished buffer cannot be submitted twice, and
wgpu-py has no compute bundles), so what is recorded once is everything that costs:
pipelines, bind groups, workgroup counts, copy ranges. Each replay encodes the list
into one command encoder (one compute pass, then the end-of-step copies) and submits
it once; that is a few Python calls per dispatch and no new wgpu objects but the
encoder, and a replayed step encodes its next buffer while the device runs the last.
WebGPU orders the dispatches of a pass and makes each one's storage writes visible to the
next, so no barriers are recorded here: wgpu places them (`implicit_barriers` counts them).
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.optional import require

from poot_wgpu.device import WgpuDevice
from poot_wgpu.kernel import Dispatch


@dataclass(frozen=True)
class BufferCopy:
    """copy_buffer_to_buffer arguments (offsets and size in whole words)."""

    src: object
    src_offset: int
    dst: object
    dst_offset: int
    size: int


def native_pass_functions():
    """wgpu-native's compute-pass entry points as wgpu-py binds them, or None.

    Encoding is the cost of a replay on a real GPU (about 12 us per dispatch through
    wgpu-py's methods, 6 us through these; SmolLM2 has ~550 dispatches a step). They are
    wgpu-py internals, so any other wgpu-py layout falls back to the public methods.
    """
    try:
        native = require("wgpu.backends.wgpu_native._ffi", "wgpu")
        ffi, lib = native.ffi, native.lib

        return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)
    except (ImportError, AttributeError):
        return None


class RecordedStep:
    """`dispatches` then `copies`, encoded into a fresh command buffer for every submit.

    On the native path the calls of an encode are flattened once here: per dispatch the
    pipeline to set (None where the previous dispatch's stays), the bind group and the
    workgroup counts as wgpu-native handles, so an encode is a loop over tuples. A step
    submitted more than once (a replayed plan) encodes its next command buffer right after
    each submit, while the device runs the one just submitted: the next submit then costs
    the submit alone. That is sound because the recording does not depend on any value:
    slot writes and reads queued later are ordered by the queue, not by the encode.
    """

    def __init__(self, dev: WgpuDevice, dispatches: list[Dispatch],
                 copies: list[BufferCopy] = (), label: str = "poot-step", native: bool = True,
                 ahead: bool = True):
        self.dev, self.label, self.ahead = dev, label, ahead
        self.dispatches, self.copies = list(dispatches), list(copies)
        self.native = native_pass_functions() if native else None
        try:
            self.calls = _native_calls(self.dispatches) if self.native else None
        except AttributeError:  # wgpu-py objects of another layout: the public methods
            self.native = self.calls = None
        self.replays = 0
        self._next = None     # the command buffer encoded ahead for the next submit

    def submit(self) -> None:
        """Submit the step's command buffer (the one encoded ahead, else a new one). The
        queue runs it before any later write or read (those wait for it)."""
        commands, self._next = self._next or self.encode(), None
        self.dev.queue.submit([commands])
        self.replays += 1
        if self.ahead and self.replays > 1:
            self._next = self.encode()

    def encode(self):
        """The step's command buffer: the dispatches in one compute pass, then the copies."""
        encoder = self.dev.device.create_command_encoder(label=self.label)
        if self.dispatches:
            compute = encoder.begin_compute_pass(label=self.label)
            if self.native and hasattr(compute, "_internal"):
                self._encode_native(compute._internal)
            else:
                self._encode(compute)
            compute.end()
        for c in self.copies:
            encoder.copy_buffer_to_buffer(c.src, c.src_offset, c.dst, c.dst_offset, c.size)
        return encoder.finish()

    def _encode(self, compute) -> None:
        current = None
        for d in self.dispatches:
            if d.kernel is not current:  # consecutive dispatches of a kernel share state
                compute.set_pipeline(d.kernel.pipeline)
                current = d.kernel
            compute.set_bind_group(0, d.bind_group)
            compute.dispatch_workgroups(*d.groups)

    def _encode_native(self, handle) -> None:
        # the same calls as _encode; self.dispatches keeps every object alive
        set_pipeline, set_bind_group, dispatch, null = self.native
        for pipeline, group, x, y, z in self.calls:
            if pipeline is not None:
                set_pipeline(handle, pipeline)
            set_bind_group(handle, 0, group, 0, null)
            dispatch(handle, x, y, z)


def _native_calls(dispatches: list[Dispatch]) -> list[tuple]:
    """(pipeline or None, bind group, x, y, z) per dispatch as wgpu-native handles; the
    pipeline is None where the previous dispatch's kernel is the same (consecutive
    dispatches of a kernel share it)."""
    calls, current = [], None
    for d in dispatches:
        pipeline = None if d.kernel is current else d.kernel.pipeline._internal
        calls.append((pipeline, d.bind_group._internal, *d.groups))
        current = d.kernel
    return calls


def implicit_barriers(dispatches: list[Dispatch]) -> int:
    """How many of `dispatches`, encoded in one compute pass, wgpu makes wait for earlier
    work: each dispatch is a usage scope, and wgpu tracks each buffer's last usage, placing
    a barrier before a dispatch that binds a buffer an earlier one bound unless both
    bound it read-only (the one usage that orders itself)."""
    last: dict[int, bool] = {}  # buffer -> read-only at its last dispatch
    waits = 0
    for d in dispatches:
        now: dict[int, bool] = {}
        for r, ro in zip(d.resources, d.kernel.readonly, strict=True):
            key = id(r["buffer"])
            now[key] = now.get(key, True) and ro
        waits += any(k in last and not (last[k] and ro) for k, ro in now.items())
        last.update(now)
    return waits
