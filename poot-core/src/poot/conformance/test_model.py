"""A real model's graph, op by op: one decoder layer of a small GQA Llama, as traced and
as compiled, each distinct eqn a case (see model.py). A model that cannot be built is
this module's collection error, not the whole suite's."""
from __future__ import annotations

from poot.conformance.test_ops import check_declared, check_refused


def test_model_declared(model_case, target, report, perf):
    check_declared(model_case, target, report, perf)


def test_model_refused(model_case, target, report):
    check_refused(model_case, target, report)
