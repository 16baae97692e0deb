"""On a GPU: every case's kernels against the oracle, graph replay, memory round trips.
Skipped with the probe's reason where there is no CUDA device."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from poot.codegen.cases import mismatch
from poot.oracle import apply
from poot_cuda.testing import cases, compiled

pytestmark = pytest.mark.gpu
CASES = cases()


@pytest.fixture(scope="module")
def ctx(gpu):
    from poot_cuda.driver import Context
    from poot_cuda.kernels import ModuleCache

    c = Context(gpu.index)
    return c, ModuleCache(c)


def _run(ctx, case, graph=False, repeats=1):
    from poot_cuda.harness import LoweringRun

    context, modules = ctx
    arrays = case.make(np.random.default_rng(zlib.crc32(case.id.encode())))
    out = case.out()
    run = LoweringRun(context, modules, compiled(case.id), arrays, out)
    try:
        results = []
        for _ in range(repeats):
            run.run(graph=graph)
            results.append(run.result().copy())
    finally:
        run.free()
    args = [np.asarray(x.value, x.dtype.numpy) if a is None else a
            for a, x in zip(arrays, case.ins, strict=True)]
    want = np.ascontiguousarray(apply(case.op, args, case.types(), out)).reshape(out.shape)
    return results, want


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_on_gpu_matches_oracle(ctx, case):
    (got,), want = _run(ctx, case)
    problem = mismatch(got, want, case.tol)
    assert problem is None, f"{case.id}: {problem}"


@pytest.mark.parametrize("case_id", ["attention-4x2-t1-s300-d64-f32", "fused-row-rmsnorm",
                                     "dense-(1,)-20x64-bf16"])
def test_graph_replay_is_identical_to_itself_and_correct(ctx, case_id):
    case = next(c for c in CASES if c.id == case_id)
    results, want = _run(ctx, case, graph=True, repeats=3)
    assert all(np.array_equal(results[0].view(np.uint8), r.view(np.uint8)) for r in results)
    assert mismatch(results[0], want, case.tol) is None


def test_runtime_memory_round_trip(gpu):
    from poot.backend import Device
    from poot_cuda.runtime import CudaRuntime

    rt = CudaRuntime(Device("cuda", gpu.index, gpu.name))
    buf = rt.alloc(4096, "t")
    data = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8)
    rt.write(buf, 256, data)
    assert np.array_equal(rt.read(buf, 256, 1000), data)
    assert buf.ptr % 256 == 0
    rt.close()
