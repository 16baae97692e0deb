"""The integer GEMV (int16 activations x weight bytes through Dot2, lower.int_gemv) on a
target that declares DOT2, run by the numpy kernel interpreter against the oracle: each
format that gives integer runs, several trips of staged weights and direct loads, 1..4
rows; formats without integer runs keep the f32 schedule; Dot2's two spellings agree."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import poot_quant  # noqa: F401 - registers the formats
import pytest
from poot.codegen.expr import Dot2, Var, evaluate, lower_dot2
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.codegen.lower.schedule import dot_schedule
from poot.codegen.target import DOT2, WIDE_LOADS
from poot.dtypes import DType
from poot.formats import PackedWeight
from poot.ir.ops import PackedContraction
from poot.ir.types import TensorType

CONTRACTION_TOL = (1024 * 2.0 ** -24) ** 2     # the conformance suite's, for contractions

CASES = [("gguf:Q4_0", (9, 2048), 2), ("gguf:Q4_0", (5, 32 * 70), 1),
         ("gguf:Q4_1", (3, 576), 1), ("gguf:Q8_0", (3, 32 * 66), 3),
         ("gguf:Q4_K", (3, 2048), 1), ("gguf:Q4_1", (4, 2048), 4),
         # K split into parts (two kernels): 2 staged parts, 7 parts, 2 direct parts
         ("gguf:Q4_0", (16, 4096), 1), ("gguf:Q4_K", (8, 14336), 1), ("gguf:Q4_1", (8, 4352), 3)]


def _lowered(name, shape, rows, features=frozenset({DOT2}), schedule=None):
    pw = PackedWeight(name, shape)
    op = PackedContraction(pw)
    ins = [TensorType((rows, shape[1]), DType.F32)] + [s.type for s in pw.sources()]
    out = op.infer(ins)
    return pw, op, ins, out, lower(op, ins, out, features, schedule)


def _statements(prog, kind) -> int:
    return sum(isinstance(s, kind) for k in prog.kernels for s in k.statements())


def _uses_dot2(prog) -> bool:
    from poot.codegen.expr import walk
    from poot.codegen.program import Assign, Let

    return any(isinstance(n, Dot2) for s in prog.kernels[0].statements()
               if isinstance(s, (Let, Assign)) for n in walk(s.value))


@pytest.mark.parametrize("name, shape, rows", CASES, ids=[f"{c[0]}-{c[1]}-m{c[2]}" for c in CASES])
def test_integer_gemv_matches_oracle(name, shape, rows):
    lowered = _lowered(name, shape, rows)
    assert _uses_dot2(lowered[4])
    nmse = _nmse(*lowered, rows)
    assert nmse < CONTRACTION_TOL, nmse


def _nmse(pw, op, ins, out, prog, rows: int) -> float:
    """`prog` run by the interpreter on a random weight and rows, against the oracle."""
    from poot.oracle import apply

    shape = pw.shape
    rng = np.random.default_rng(shape[1] + rows)
    src = [np.asarray(s) for s in pw.get_format().quantize(
        rng.standard_normal(shape).astype(np.float32))]
    x = rng.standard_normal((rows, shape[1])).astype(np.float32)
    got = run_lowering(prog, [x, *src], out)
    want = np.asarray(apply(op, [x, *src], ins, out))
    return float(np.sum((got - want) ** 2) / np.sum(want ** 2))


def test_formats_without_integer_runs_keep_the_f32_schedule():
    assert not _uses_dot2(_lowered("gguf:Q6_K", (3, 512), 1)[4])
    short = replace(dot_schedule(frozenset({DOT2})), int_max_k=1024)
    assert not _uses_dot2(_lowered("gguf:Q4_0", (3, 1024), 1, schedule=short)[4])
    assert _uses_dot2(_lowered("gguf:Q4_0", (3, 960), 1, schedule=short)[4])


def test_dot2_spellings_agree():
    rng = np.random.default_rng(0)
    a = rng.integers(-2**31, 2**31, 64, dtype=np.int64).astype(np.int32)
    b = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    c = rng.integers(-2**20, 2**20, 64).astype(np.int32)
    env = {"a": a, "b": b, "c": c}
    for high in (False, True):
        e = Dot2(Var("a", DType.I32), Var("b", DType.U32), Var("c", DType.I32), high)
        lo16 = (a.astype(np.int64) << 48 >> 48)
        hi16 = a.astype(np.int64) >> 16
        bytes_ = [(b.astype(np.int64) >> (8 * i)) & 255 for i in range(4)]
        want = c + lo16 * bytes_[2 * high] + hi16 * bytes_[2 * high + 1]
        np.testing.assert_array_equal(evaluate(e, env, {}), want.astype(np.int32))
        np.testing.assert_array_equal(evaluate(lower_dot2(e), env, {}), want.astype(np.int32))


def test_printers_without_dot2_get_plain_multiply_adds():
    """Printer.source rewrites Dot2 away for dialects that do not print it (WGSL, GLSL,
    HIP): the rewritten kernel has no Dot2 and computes the same bits."""
    from poot.codegen.expr import walk
    from poot.codegen.printer import without_dot2
    from poot.codegen.program import KernelProgram

    pw, op, ins, out, prog = _lowered("gguf:Q4_0", (4, 1024), 1)
    plain = KernelProgram(tuple(without_dot2(k) for k in prog.kernels))
    for k in plain.kernels:
        k.validate()
    assert not _uses_dot2(plain)
    assert any(isinstance(n, Dot2) for s in prog.kernels[0].statements()
               for v in vars(s).values() if hasattr(v, "dtype") for n in walk(v))
    rng = np.random.default_rng(3)
    src = [np.asarray(s) for s in pw.get_format().quantize(
        rng.standard_normal((4, 1024)).astype(np.float32))]
    x = rng.standard_normal((1, 1024)).astype(np.float32)
    np.testing.assert_array_equal(run_lowering(plain, [x, *src], out),
                                  run_lowering(prog, [x, *src], out))


SPLITS = [((4096, 14336), 7), ((1024, 4096), 2), ((2048, 8192), 2),    # 8B down, K/V; 1B down
          ((4096, 4096), 1), ((14336, 4096), 1), ((128256, 4096), 1),  # 8B Q/O, gate/up, head
          ((192, 576), 1), ((576, 1536), 1)]                           # SmolLM2: latency-bound


@pytest.mark.parametrize("shape, parts", SPLITS, ids=[f"{s[0]}x{s[1]}" for s, _ in SPLITS])
def test_which_shapes_split_k(shape, parts):
    """K splits (two kernels) where a workgroup would quantize more than INT_COLUMN_K
    activations per column or the grid would be small, never below INT_PART_K a part."""
    prog = _lowered("gguf:Q4_0", shape, 1)[4]
    assert len(prog.kernels) == (1 if parts == 1 else 2)
    if parts > 1:
        assert prog.scratch[0].count == parts * shape[0]
        assert _uses_dot2(prog)


def test_split_k_epilogue_matches_oracle():
    """A down projection's shape in small: the parts' sums meet the residual add once."""
    from poot.ir.builder import region
    from poot.ir.ops import Binary, BinaryOp, ContractionEpilogue
    from poot.oracle import apply

    n, k = 16, 4096
    pw = PackedWeight("gguf:Q4_0", (n, k))
    res = TensorType((1, n), DType.F32)
    body = region([res, res], lambda b, h, r: b.eqn(Binary(BinaryOp.Add), h, r))
    op = ContractionEpilogue(PackedContraction(pw), 1 + len(pw.sources()), body)
    ins = [TensorType((1, k), DType.F32)] + [s.type for s in pw.sources()] + [res]
    out = op.infer(ins)
    prog = lower(op, ins, out, frozenset({DOT2}))
    assert len(prog.kernels) == 2
    rng = np.random.default_rng(7)
    src = [np.asarray(s) for s in pw.get_format().quantize(
        rng.standard_normal((n, k)).astype(np.float32))]
    x, r = (rng.standard_normal(t.shape).astype(np.float32) for t in (ins[0], res))
    got = run_lowering(prog, [x, *src, r], out)
    want = np.asarray(apply(op, [x, *src, r], ins, out))
    nmse = float(np.sum((got - want) ** 2) / np.sum(want ** 2))
    assert nmse < CONTRACTION_TOL, nmse


#: (format, weight shape, rows, kernels with the norm inside where it can, kernels apart)
NORMED = [("gguf:Q4_0", (9, 2048), 1, 1, 2), ("gguf:Q4_K", (3, 2048), 1, 1, 2),
          ("gguf:Q4_1", (3, 576), 2, 1, 2), ("gguf:Q8_0", (3, 32 * 66), 4, 1, 2),
          # K split into parts: the norm runs apart, then both kernels of the split
          ("gguf:Q4_0", (16, 4096), 1, 3, 3)]


@pytest.mark.parametrize("inside", [True, False], ids=["inside", "apart"])
@pytest.mark.parametrize("name, shape, rows, kernels, apart", NORMED,
                         ids=[f"{c[0]}-{c[1]}-m{c[2]}" for c in NORMED])
def test_normed_gemv_matches_oracle(name, shape, rows, kernels, apart, inside):
    """rms_norm(x, g) into the integer GEMV: one kernel that sums the rows' squares while
    it quantizes x * g (DotSchedule.norm_prologue), else a norm kernel first."""
    from poot.ir.ops import NormedPackedContraction
    from poot.oracle import apply

    features = frozenset({DOT2})
    schedule = replace(dot_schedule(features), norm_prologue=inside)
    pw = PackedWeight(name, shape)
    op = NormedPackedContraction(pw, 1e-5)
    ins = [TensorType((rows, shape[1]), DType.F32), TensorType((shape[1],), DType.F32),
           *(s.type for s in pw.sources())]
    out = op.infer(ins)
    prog = lower(op, ins, out, features, schedule)
    assert len(prog.kernels) == (kernels if inside else apart)
    rng = np.random.default_rng(shape[1] + rows)
    src = [np.asarray(s) for s in
           pw.get_format().quantize(rng.standard_normal(shape).astype(np.float32))]
    x = (4 * rng.standard_normal((rows, shape[1]))).astype(np.float32)
    g = rng.standard_normal(shape[1]).astype(np.float32)
    got = run_lowering(prog, [x, g, *src], out)
    want = np.asarray(apply(op, [x, g, *src], ins, out))
    nmse = float(np.sum((got - want) ** 2) / np.sum(want ** 2))
    assert nmse < CONTRACTION_TOL, nmse


@pytest.mark.parametrize("shape, rows, kernels", [
    ((32, 2048), 1, 1),      # the integer GEMV joins each pair in its workgroup
    ((64, 14336), 1, 3),     # K split into parts: their two kernels, then the joining one
    ((32, 2048), 6, 1),      # the rows GEMV joins each pair itself
    ((32, 2048), 33, 2),     # more rows than the rows GEMV: the contraction, then the join
])
def test_gated_contraction_joins_its_halves(shape, rows, kernels):
    """GatedContraction over an integer-GEMV head: silu(a) * b of the result's halves,
    in one kernel where a GEMV (or the rows GEMV) applies, after the contraction's kernels
    elsewhere."""
    from poot.codegen.cases import GATED_TOL, silu_mul
    from poot.ir import region
    from poot.ir.ops import GatedContraction

    pw = PackedWeight("gguf:Q4_0", shape)
    half = TensorType((rows, shape[0] // 2), DType.F32)
    op = GatedContraction(PackedContraction(pw), 1 + len(pw.sources()),
                          region([half, half], silu_mul))
    ins = [TensorType((rows, shape[1]), DType.F32)] + [s.type for s in pw.sources()]
    out = op.infer(ins)
    prog = lower(op, ins, out, frozenset({DOT2}))
    assert len(prog.kernels) == kernels
    assert _nmse(pw, op, ins, out, prog, rows) < GATED_TOL


@pytest.mark.parametrize("quads", [True, False], ids=["quads", "words"])
@pytest.mark.parametrize("shape, rows", [((24, 4096), 1), ((8, 14336), 1), ((16, 2048), 3)])
def test_quad_reads_of_the_tile_match_oracle(shape, rows, quads):
    """DotSchedule.quads: Q4_K's staged tile unpadded, read four words a load (the
    interpreter faults on a misaligned one); without it, padded and read a word a load."""
    from poot.codegen.program import LoadWide

    features = frozenset({DOT2, WIDE_LOADS})
    schedule = replace(dot_schedule(features), quads=quads)
    lowered = _lowered("gguf:Q4_K", shape, rows, features, schedule)
    assert (_statements(lowered[4], LoadWide) > 0) == quads
    assert _nmse(*lowered, rows) < CONTRACTION_TOL
