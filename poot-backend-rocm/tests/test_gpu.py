"""On an AMD GPU: a tiny random-weight Llama step (f32, bf16 and packed GGUF weights
decoded in the kernels) through compile, plan and the ROCm runtime, step after step
against the reference backend, with the step recorded once as a HIP graph and replayed;
eager launches give the same result. Skipped with the probe's reason where there is
no ROCm device (the whole op suite runs with `poot conformance rocm`)."""
import numpy as np
import poot
import pytest
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plan import plan
from poot.runtime.executor import Executor

pytestmark = pytest.mark.gpu
CONFIG = tiny_config()


@pytest.mark.parametrize("weights_kw", [{}, {"dtype": "bf16"}, {"packed_format": "gguf:Q4_1"}],
                         ids=["f32", "bf16", "Q4_1"])
def test_decode_matches_reference_and_replays(gpu, weights_kw):
    from poot.plugin import backends

    backend = backends()["rocm"]
    device = backend.probe()[gpu.index]
    w = random_weights(CONFIG, seed=7, **weights_kw)
    step = build_decoder(CONFIG, w)
    consts = const_inputs(step, w)
    ref = Executor(plan(step.graph, "reference"), consts)
    dev = Executor(plan(poot.compile(step.graph, (backend, device)), (backend, device)),
                   consts)
    for p, t in enumerate([3, 1, 4, 1, 5, 9]):
        if p == 5:
            assert dev.executable.recorded
            dev.executable.replay = False           # the last step launches eagerly
        slots = {"tokens": np.array([t], np.int32), "pos": np.array([p], np.int32)}
        want, got = ref.step(slots).result, dev.step(slots).result
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
