"""A recorded step: the dispatch list of a plan, replayed as one submit per step.

wgpu command buffers are single-use (a finished buffer cannot be submitted twice, and
wgpu-py has no compute bundles), so what is recorded once is everything that costs:
pipelines, bind groups, workgroup counts, copy ranges. Each replay encodes the list
into one command encoder (one compute pass, then the end-of-step copies) and submits
it once; that is a few Python calls per dispatch and no new wgpu objects but the
encoder. WebGPU orders the dispatches of a pass and makes each one's storage writes
visible to the next, so no barriers are recorded here.
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
    def __init__(self, dev: WgpuDevice, dispatches: list[Dispatch],
                 copies: list[BufferCopy] = (), label: str = "poot-step", native: bool = True):
        self.dev, self.label = dev, label
        self.dispatches, self.copies = list(dispatches), list(copies)
        self.native = native_pass_functions() if native else None
        self.replays = 0

    def submit(self) -> None:
        """Encode the recorded dispatches and copies into one command buffer and submit it.
        The queue runs it before any later write or read (those wait for it)."""
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
        self.dev.queue.submit([encoder.finish()])
        self.replays += 1

    def _encode(self, compute) -> None:
        current = None
        for d in self.dispatches:
            if d.kernel is not current:  # consecutive dispatches of a kernel share state
                compute.set_pipeline(d.kernel.pipeline)
                current = d.kernel
            compute.set_bind_group(0, d.bind_group)
            compute.dispatch_workgroups(*d.groups)

    def _encode_native(self, handle) -> None:
        # the same calls as _encode; the Dispatch list keeps every object alive
        set_pipeline, set_bind_group, dispatch, null = self.native
        current = None
        for d in self.dispatches:
            if d.kernel is not current:
                set_pipeline(handle, d.kernel.pipeline._internal)
                current = d.kernel
            set_bind_group(handle, 0, d.bind_group._internal, 0, null)
            dispatch(handle, *d.groups)
