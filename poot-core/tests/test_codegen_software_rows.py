"""The GEMVs on a CPU device (lavapipe): `device_schedule` lays the rows GEMV out by
ROWS_SOFTWARE (few products a thread, K in one warp, short trips) and stages nothing
(SOFTWARE_GEMV: no K loop a printer unrolls): small kernels for LLVM to compile, only
there; the kernel it gives still computes x @ w^T (through the kernel interpreter)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.codegen.lower.schedule import (
    LANES,
    ROWS_SCATTERED,
    ROWS_SOFTWARE,
    SOFTWARE_GEMV,
    SOFTWARE_ROWS_UNROLL,
    DotSchedule,
    device_schedule,
    dot_schedule,
    int_schedule,
)
from poot.codegen.expr import Const
from poot.codegen.program import CoopReduce, For
from poot.codegen.target import DOT2, DOT4, REDUCE_SCATTER
from poot.dtypes import DType
from poot.formats import PackedWeight
from poot.ir.ops import DenseContraction, PackedContraction
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
    assert device_schedule({REDUCE_SCATTER}, 48 * 1024, True).rows == ROWS_SCATTERED


@pytest.mark.parametrize("features", [frozenset(), {DOT2}, {DOT4}, {REDUCE_SCATTER},
                                      {DOT2, REDUCE_SCATTER}])
def test_a_gpu_keeps_its_schedule_and_a_cpu_device_stages_nothing(features):
    for shared in (16 * 1024, 48 * 1024, 228 * 1024):
        assert device_schedule(features, shared, False) == int_schedule(features, shared)
        gpu = int_schedule(features, shared) or dot_schedule(frozenset(features))
        cpu = device_schedule(features, shared, True)
        assert cpu.shared_bytes == 0 < gpu.shared_bytes
        assert replace(cpu, rows=gpu.rows, rows_unroll=gpu.rows_unroll,
                       **{f: getattr(gpu, f) for f in SOFTWARE_GEMV}) == gpu


def _packed_gemv(k: int, schedule):
    w = PackedWeight("gguf:Q8_0", (8, k))
    ins = [T((2, k), DType.F32)] + [s.type for s in w.sources()]
    op = PackedContraction(w)
    (kernel,) = lower(op, ins, op.infer(ins), frozenset({DOT4}), schedule).kernels
    return kernel


def test_a_cpu_devices_packed_gemv_does_not_grow_with_k():
    """The staged GEMV's loop over K's trips has constant bounds (a printer unrolls it);
    a CPU device's walks K in loops from each lane's start, the same kernel at every K."""
    cpu = device_schedule({DOT4}, 32 * 1024, True)
    sizes = set()
    for k in (4096, 14336):
        kernel = _packed_gemv(k, cpu)
        loops = [s for s in kernel.statements() if isinstance(s, For)]
        assert loops and not any(isinstance(s.start, Const) for s in loops)
        sizes.add(len(list(kernel.statements())))
        gpu = _packed_gemv(k, None)
        assert any(isinstance(s.start, Const) and s.stop.value == k
                   for s in gpu.statements() if isinstance(s, For))
    assert len(sizes) == 1


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
