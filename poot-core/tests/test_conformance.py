"""The conformance suite's parts: inputs, comparison, case coverage, guards, reports, CLI."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poot.capability import every_op_key
from poot.conformance.cases import all_cases
from poot.conformance.compare import mismatch, nmse
from poot.conformance.inputs import Arg, draw, draw_all, nan_payload, special_values
from poot.conformance.runner import GUARD, guarded, occupied, run_case
from poot.conformance.target import resolve
from poot.dtypes import DType
from poot.ir.types import TensorType

pytest_plugins = ["pytester"]


# -- inputs ----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(list(DType)), st.sampled_from(["any", "positive", "away", "small",
                                                      "special", "int"]),
       st.integers(0, 2**32 - 1))
def test_inputs_are_zero_only_where_planted(dtype, domain, seed):
    a = draw(np.random.default_rng(seed), Arg(TensorType((5, 7), dtype), domain))
    assert a.dtype == dtype.numpy and a.shape == (5, 7)
    zeros = int(np.sum(a.astype(np.float64) == 0))
    assert zeros == (2 if domain == "special" and dtype in (DType.F32, DType.F16, DType.BF16)
                     else 0)
    if domain in ("positive",) and dtype not in (DType.F8E8M0,) and dtype.is_float:
        assert np.all(a.astype(np.float32) > 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_indices_in_range_and_scatter_slots(seed):
    rng = np.random.default_rng(seed)
    idx = draw(rng, Arg(TensorType((40,), DType.I32), ("index", 7)))
    assert idx.min() >= 0 and idx.max() < 7
    slots = draw(rng, Arg(TensorType((5,), DType.I32), ("slots", 11)))
    assert slots[1] == -1 and slots[-1] == slots[0] and slots.max() < 11
    words = draw(rng, Arg(TensorType((64,), DType.U32), "words"))
    assert words.dtype == np.uint32 and words.max() > 2**16  # random 32-bit patterns


def test_inputs_depend_on_the_seed_and_case_only():
    t = resolve("reference", seed=5)
    c = next(c for c in all_cases() if c.id.startswith("MatMul-f32"))
    a = draw_all(t.rng(c.id), c.args)
    b = draw_all(t.rng(c.id), c.args)
    other = draw_all(resolve("reference", seed=6).rng(c.id), c.args)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], other[0])


# -- comparison ------------------------------------------------------------------------------
def test_nmse_and_thresholds():
    a = np.array([1.0, 2.0, -3.0], np.float32)
    assert nmse(a, a) == 0.0
    assert nmse(a, a * 1.01) == pytest.approx(1e-4, rel=1e-3)
    assert mismatch(a, a * (1 + 1e-8), False, 1e-12) is None
    assert "NMSE" in mismatch(a, a * 1.01, False, 1e-6)


def test_nan_and_inf_rules():
    a = np.array([1.0, np.inf, -np.inf, 2.0], np.float32)
    ok = a.copy()
    assert mismatch(a, ok, False, 1e-6) is None
    nan = ok.copy()
    nan[0] = np.nan
    assert "NaN where the oracle has a number" in mismatch(a, nan, False, 1.0)
    flipped = ok.copy()
    flipped[1] = -np.inf
    assert "Inf does not match" in mismatch(a, flipped, False, 1.0)
    finite = ok.copy()
    finite[2] = -1e30
    assert "Inf does not match" in mismatch(a, finite, False, 1.0)
    oracle_nan = np.array([np.nan, 1.0], np.float32)
    assert "a number where the oracle has NaN" in mismatch(oracle_nan, np.ones(2, np.float32),
                                                            False, 1.0)


def test_exact_compares_bits_including_nan_payloads():
    p = nan_payload(DType.F32)
    assert mismatch(p, p.copy(), True, 0.0) is None
    other = np.array([np.nan, np.nan], np.float32)
    assert "not bit-exact" in mismatch(p, other, True, 0.0)
    assert "not bit-exact" in mismatch(np.array([0.0], np.float32),
                                       np.array([-0.0], np.float32), True, 0.0)
    assert "result is" in mismatch(np.zeros(2, np.int32), np.zeros(3, np.int32), True, 0.0)


# -- cases -----------------------------------------------------------------------------------
def test_cases_cover_every_op_key_and_every_dtype():
    cases = all_cases()
    assert {c.key for c in cases} == set(every_op_key())
    assert {c.dtype for c in cases if c.key == "Binary.Add"} == {str(d) for d in DType}
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))


def test_cases_spread_shapes_and_compare_exactly_where_the_spec_says():
    by_id = {c.id: c for c in all_cases()}
    assert "Binary.Add-f32-1_1" in by_id and "Binary.Add-f32-5x1x33_4x33" in by_id
    assert "Reduce.Sum-f32-6x7x9-axis1" in by_id and "Unary.Exp-f16-3x257" in by_id
    for c in by_id.values():
        if c.key.split(".")[0] in ("Select", "Gather", "ScatterUpdate", "ArgTopK",
                                   "DynamicUpdateSlice") or c.key in ("Binary.Xor",
                                                                       "Unary.Clz"):
            assert c.exact, c.id
        out = c.graph.type_of(c.graph.result())
        if out.dtype.is_int:
            assert c.exact, c.id
    assert not by_id["MatMul-f16-7x65_65x19"].exact and by_id["MatMul-f16-7x65_65x19"].tol > 0


def test_packed_cases_come_from_registered_formats():
    from poot.formats import formats

    names = {c.dtype for c in all_cases() if c.key == "PackedContraction"}
    assert names == set(formats())


# -- guards ----------------------------------------------------------------------------------
def _case(prefix):
    return next(c for c in all_cases() if c.id.startswith(prefix))


def test_guarded_plan_moves_arena_places_and_keeps_alignment():
    from poot.plan import plan

    t = resolve("reference")
    c = _case("Binary.Add-f32-3x257")
    p = plan(c.graph, (t.backend, t.device))
    g = guarded(p)
    assert g.regions["arena"].nbytes == p.regions["arena"].nbytes + 2 * GUARD
    assert [s.out.offset for s in g.steps] == [s.out.offset + GUARD for s in p.steps]
    mask = occupied(g, g.regions["arena"].nbytes)
    assert not mask[:GUARD].any() and mask[GUARD: GUARD + 3 * 257 * 4].all()
    assert not mask[GUARD + 3 * 257 * 4:].any()


class SpillingRuntime:
    """Wraps the reference runtime; every step also writes one byte past its result."""

    def __init__(self, inner, where):
        self.inner, self.where, self.device = inner, where, inner.device

    def alloc(self, n, label):
        return self.inner.alloc(n, label)

    def write(self, buf, off, a):
        self.inner.write(buf, off, a)

    def read(self, buf, off, n):
        return self.inner.read(buf, off, n)

    def load(self, plan, buffers):
        exe = self.inner.load(plan, buffers)
        out = plan.steps[-1].out
        at = out.offset + (out.nbytes if self.where == "after" else -1)
        data = buffers[out.region].data
        if self.where == "past-input":  # one byte past the end of the first input's buffer
            region = plan.slot_regions()[0]
            at, data = region.nbytes, buffers[region.name].data

        class Spill:
            recorded = False

            def run(self):
                exe.run()
                data[at] ^= 0xFF
        return Spill()


@pytest.mark.parametrize("where", ["after", "before", "past-input"])
def test_out_of_bounds_writes_are_caught(where):
    t = resolve("reference")
    c = _case("Unary.Exp-f32-3x257")
    rng = t.rng(c.id)
    rt = SpillingRuntime(t.backend.runtime(t.device), where)
    out = run_case(c.graph, draw_all(rng, c.args), t.backend, t.device, rt, rng)
    assert any("out-of-bounds write" in p for p in out.problems), out.problems
    if where == "past-input":
        assert any("past the end of buffer 'slot:x0'" in p for p in out.problems)


def test_a_clean_run_has_no_problems_and_matches():
    from poot.oracle import evaluate

    t = resolve("reference")
    c = _case("Attention-bf16")
    rng = t.rng(c.id)
    ins = draw_all(rng, c.args)
    out = run_case(c.graph, ins, t.backend, t.device, t.runtime, rng, timed=True)
    assert out.problems == [] and out.seconds > 0
    assert mismatch(evaluate(c.graph, ins, outputs="result")[0], out.result, c.exact,
                    c.tol) is None


# -- the pytest plugin and the command -------------------------------------------------------
def test_plugin_adds_nothing_to_other_runs(pytester):
    pytester.makepyfile("def test_one():\n    assert True\n")
    r = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    r.assert_outcomes(passed=1)
    assert "poot conformance" not in r.stdout.str()


def test_suite_on_the_reference_subset_and_support_file(pytester, tmp_path):
    support = tmp_path / "ref.md"
    r = pytester.runpytest_inprocess("--pyargs", "poot.conformance", "-p", "no:cacheprovider",
                                     "-k", "Select or test_runtime", "--poot-support",
                                     str(support), "--poot-perf")
    out = r.stdout.str()
    assert r.ret == 0, out[-3000:]
    assert "poot conformance: reference on reference:0" in out       # the default target
    assert "Select-f32-nan_inf_passthrough" in out                   # the perf table
    text = support.read_text()
    assert text.startswith("# reference on reference:0") and "| Select |" in text
    assert "## Conformance results" in text


def test_unknown_backend_is_a_usage_error(pytester):
    r = pytester.runpytest_inprocess("--pyargs", "poot.conformance", "--poot-backend", "nope",
                                     "-p", "no:cacheprovider")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "unknown backend 'nope'" in r.stderr.str() + r.stdout.str()


def test_cli_conformance_argv():
    import argparse

    from poot.cli import conformance

    p = argparse.ArgumentParser()
    conformance.add_parser(p.add_subparsers())
    args = p.parse_args(["conformance", "toy", "--support", "--perf", "-k", "Exp", "--seed",
                         "3"])
    argv = conformance.pytest_argv(args)
    assert argv[:4] == ["--pyargs", "poot.conformance", "--poot-backend", "toy"]
    assert "docs/support/toy.md" in argv and "--poot-perf" in argv and "Exp" in argv
    assert argv[argv.index("--poot-seed") + 1] == "3"


def test_cli_conformance_unknown_backend_is_one_line(capsys):
    from poot.cli import main

    assert main(["conformance", "no-such"]) == 2
    assert "unknown backend 'no-such'" in capsys.readouterr().err


def test_a_backend_without_a_device_is_a_usage_error_with_its_reason(pytester):
    from poot.contract import Backend
    from poot.plugin import hookimpl, register, unregister

    class Absent(Backend):
        name = "absent"

        def unavailable_reason(self):
            return "no absent driver (libabsent.so not found)"

    class Plugin:
        @hookimpl
        def poot_backends(self):
            return [Absent()]

    plugin = Plugin()
    register(plugin, name="test:absent")
    try:
        r = pytester.runpytest_inprocess("--pyargs", "poot.conformance", "--poot-backend",
                                         "absent", "-p", "no:cacheprovider")
    finally:
        unregister(plugin)
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "libabsent.so not found" in r.stderr.str() + r.stdout.str()


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16])
def test_special_inputs_plant_the_edges_of_the_dtype(dtype):
    """+-0, +-Inf and the largest finite values (and F16's subnormals) are planted once
    each into a "special" input; small inputs get only the infinities."""
    a = draw(np.random.default_rng(1), Arg(TensorType((3, 257), dtype), "special"))
    bits = {v.tobytes() for v in a.reshape(-1)}
    for v in special_values(dtype):
        assert v.tobytes() in bits, (dtype, v)
    assert np.signbit(a[a.astype(np.float32) == 0].astype(np.float32)).tolist().count(True) == 1
    tiny = draw(np.random.default_rng(1), Arg(TensorType((2, 3), dtype), "special"))
    assert np.isinf(tiny.astype(np.float32)).sum() == 2 and not np.any(tiny == 0)

