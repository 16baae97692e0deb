"""The CUDA runtime: device memory, plan loading, launches and CUDA graph replay.

`CudaRuntime` follows poot.contract.Runtime through poot.runtime.stream: buffers at
stable addresses from cuMemAlloc, and `load(plan, buffers)` building every launch
once. `CudaExecutable.run()` records the whole step into a CUDA graph on the first
call (stream capture) and replays the instantiated graph afterwards.

Graph replay is the default. `POOT_CUDA_REPLAY=0` (or `false`/`no`/`off`, read when a plan is
loaded), or `executable.replay = False` on one loaded plan, launches every kernel of the step
directly instead, each step: for measuring what replay saves, and for debugging.
On sm_90+ kernels are launched as programmatic dependent launches (each kernel's launch
overlaps the previous one's work; the kernel waits inside until its inputs are written):
`POOT_CUDA_OVERLAP=0`, read when a plan is loaded, launches them the ordinary way.
"""
from __future__ import annotations

from collections.abc import Mapping

from poot.runtime.stream import DeviceBuffer, StreamExecutable, StreamRuntime, env_on

from poot_cuda.driver import Context, Graph
from poot_cuda.kernels import ModuleCache, bind

REPLAY_ENV = "POOT_CUDA_REPLAY"
OVERLAP_ENV = "POOT_CUDA_OVERLAP"


def replay_default() -> bool:
    """Whether loaded plans replay a recorded CUDA graph: yes unless $POOT_CUDA_REPLAY says no."""
    return env_on(REPLAY_ENV)


def overlap_default(device) -> bool:
    """Programmatic dependent launches (each kernel's launch overlaps the previous kernel;
    sm_90+): on unless $POOT_CUDA_OVERLAP says no."""
    return dict(device.info).get("major", 0) >= 9 and env_on(OVERLAP_ENV)


class CudaExecutable(StreamExecutable):
    """One plan bound to its buffers (see poot.runtime.stream); `replay` defaults to
    $POOT_CUDA_REPLAY, `overlap` to $POOT_CUDA_OVERLAP on sm_90+."""

    backend, graph = "cuda", Graph

    def __init__(self, rt: CudaRuntime, plan, buffers: Mapping[str, DeviceBuffer]):
        # kernels after a collective launch the ordinary way: an NCCL kernel never signals
        # its dependents early, so nothing is gained and a captured programmatic edge to a
        # communication kernel is not worth the risk
        self.overlap = overlap_default(rt.device) and not any(
            s.lowering.extra.get("collective") for s in plan.steps)
        super().__init__(rt, plan, buffers, replay_default())

    def launches(self, compiled, operands, scratch, constants=frozenset()) -> list:
        return bind(compiled, self.rt.modules, operands, scratch, self.overlap, constants)


class CudaRuntime(StreamRuntime):
    executable = CudaExecutable

    def __init__(self, device):
        super().__init__(device, Context(device.index))
        self.modules = ModuleCache(self.ctx)
