"""GEMV over packed weights decoded a run at a time (WeightFormat.decode_run): each
format's runs against its numpy decode, and the lowered kernels, run by the numpy kernel
interpreter, against the oracle: several trips, a partial last trip, K past the last whole
run where the format allows it, M = 1..4 rows, per-row (expert) weights."""
from __future__ import annotations

import sys
import zlib

import numpy as np
import poot_quant
import pytest
from poot.codegen.cases import mismatch
from poot.codegen.expr import Load, Var, evaluate, walk
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.codegen.program import Assign, For, Let, Store
from poot.dtypes import DType
from poot.formats import PackedWeight, decode_run, run_length, words_of
from poot.ir.ops import IndexedPackedContraction, PackedContraction
from poot.ir.types import TensorType
from poot.oracle import apply

F32 = DType.F32

# (format, [N, K], attrs): K spans several trips of runs, and ends past the last whole run
# where the format allows it (gptq/awq); Q4_0 with an odd block count realigns its blocks
RUN_CASES = [
    ("gguf:Q4_0", (3, 32 * 70), {}), ("gguf:Q4_0", (3, 32 * 5), {}),
    ("gguf:Q4_1", (3, 32 * 40), {}), ("gguf:Q8_0", (3, 32 * 66), {}),
    ("gguf:Q4_K", (3, 256 * 9), {}), ("gguf:Q6_K", (3, 256 * 3), {}),
    ("gguf:Q6_K", (3, 256 * 18), {}),
    ("gguf:Q5_K", (2, 256 * 2), {}), ("gguf:Q2_K", (2, 256 * 2), {}),
    ("gguf:Q3_K", (2, 256 * 2), {}), ("gguf:Q5_0", (2, 32 * 6), {}),
    ("gguf:Q5_1", (2, 32 * 6), {}), ("gguf:IQ4_NL", (2, 32 * 6), {}),
    ("gguf:MXFP4", (2, 32 * 8), {}),
    ("gptq:int4", (8, 2120), {"group_size": 32}),
    ("gptq:int4", (8, 96), {"group_size": 32, "act_order": True, "version": "v2"}),
    ("gptq:int8", (8, 72), {"group_size": 24, "sym": False}),
    ("awq:int4", (8, 1000), {"group_size": 32}),
]
ROWS = (1, 2, 3, 4)


def weights(fmt, shape, attrs, rng) -> list[np.ndarray]:
    w = rng.standard_normal(shape).astype(np.float32)
    return [np.asarray(s) for s in fmt.quantize(w, **attrs)]


def nonzero(shape, rng) -> np.ndarray:
    """Normal values pushed away from zero (a zero activation would hide a wrong weight)."""
    x = rng.standard_normal(shape)
    return (np.sign(x) * (np.abs(x) + 0.1)).astype(np.float32)


def seeded(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


@pytest.mark.parametrize("name,shape,attrs", RUN_CASES, ids=lambda c: str(c))
def test_runs_match_numpy_decode(name, shape, attrs):
    fmt = poot_quant.get(name)
    rng = seeded(name, shape)
    sources = weights(fmt, shape, attrs, rng)
    want = fmt.dequantize(sources, shape, **attrs)
    run = run_length(fmt, shape, attrs)
    assert run > 1, name
    buffers = {s.role: words_of(x) for s, x in zip(fmt.roles(shape, attrs), sources,
                                                   strict=True)}
    parts = decode_run(fmt, lambda role, i: Load(role, i, DType.U32), Var("n"), Var("k0"),
                       shape, attrs)
    runs = shape[1] // run
    env = {"n": np.arange(shape[0], dtype=np.int32)[:, None],
           "k0": (np.arange(runs, dtype=np.int32) * run)[None, :]}
    got = []
    for p in parts:
        scale, offset = (np.float32(1) if p.scale is None else evaluate(p.scale, env, buffers),
                         np.float32(0) if p.offset is None else evaluate(p.offset, env, buffers))
        got += [np.broadcast_to(scale * (evaluate(v, env, buffers) * np.float32(2.0 ** e))
                                + offset, (shape[0], runs))
                for v, e in zip(p.values, p.exponents or [0] * len(p.values), strict=True)]
    assert len(got) == run
    got = np.stack(got, -1).reshape(shape[0], runs * run)
    np.testing.assert_allclose(got, want[:, :runs * run], rtol=1e-6,
                               atol=1e-6 * float(np.abs(want).max()))


def check_lowering(op, ins, arrays, tol=1e-10):
    out = op.infer(ins)
    want = np.asarray(apply(op, arrays, ins, out)).reshape(out.shape)
    got = run_lowering(lower(op, ins, out), arrays, out)
    problem = mismatch(got, np.ascontiguousarray(want), tol)
    assert problem is None, problem


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("name,shape,attrs", RUN_CASES, ids=lambda c: str(c))
def test_gemv_runs_match_oracle(name, shape, attrs, rows):
    fmt = poot_quant.get(name)
    rng = seeded(name, shape, rows)
    pw = PackedWeight(name, shape, attrs)
    a = TensorType((rows, shape[1]), F32)
    ins = [a, *(s.type for s in pw.sources())]
    check_lowering(PackedContraction(pw), ins,
                   [nonzero(a.shape, rng), *weights(fmt, shape, attrs, rng)])


@pytest.mark.parametrize("rows", (1, 4))
@pytest.mark.parametrize("name", ["gguf:Q4_0", "gguf:Q4_K", "gptq:int4"])
def test_gemv_runs_per_row_experts(name, rows):
    fmt = poot_quant.get(name)
    rng = seeded(name, rows)
    n, k, experts = 8, 512, 3
    pw = PackedWeight(name, (experts * n, k), {"group_size": 64} if "gptq" in name else {})
    x, idx = TensorType((rows, k), F32), TensorType((rows,), DType.I32)
    ins = [x, idx, *(s.type for s in pw.sources())]
    check_lowering(IndexedPackedContraction(pw, experts), ins,
                   [nonzero(x.shape, rng), rng.integers(0, experts, rows).astype(np.int32),
                    *weights(fmt, pw.shape, pw.attr_dict, rng)])


def test_default_run_decodes_element_by_element(monkeypatch):
    """A format that declares a run length but no decode_run gets runs of decode_expr."""
    fp8 = poot_quant.get("fp8:e4m3")

    class Runs:
        name = "test:fp8-runs"

        def __getattr__(self, attr):
            return getattr(fp8, attr)

        def run_length(self, shape, attrs):
            return 16

    fmt = Runs()
    for module in ("poot.formats", "poot.codegen.lower.contraction"):
        real = sys.modules[module].get_format
        monkeypatch.setattr(sys.modules[module], "get_format",
                            lambda n, real=real: fmt if n == fmt.name else real(n))
    rng = seeded("fp8-runs")
    pw = PackedWeight(fmt.name, (5, 100))
    a = TensorType((2, 100), F32)
    check_lowering(PackedContraction(pw), [a, *(s.type for s in pw.sources())],
                   [nonzero(a.shape, rng), *weights(fp8, (5, 100), {}, rng)])


def test_q4_0_gemv_loads_each_word_once():
    """The decode GEMV of the benchmark shape copies the 9 words of each lane's share of
    its group's trip with coalesced loads (load s of lane l: word 32s + l of the trip's
    span), decodes the runs from the shared copy, and reads activations from the shared
    tile (its only global loads of them are the copy)."""
    from poot.codegen.lower.schedule import dot_schedule

    columns = dot_schedule(frozenset()).run_columns
    pw = PackedWeight("gguf:Q4_0", (14336, 4096))
    ins = [TensorType((1, 4096), F32), *(s.type for s in pw.sources())]
    kernel = lower(PackedContraction(pw), ins, PackedContraction(pw).infer(ins)).kernels[0]
    (loop,) = [s for s in kernel.body if isinstance(s, For)]

    def loads(kind, buffer):
        return [n for s in loop.body if isinstance(s, kind) for n in walk(s.value)
                if isinstance(n, Load) and n.buffer == buffer]
    copies = loads(Let, "in1")      # per column of the group
    assert len(copies) == len(loads(Let, "tile_w")) == 9 * columns
    for s, load in enumerate(copies):   # span start + lane + 32 s: consecutive lanes
        lanes = [evaluate(load.index, dict(local_index=lane, lane=lane, ws=0, ws_1=0), {})
                 for lane in (0, 1, 31)]
        assert [int(x) for x in lanes] == [32 * (s % 9), 32 * (s % 9) + 1, 32 * (s % 9) + 31]
    copy = 32 * 64 // kernel.workgroup[0]     # a trip's activations over the workgroup
    assert not loads(Assign, "in0") and not loads(Let, "in0") and len(loads(Store, "in0")) == copy


def test_staged_weights_only_where_words_lie_in_k_order():
    """Staged weight words for GGUF rows of whole words; the old direct loads for rows that
    do not start on a word (Q4_0 with an odd block count) and for K-major GPTQ words."""
    def tiles(name, shape, attrs=None):
        pw = PackedWeight(name, shape, attrs or {})
        ins = [TensorType((1, shape[1]), F32), *(s.type for s in pw.sources())]
        kernel = lower(PackedContraction(pw), ins, PackedContraction(pw).infer(ins)).kernels[0]
        return {a.name for a in kernel.shared}
    for name in ("gguf:Q4_0", "gguf:Q4_1", "gguf:Q8_0", "gguf:Q4_K", "gguf:Q6_K"):
        assert tiles(name, (16, 256 * 18)) == {"tile_a", "tile_w"}, name
    assert tiles("gguf:Q4_0", (16, 32 * 5)) == {"tile_a"}
    assert tiles("gptq:int4", (16, 2048), {"group_size": 32}) == {"tile_a"}
