"""A recorded step: the dispatch list of a plan, replayed as one submit per step.

wgpu command buffers are single-use (a finished buffer cannot be submitted twice, and
wgpu-py has no compute bundles), so what is recorded once is everything that costs:
pipelines, bind groups, workgroup counts. Each replay encodes the list into one
command encoder and one compute pass (a few Python calls per dispatch, no validation
of new objects) and submits it once. WebGPU orders the dispatches of a pass and makes
each one's storage writes visible to the next, so no barriers are recorded here.
"""
from __future__ import annotations

from poot_wgpu.device import WgpuDevice
from poot_wgpu.kernel import Dispatch


class RecordedStep:
    def __init__(self, dev: WgpuDevice, dispatches: list[Dispatch], label: str = "poot-step"):
        self.dev, self.dispatches, self.label = dev, list(dispatches), label
        self.replays = 0

    def submit(self) -> None:
        """Encode the recorded dispatches into one command buffer and submit it."""
        encoder = self.dev.device.create_command_encoder(label=self.label)
        compute = encoder.begin_compute_pass(label=self.label)
        current = None
        for d in self.dispatches:
            if d.kernel is not current:  # consecutive dispatches of one kernel share state
                compute.set_pipeline(d.kernel.pipeline)
                current = d.kernel
            compute.set_bind_group(0, d.bind_group)
            compute.dispatch_workgroups(*d.groups)
        compute.end()
        self.dev.queue.submit([encoder.finish()])
        self.replays += 1
