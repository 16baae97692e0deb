"""ArgTopK's row kernel against the oracle on the values that decide an order: ties
(the lower index first), both zeros, infinities and NaN (below -inf)."""
from __future__ import annotations

import numpy as np
import pytest
from poot.conformance.cases import T, case, one
from poot.conformance.inputs import Arg
from poot.conformance.runner import run_case
from poot.dtypes import DType
from poot.ir import ops as O
from poot.oracle import evaluate
from poot.plan import plan


@pytest.mark.parametrize("k", [1, 5])
def test_argtopk_rows_match_the_oracle(cpu_backend, k):
    rng = np.random.default_rng(k)
    x = rng.choice(np.array([0.0, -0.0, 1.5, -1.5, 2.0, np.inf, -np.inf, np.nan,
                             3.25, -7.0], np.float32), (3, 300))
    x[1] = rng.standard_normal(300).astype(np.float32)
    x[2, :] = 1.0                                       # every entry tied
    c = case(f"ArgTopK-f32-3x300-k{k}", "ArgTopK", DType.F32, [Arg(T((3, 300), DType.F32))],
             one(O.ArgTopK(k)), exact=True)
    device = cpu_backend.probe()[0]
    (step,) = plan(c.graph, (cpu_backend, device)).steps
    assert step.lowering.program.kernels[0].name.endswith("_rows")
    (want,) = evaluate(c.graph, [x], outputs="result")
    out = run_case(c.graph, [x], cpu_backend, device, cpu_backend.runtime(device), rng)
    assert not out.problems
    np.testing.assert_array_equal(out.result, want)
