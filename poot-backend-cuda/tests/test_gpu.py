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


def _run(ctx, case, graph=False, repeats=1, program=None):
    from poot_cuda.harness import LoweringRun

    context, modules = ctx
    arrays = case.make(np.random.default_rng(zlib.crc32(case.id.encode())))
    out = case.out()
    run = LoweringRun(context, modules, program or compiled(case.id), arrays, out)
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
    from poot.contract import Device
    from poot_cuda.runtime import CudaRuntime

    rt = CudaRuntime(Device("cuda", gpu.index, gpu.name))
    buf = rt.alloc(4096, "t")
    data = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8)
    rt.write(buf, 256, data)
    assert np.array_equal(rt.read(buf, 256, 1000), data)
    assert buf.ptr % 256 == 0
    rt.close()


def _packed(normed: bool, shape: tuple[int, int], fmt: str = "gguf:Q4_0"):
    """A decode GEMV case past the catalog's small K (K in trips of staged tiles)."""
    from poot.codegen.cases import INT_GEMV_TOL, Case, normal
    from poot.dtypes import DType
    from poot.formats import PackedWeight
    from poot.ir.ops import NormedPackedContraction, PackedContraction
    from poot.ir.types import TensorType

    pw = PackedWeight(fmt, shape)
    fmt, src = pw.get_format(), tuple(s.type for s in pw.sources())
    a, g = TensorType((1, shape[1]), DType.F32), TensorType((shape[1],), DType.F32)
    ins = (a, g, *src) if normed else (a, *src)

    def make(rng):
        w = rng.standard_normal(shape).astype(np.float32)
        acts = [normal(a)(rng)] + ([normal(g)(rng)] if normed else [])
        return acts + [np.asarray(x) for x in fmt.quantize(w)]
    op = NormedPackedContraction(pw, 1e-5) if normed else PackedContraction(pw)
    return Case(f"{op.name}-{pw.format}-{shape[0]}x{shape[1]}", op, ins, make, INT_GEMV_TOL)


#: the contraction schedules' switches set apart from the target's default, each on the GPU:
#: (DotSchedule field, its value, case)
VARIANTS = [("quads", False, _packed(False, (32, 4096), "gguf:Q4_K")),
            ("quads", False, _packed(False, (64, 14336), "gguf:Q4_K")),   # K split
            ("norm_prologue", False, _packed(True, (32, 2048))),
            ("early_loads", False, _packed(False, (32, 2048))),
            ("early_loads", False, "dense-(1,)-12x2088-bf16"),
            ("pairs", False, "dense-(1,)-12x2088-bf16")]


@pytest.mark.parametrize("name, value, case", VARIANTS,
                         ids=[f"{v[0]}={v[1]}-{v[2] if isinstance(v[2], str) else v[2].id}"
                              for v in VARIANTS])
def test_schedule_variants_on_gpu_match_oracle(ctx, name, value, case):
    from dataclasses import replace

    from poot.codegen.lower import lower
    from poot.codegen.lower.schedule import dot_schedule
    from poot_cuda.capability import kernel_features, parse_arch
    from poot_cuda.kernels import compile_program
    from poot_cuda.printer import CudaPrinter
    from poot_cuda.testing import ARCH

    features = kernel_features(*parse_arch(ARCH), ARCH)
    case = next(c for c in CASES if c.id == case) if isinstance(case, str) else case
    schedule = replace(dot_schedule(features), **{name: value})
    lowering = lower(case.op, case.ins, case.out(), features, schedule)
    default = lower(case.op, case.ins, case.out(), features)
    assert [repr(k.body) for k in lowering.kernels] != [repr(k.body) for k in default.kernels]
    (got,), want = _run(ctx, case, program=compile_program(lowering, CudaPrinter(ARCH)))
    assert mismatch(got, want, case.tol) is None


def _decode_attention(s: int, live: int):
    """One decode row per q head (8 of them, 2 KV heads, bf16 cache [.., S, 128]) with
    `live` keys unmasked: the 8B bench's head dim."""
    from poot.codegen.cases import Case, normal
    from poot.dtypes import DType
    from poot.ir.ops import Attention
    from poot.ir.types import TensorType

    q, kv = TensorType((1, 8, 1, 128), DType.BF16), TensorType((1, 2, s, 128), DType.BF16)
    m = TensorType((1, 1, 1, s), DType.BF16)

    def make(rng):
        mask = np.where(np.arange(s) < live, 0.0, -np.inf).astype(DType.BF16.numpy)
        return [normal(q)(rng), normal(kv)(rng), normal(kv)(rng), mask.reshape(m.shape)]
    return Case(f"decode-attention-{s}-{live}", Attention(128 ** -0.5), (q, kv, kv, m), make,
                1e-4)


@pytest.mark.parametrize("warps, trips", [(4, 1), (8, 8), (16, 4)])
@pytest.mark.parametrize("s, live", [(1024, 101), (1024, 1024), (2048, 1999)])
def test_decode_attention_variants_on_gpu_match_oracle(ctx, monkeypatch, warps, trips, s,
                                                       live):
    """Decode attention's workgroup sizes (attention.DECODE_WARPS, DECODE_TRIPS): one
    kernel while a row's keys fit one workgroup's trips, split and merged past it."""
    from poot.codegen.lower import attention, lower
    from poot_cuda.capability import kernel_features, parse_arch
    from poot_cuda.kernels import compile_program
    from poot_cuda.printer import CudaPrinter
    from poot_cuda.testing import ARCH

    monkeypatch.setattr(attention, "DECODE_WARPS", warps)
    monkeypatch.setattr(attention, "DECODE_TRIPS", trips)
    case = _decode_attention(s, live)
    lowering = lower(case.op, case.ins, case.out(), kernel_features(*parse_arch(ARCH), ARCH))
    assert len(lowering.kernels) == (1 if s <= warps * 16 * trips else 2)
    (got,), want = _run(ctx, case, program=compile_program(lowering, CudaPrinter(ARCH)))
    assert mismatch(got, want, case.tol) is None
