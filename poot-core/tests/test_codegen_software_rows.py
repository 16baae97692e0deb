"""The rows GEMV on a CPU device (lavapipe): `device_schedule` lays it out by ROWS_SOFTWARE
(few products a thread, K in one warp, short trips: small kernels for LLVM to compile),
only there; the kernel it gives still computes x @ w^T (through the kernel interpreter)."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.codegen.lower.schedule import (
    LANES,
    ROWS_SCATTERED,
    ROWS_SOFTWARE,
    SOFTWARE_ROWS_UNROLL,
    DotSchedule,
    device_schedule,
    int_schedule,
)
from poot.codegen.program import CoopReduce
from poot.codegen.target import DOT2, REDUCE_SCATTER
from poot.dtypes import DType
from poot.ir.ops import DenseContraction
from poot.ir.types import TensorType as T


def test_only_a_cpu_device_of_a_folding_target_takes_the_software_rows():
    s = device_schedule(frozenset(), 32 * 1024, software=True)
    assert s.rows == ROWS_SOFTWARE and s.rows_unroll == SOFTWARE_ROWS_UNROLL
    assert device_schedule(frozenset(), 32 * 1024, software=False) is None
    # a GPU keeps int_schedule's answer, a CPU device its integer GEMV bound too
    assert device_schedule({DOT2}, 16 * 1024, False) == int_schedule({DOT2}, 16 * 1024)
    assert device_schedule({DOT2}, 16 * 1024, True).int_shared_bytes == \
        int_schedule({DOT2}, 16 * 1024).int_shared_bytes < DotSchedule.int_shared_bytes
    # a target that reduce-scatters its products keeps its own tiles
    assert device_schedule({REDUCE_SCATTER}, 48 * 1024, True) is None
    assert DotSchedule(rows=ROWS_SCATTERED).rows != ROWS_SOFTWARE


@pytest.mark.parametrize("rows, n, k", [(32, 24, 576), (13, 8, 200)])
def test_the_software_rows_gemv_holds_one_tile_a_thread_and_matches_numpy(rows, n, k):
    """SmolLM2's 32-token q shape (narrowed): ROWS_SOFTWARE.tile products a thread, one warp
    a dot product; 13 rows leave the last tile partial."""
    schedule = device_schedule(frozenset(), 32 * 1024, software=True)
    ins = [T((rows, k), DType.F32), T((n, k), DType.F32)]
    op = DenseContraction()
    prog = lower(op, ins, op.infer(ins), schedule=schedule)
    (kernel,) = prog.kernels
    reductions = [s for s in kernel.statements() if isinstance(s, CoopReduce)]
    assert len(reductions) == ROWS_SOFTWARE.tile and {s.width for s in reductions} == {LANES}
    assert kernel.workgroup == (LANES * schedule.rows_groups,)
    rng = np.random.default_rng(rows + n)
    x, w = (rng.standard_normal(t.shape).astype(np.float32) for t in ins)
    got = run_lowering(prog, [x, w], op.infer(ins))
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-4)
