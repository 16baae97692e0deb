"""Every case: declared ones match the oracle through the backend's own pipeline;
undeclared ones are refused at plan time with the typed error, with no numbers.
(`check_declared` and `check_refused` serve test_model.py too.)"""
from __future__ import annotations

import pytest

from poot.conformance.compare import mismatch
from poot.conformance.inputs import draw_all
from poot.conformance.runner import run_case
from poot.errors import LoweringError
from poot.oracle import evaluate


def test_declared(case, target, report, perf):
    check_declared(case, target, report, perf)


def test_refused(case, target, report):
    check_refused(case, target, report)


def check_declared(case, target, report, perf):
    if case is None:
        pytest.fail(f"{target} declares none of the suite's cases: nothing it runs is checked")
    report.record(case, True, False)
    rng = target.rng(case.id)
    inputs = draw_all(rng, case.args, case.fixed)
    (want,) = evaluate(case.graph, inputs, outputs="result")
    try:
        out = run_case(case.graph, inputs, target.backend, target.device, target.runtime, rng,
                       timed=perf)
    except LoweringError as exc:
        pytest.fail(f"{target} declares {case.key} on {case.dtype} but refused it: {exc} "
                    f"{where(case, target)}")
    problems = list(out.problems)
    bad = mismatch(want, out.result, case.exact, case.tol)
    if bad:
        problems.insert(0, bad)
    assert not problems, f"{'; '.join(problems)} {where(case, target)}"
    report.record(case, True, True, out.seconds)


def where(case, target) -> str:
    """What every failure line ends with: op, dtype, shapes, backend, seed, rerun command."""
    shapes = ", ".join(str(a.type) for a in case.args) or "no operands"
    return (f"[{case.key} on {case.dtype}, operands {shapes}; {target}; seed {target.seed}; "
            f"rerun: {target.rerun(case.id)}]")


def check_refused(case, target, report):
    from poot.plan import plan

    if case is None:  # the generator found no undeclared case: the backend declares them all
        return
    report.record(case, False, False)
    refused = target.table.graph_refusals(case.graph)[0][1]
    try:
        got = plan(case.graph, (target.backend, target.device))
    except LoweringError as exc:
        assert exc.backend == target.backend.name and exc.op and exc.device, \
            f"the refusal must name op, backend and device: {exc!r} {where(case, target)}"
        report.record(case, False, True)
        return
    pytest.fail(f"{target} does not declare this case ({refused}) but planned it "
                f"({got.dispatches} dispatches) instead of raising the typed refusal "
                f"{where(case, target)}")
