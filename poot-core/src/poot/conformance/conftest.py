"""The suite's session: the target, case parametrization, and the support/perf reports."""
from __future__ import annotations

import pytest

from poot.conformance.cases import all_cases
from poot.conformance.session import REPORT as _REPORT
from poot.conformance.session import target_of as _target


def _model_cases():
    from poot.conformance.model import model_case_list

    return model_case_list()


#: the parametrized fixture -> where its cases come from
SOURCES = {"case": all_cases, "model_case": _model_cases}


def pytest_generate_tests(metafunc):
    """Split the cases by the backend's own declaration: declared cases must match the
    oracle (test_*declared); the others must be refused with the typed error."""
    for name, source in SOURCES.items():
        if name not in metafunc.fixturenames:
            continue
        t = _target(metafunc.config)
        want = metafunc.function.__name__.endswith("_declared")
        cases = [c for c in source() if t.declares(c.graph) == want]
        if not cases:  # e.g. the reference declares everything: nothing to refuse, say so
            kind = "declared" if want else "undeclared"
            metafunc.parametrize(name, [None], ids=[f"no-{kind}-cases"])
        else:
            metafunc.parametrize(name, cases, ids=[c.id for c in cases])


@pytest.fixture(scope="session")
def target(request):
    return _target(request.config)


@pytest.fixture(scope="session")
def report(request):
    _target(request.config)
    return request.config.stash[_REPORT]


@pytest.fixture(scope="session")
def perf(request) -> bool:
    return bool(request.config.getoption("--poot-perf"))
