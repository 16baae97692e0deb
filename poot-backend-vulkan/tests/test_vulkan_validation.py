"""The runtime under the Khronos validation layer, synchronization validation included: a
plan's recorded step and its profile raise no validation error or warning, so the step's
barriers (placed by hazard, naming only the stages on either side) cover every read after
write, write after read and host access, also where a value is read batches after the
one that wrote it. The layer must be on when the process's instance is created, so this
runs in a fresh process; skipped where it is not installed. Run on both memory paths:
mapped device memory (slots written and outputs read in place) and staging (slots
uploaded by the step's first copies, outputs copied to the host by its last), which
`POOT_VULKAN_STAGING=1` forces where device memory is mapped."""

import pytest

SCRIPT = r"""
import numpy as np
from poot.conformance.roles import input_role
from poot.dtypes import DType
from poot.ir import ops as O
from poot.ir.builder import Builder
from poot.plan import plan
from poot.plugin import get_backend
from poot.runtime.executor import Executor

backend = get_backend("vulkan")
target = (backend, backend.probe()[0])
b = Builder("validated", compiler=True)
x = b.slot(input_role(DType.F32), (5, 300), "x0")
e = b.eqn(O.Unary(O.UnaryOp.Exp), b.eqn(O.Unary(O.UnaryOp.Exp), x))
# x (a slot: uploaded by a copy where staged) read again two barriers later
s = b.eqn(O.Reduce(O.ReduceOp.Sum, 1), b.eqn(O.Binary(O.BinaryOp.Add), e, x))
b.result(s)
ex = Executor(plan(b.finish(), target), {})
rng = np.random.default_rng(0)
for _ in range(3):  # a new slot value every step
    a = rng.standard_normal((5, 300)).astype(np.float32)
    got = ex.step({"x0": a}).result
    np.testing.assert_allclose(got, (np.exp(np.exp(a)) + a).sum(1), rtol=1e-5)
from poot.plan import ARENA
step, staged = ex.executable.step, ex.buffers[ARENA].mapped is None
assert len(step.uploads) == staged and step.barriers == 3 + 2 * staged, step.barriers
print("STAGED", staged)
print("BARRIER", step.barrier)
from poot_vulkan.step import Dispatch
# the row sum's subgroup reduction asks for its subgroup size where the device allows
required = [op.pipeline.subgroup for op in step.ops if isinstance(op, Dispatch)]
assert any(required) == ex.runtime.dev.facts.has("subgroupSizeControl"), required
from poot_vulkan.profile import profile
print(profile(ex.executable.step, runs=2).table())  # the timestamp queries validated too
"""


@pytest.mark.parametrize("staging,barrier", [("0", "narrow"), ("1", "narrow"),
                                             ("1", "sync2"), ("1", "wide")])
def test_a_plan_runs_clean_under_the_validation_layer(vulkan_device, staging, barrier,
                                                      run_validated):
    """Every barrier form (POOT_VULKAN_BARRIER) covers the step's hazards; sync2 where
    the device has VK_KHR_synchronization2."""
    if barrier == "sync2" and vulkan_device.barrier2 is None:
        pytest.skip("the device lacks VK_KHR_synchronization2")
    out = run_validated(SCRIPT, POOT_VULKAN_STAGING=staging, POOT_VULKAN_BARRIER=barrier,
                        VK_LAYER_ENABLES=(
                            "VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT"))
    if staging == "1":
        assert "STAGED True" in out, out
    assert f"BARRIER {barrier}" in out, out
