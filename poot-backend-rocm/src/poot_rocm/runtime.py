"""The ROCm runtime: device memory, plan loading, launches and HIP graph replay.

`RocmRuntime` follows poot.contract.Runtime through poot.runtime.stream (shared with
the CUDA backend): buffers at stable addresses from hipMalloc, host-device copies
on the context's stream, and `load(plan, buffers)` binding every launch once.
`RocmExecutable.run()` records the whole step into a HIP graph on the first call
(stream capture) and replays the instantiated graph afterwards.

`POOT_ROCM_REPLAY=0` (or `false`/`no`/`off`, read when a plan is loaded), or
`executable.replay = False`, launches every kernel of the step directly instead.
"""
from __future__ import annotations

from collections.abc import Mapping

from poot.runtime.stream import DeviceBuffer, StreamExecutable, StreamRuntime, env_on

from poot_rocm.driver import Context, Graph
from poot_rocm.kernels import ModuleCache, bind

REPLAY_ENV = "POOT_ROCM_REPLAY"


def replay_default() -> bool:
    """Whether loaded plans replay a recorded HIP graph: yes unless $POOT_ROCM_REPLAY says no."""
    return env_on(REPLAY_ENV)


class RocmExecutable(StreamExecutable):
    backend, graph = "rocm", Graph

    def __init__(self, rt: RocmRuntime, plan, buffers: Mapping[str, DeviceBuffer]):
        super().__init__(rt, plan, buffers, replay_default())

    def launches(self, compiled, operands, scratch, constants=frozenset()) -> list:
        return bind(compiled, self.rt.modules, operands, scratch)


class RocmRuntime(StreamRuntime):
    executable = RocmExecutable

    def __init__(self, device, context: Context | None = None):
        super().__init__(device, context or Context(device.index))
        self.modules = ModuleCache(self.ctx)
