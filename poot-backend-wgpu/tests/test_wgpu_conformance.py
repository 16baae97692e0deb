"""poot's conformance cases (poot.conformance.cases) on the wgpu backend, on the device.

Each case runs through the public pipeline (plan, Executor, guarded arena, replay; see
poot.conformance.runner). A case whose (op, dtype) the wgpu table declares must match the
oracle with no out-of-bounds write and a bit-identical replay; any other case must be
refused with a typed LoweringError naming the wgpu backend, at plan time.
"""
import numpy as np
import pytest
from poot.conformance.cases import all_cases
from poot.conformance.compare import mismatch
from poot.conformance.inputs import draw_all
from poot.conformance.runner import run_case
from poot.errors import LoweringError
from poot.oracle.evaluate import evaluate
from poot_wgpu.backend import BACKEND_INSTANCE

CASES = all_cases()


@pytest.fixture(scope="module")
def target(wgpu_device):
    device = BACKEND_INSTANCE.probe()[0]
    return device, BACKEND_INSTANCE.runtime(device), BACKEND_INSTANCE.capabilities(device)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(target, case):
    device, runtime, table = target
    rng = np.random.default_rng(sum(map(ord, case.id)))
    inputs = draw_all(rng, case.args, case.fixed)
    g = case.graph
    refusals = table.graph_refusals(g)
    if refusals:
        with pytest.raises(LoweringError) as e:
            run_case(g, inputs, BACKEND_INSTANCE, device, runtime, rng)
        assert e.value.backend == "wgpu", str(e.value)
        return
    (want,) = evaluate(g, inputs, outputs="result")
    outcome = run_case(g, inputs, BACKEND_INSTANCE, device, runtime, rng)
    assert not outcome.problems, outcome.problems
    problem = mismatch(np.asarray(want), outcome.result, case.exact, case.tol)
    assert problem is None, problem
