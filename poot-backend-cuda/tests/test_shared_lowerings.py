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
