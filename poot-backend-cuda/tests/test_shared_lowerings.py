"""A plan lowers each eqn signature once: a model's repeated layers share lowerings."""
from __future__ import annotations

import poot
from poot.models.llama import build_decoder, random_weights, tiny_config
from poot.plan import plan


def test_repeated_layers_share_their_lowerings():
    from poot_cuda.backend import CudaBackend

    backend = CudaBackend()
    device = backend.compile_only_device("sm_90")
    config = tiny_config(layers=4)
    step = build_decoder(config, random_weights(config, dtype="bf16"), tokens=1)
    p = plan(poot.compile(step.graph, (backend, device)), (backend, device))
    kernels = [s for s in p.steps if s.lowering.dispatches]
    shared = {id(s.lowering) for s in kernels}
    assert len(shared) < len(kernels) / 2          # layers 2..4 reuse layer 1's kernels
    backend.forget_lowerings()
    again = plan(poot.compile(step.graph, (backend, device)), (backend, device))
    assert [s.lowering.kernel for s in again.steps] == [s.lowering.kernel for s in p.steps]


def test_the_backends_schedule_reaches_its_contractions():
    """KernelBackend.schedule(device): a plan under a schedule of 4 groups a workgroup
    lowers its GEMVs in workgroups of 128 threads (named apart), every other kernel as
    under the default, by the same name (the compiler's cache keeps serving them)."""
    from dataclasses import replace

    from poot.codegen.lower.schedule import dot_schedule
    from poot_cuda.backend import CudaBackend

    class Tuned(CudaBackend):
        def schedule(self, device):
            return replace(dot_schedule(self.features(device)), groups=4)

    config = tiny_config(layers=1)
    step = build_decoder(config, random_weights(config, dtype="bf16"), tokens=1)
    kernels = []
    for backend in (CudaBackend(), Tuned()):
        device = backend.compile_only_device("sm_90")
        p = plan(poot.compile(step.graph, (backend, device)), (backend, device))
        kernels.append([k for s in p.steps if s.lowering.dispatches
                        for k in s.lowering.program.program.kernels])
    contractions = 0
    for default, tuned in zip(*kernels, strict=True):
        if "contraction" in default.name:
            contractions += 1
            assert (default.workgroup, tuned.workgroup) == ((256,), (128,))
            assert tuned.name != default.name
        else:
            assert (tuned.name, repr(tuned.body)) == (default.name, repr(default.body))
    assert contractions >= 4
