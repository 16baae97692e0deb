"""prologue: a decode step's pointwise region read only by a contraction as its
activation (the SwiGLU of the stacked gate|up halves, read by down) goes into it
(ContractionPrologue); the GEMV computes the region per element as it reads it, in the
f32, integer (one kernel and K split) and 16-bit schedules, against the oracle."""
from __future__ import annotations

from collections import Counter

import ml_dtypes
import numpy as np
import poot
import pytest
from poot.codegen.cases import silu_mul
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.codegen.target import COPY_ASYNC, DOT2
from poot.compiler import LimitedBackend, Policy
from poot.compiler.validate import validate
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.formats import PackedWeight
from poot.ir import region
from poot.ir.ops import ContractionPrologue, DenseContraction, PackedContraction
from poot.ir.types import TensorType as T
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.oracle import apply
from poot.plugin import get_backend


def compiled_step(tokens=1, target="reference", fmt="gguf:Q4_0", **kw):
    config = tiny_config(layers=2)
    weights = random_weights(config, seed=4, dtype="f32", packed_format=fmt)
    step = build_decoder(config, weights, tokens=tokens)
    return step, weights, poot.compile(step.graph, target, **kw)


def heads(compiled) -> Counter:
    return Counter(e.op.head.name for e in compiled.graph.eqns()
                   if e.op.name in ("ContractionEpilogue", "ContractionPrologue"))


@pytest.mark.parametrize("fmt", ["gguf:Q4_0", None])
def test_a_decode_steps_swiglu_goes_into_the_down_projection(fmt):
    step, weights, compiled = compiled_step(fmt=fmt)
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    assert heads(compiled)["ContractionPrologue"] == 2      # down + residual, each layer
    assert ops["Fused"] == 1                                # the mask's only
    validate(step.graph, compiled.graph, seed=2, trials=2, given=const_inputs(step, weights))


def test_wide_steps_off_switches_and_undeclaring_targets_keep_the_region():
    _, _, wide = compiled_step(tokens=8)
    assert "ContractionPrologue" not in heads(wide)
    assert "8 rows" in wide.explain() or "stays a kernel" in wide.explain()
    _, _, off = compiled_step(policy=Policy(disable={"prologue"}))
    assert "ContractionPrologue" not in heads(off)
    ref = get_backend("reference")
    _, _, lacking = compiled_step(target=(LimitedBackend(ref, {"ContractionPrologue"}), None))
    assert "ContractionPrologue" not in heads(lacking)
    assert "target refuses" in lacking.explain()


def _check(head, weight_types, weights, rows, k, features=frozenset()):
    a = T((rows, k), DType.F32)
    op = ContractionPrologue(head, 1 + len(weights), region([a, a], silu_mul))
    ins = [a, *weight_types, a]
    out = op.infer(ins)
    rng = np.random.default_rng(rows + k)
    g, u = (rng.standard_normal((rows, k)).astype(np.float32) for _ in range(2))
    args = [g, *weights, u]
    prog = lower(op, ins, out, features)
    got = run_lowering(prog, args, out)
    want = np.asarray(apply(op, args, ins, out))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2
    return prog


@pytest.mark.parametrize("shape, rows, features, kernels", [
    ((9, 512), 1, frozenset(), 1),                       # the f32 runs GEMV
    ((32, 2048), 2, frozenset({DOT2, COPY_ASYNC}), 1),   # integer GEMV, one kernel
    ((16, 4096), 1, frozenset({DOT2}), 2),               # K split into parts
])
def test_packed_gemvs_compute_the_prologue(shape, rows, features, kernels):
    pw = PackedWeight("gguf:Q4_0", shape)
    src = [np.asarray(s) for s in pw.get_format().quantize(
        np.random.default_rng(1).standard_normal(shape).astype(np.float32))]
    prog = _check(PackedContraction(pw), [s.type for s in pw.sources()], src, rows,
                  shape[1], features)
    assert len(prog.kernels) == kernels


def test_dense_gemv_computes_the_prologue_and_wide_rows_are_refused():
    w = (np.random.default_rng(2).standard_normal((19, 256)) * 0.1).astype(ml_dtypes.bfloat16)
    _check(DenseContraction(), [T((19, 256), DType.BF16)], [w], 2, 256)
    with pytest.raises(UnsupportedOp, match="at most 4"):
        _check(DenseContraction(), [T((19, 256), DType.BF16)], [w], 8, 256)
