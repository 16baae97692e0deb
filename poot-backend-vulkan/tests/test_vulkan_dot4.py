"""Integer dot products (target.DOT4) chosen from the device's shaderIntegerDotProduct: the
fast graph's contraction of int8 rows is declared and printed as SPIR-V SUDot where the
device has it, and a device without it keeps today's path (the table refuses the
composite, so `fast` keeps the rounded rows' PackedContraction). The kernels' values are
the conformance suite's (Q8PackedContraction cases, run on this device)."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from poot.codegen.lower.q8 import q8_program
from poot.codegen.lower.schedule import DotSchedule
from poot.codegen.target import DOT4
from poot.compiler import Policy
from poot.compiler.pipeline import run_pass
from poot.dtypes import DType
from poot.formats import PackedWeight
from poot.ir import Builder
from poot.ir import ops as O
from poot.ir.ops.quantize import q8_round
from poot.ir.types import TensorType
from poot_vulkan.backend import VulkanBackend
from poot_vulkan.compiler import compile_glsl
from poot_vulkan.device import INTEGER_DOT_EXTENSION
from poot_vulkan.glsl import SUDOT, GlslPrinter

FEATURE = "shaderIntegerDotProduct"


class _Backend(VulkanBackend):
    """The vulkan backend over given device facts (its own tables and lowerings)."""

    def __init__(self, facts):
        self.facts = facts

    def _device(self, device):
        return SimpleNamespace(facts=self.facts)


@pytest.fixture(scope="module")
def targets(vulkan_device):
    facts = vulkan_device.facts
    if not facts.has(FEATURE):
        pytest.skip(f"{facts.name} lacks {FEATURE}")
    without = dataclasses.replace(facts, features=facts.features - {FEATURE})
    device = VulkanBackend().probe()[0]
    return _Backend(facts), _Backend(without), device


def _q8_program(backend, device, fmt="gguf:Q4_0", rows=1):
    w = PackedWeight(fmt, (8, 256))
    types = [TensorType((rows, 256), DType.F32)] + [s.type for s in w.sources()]
    out = TensorType((rows, 8), DType.F32)
    return q8_program(O.Q8PackedContraction(w), types, out, backend.features(device),
                      backend.schedule(device))


def test_the_probe_reads_the_feature_where_the_extension_is(vulkan_device):
    facts = vulkan_device.facts
    assert facts.has(FEATURE) <= (INTEGER_DOT_EXTENSION in facts.extensions)


def test_dot4_and_the_composite_follow_the_feature(targets):
    with_dot, without, device = targets
    assert with_dot.features(device) == {DOT4} and without.features(device) == frozenset()
    formats = frozenset({"gguf:Q4_0", "gguf:Q8_0"})
    declared, refused = (b.capability_table(device, formats) for b in (with_dot, without))
    assert declared.lowers("Q8PackedContraction") == formats and "SUDot" in declared.notes["dot4"]
    assert not refused.lowers("Q8PackedContraction") and "dot4" not in refused.notes
    # the integer GEMV's arrays stay within the device's shared memory
    limit = with_dot.facts.limit("maxComputeSharedMemorySize")
    assert (with_dot.schedule(device) or SimpleNamespace(int_shared_bytes=0)) \
        .int_shared_bytes < limit
    assert (without.schedule(device) or DotSchedule()).int_shared_bytes == \
        DotSchedule.int_shared_bytes


def test_the_integer_gemv_prints_sudot_and_compiles(targets):
    with_dot, without, device = targets
    (kernel,) = _q8_program(with_dot, device).kernels     # the rows quantized inside it
    src = GlslPrinter(with_dot.facts).source(kernel)
    assert src.count(f"{SUDOT}(") == 1 + 8 * 2              # declared; 8 quads x 2 groups
    assert compile_glsl(src, kernel.name)
    # a printer without the instruction prints the same program's Dot4 as multiply-adds
    plain = GlslPrinter(without.facts).source(kernel)
    assert SUDOT not in plain and "GL_EXT_spirv_intrinsics" not in plain
    assert compile_glsl(plain, kernel.name)


def test_without_the_feature_fast_keeps_the_rounded_rows(targets):
    with_dot, without, device = targets
    w = PackedWeight("gguf:Q4_0", (8, 256))
    b = Builder("q8_rows", compiler=True)
    x = b.const(TensorType((1, 256), DType.F32), "x")
    srcs = [b.const(s.type, s.role) for s in w.sources()]
    b.result(b.eqn(O.PackedContraction(w), q8_round(b, x), *srcs))
    graph = b.finish()
    policy = Policy(precision="fast")
    formed, _ = run_pass(graph, "q8_contraction", (with_dot, device), policy=policy)
    kept, _ = run_pass(graph, "q8_contraction", (without, device), policy=policy)
    assert any(isinstance(e.op, O.Q8PackedContraction) for e in formed.eqns())
    assert not any(isinstance(e.op, O.Q8PackedContraction) for e in kept.eqns())
    assert any(isinstance(e.op, O.PackedContraction) for e in kept.eqns())


VALIDATED = r"""
import numpy as np
from poot.codegen.target import DOT4
from poot.conformance.cases import precision_cases
from poot.conformance.compare import mismatch
from poot.conformance.inputs import draw_all
from poot.oracle import evaluate
from poot.plan import plan
from poot.plugin import get_backend
from poot.runtime.executor import Executor

backend = get_backend("vulkan")
target = (backend, backend.probe()[0])
assert DOT4 in backend.features(target[1])
case = next(c for c in precision_cases() if c.id == "Q8PackedContraction-gguf:Q4_1-1x256")
inputs = draw_all(np.random.default_rng(0), case.args, case.fixed)
(want,) = evaluate(case.graph, inputs, outputs="result")
ex = Executor(plan(case.graph, target), {})
got = ex.step({f"x{i}": a for i, a in enumerate(inputs)}).result
assert mismatch(want, got, case.exact, case.tol) is None
"""


def test_the_sudot_gemv_runs_clean_under_the_validation_layer(targets, run_validated):
    """The shader's SPIR-V capabilities are those the logical device enabled (the layer
    checks each module against the device's extensions and features)."""
    run_validated(VALIDATED)
