"""pytest plugin of the conformance suite (loaded through the `pytest11` entry point).

It adds the command-line options and the report header (pytest asks only plugins and
the root conftest for the header, never a package's conftest) and the summary and
support matrix (under pytest-xdist only this module is loaded in the controller, which
collects nothing: the workers hand it their results); the suite itself (fixtures, cases)
lives in this package's conftest.py and test modules, which pytest loads only when the
suite is collected: `pytest --pyargs poot.conformance --poot-backend NAME`.
"""
import pytest


def pytest_addoption(parser):
    group = parser.getgroup("poot", "poot backend conformance")
    group.addoption("--poot-backend", action="store", default=None,
                    help="name of the installed poot backend to check against the oracle "
                         "(default when the suite is collected: reference)")
    group.addoption("--poot-device", action="store", type=int, default=0,
                    help="index of the backend's device to check (default 0)")
    group.addoption("--poot-seed", action="store", type=int, default=None,
                    help="seed of the case inputs (default: a fixed seed, printed in the "
                         "header; a case's inputs depend only on the seed and its id)")
    group.addoption("--poot-support", action="store", default=None, metavar="PATH",
                    help="write the backend's support matrix (Markdown, from its own "
                         "capability table, with the suite's results) to PATH")
    group.addoption("--poot-perf", action="store_true", default=False,
                    help="time each declared case (replayed steps) and print GB/s or FLOP/s")


def pytest_configure(config):
    """With --poot-backend, resolve the backend before collection (a wrong name or a
    missing device stops the run with the reason); without it, do nothing."""
    if config.getoption("--poot-backend", None):
        from poot.conformance.session import target_of

        target_of(config)


def pytest_report_header(config):
    """The backend device, the seed, and how to rerun with them."""
    if not config.getoption("--poot-backend", None):
        return None
    from poot.conformance.session import target_of

    t = target_of(config)
    return [f"poot conformance: {t} (seed {t.seed}; rerun: {t.rerun()})"]


def pytest_sessionfinish(session):
    """An xdist worker hands the controller its rows (case id, declared, ok, seconds)."""
    from poot.conformance.session import REPORT

    config = session.config
    if hasattr(config, "workeroutput") and REPORT in config.stash:
        config.workeroutput["poot_rows"] = [(r.case.id, r.declared, r.ok, r.seconds)
                                            for r in config.stash[REPORT].rows.values()]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller merges each worker's rows into its own report."""
    rows = getattr(node, "workeroutput", {}).get("poot_rows")
    if not rows:
        return
    from poot.conformance.cases import all_cases
    from poot.conformance.model import model_case_list
    from poot.conformance.session import REPORT, target_of

    target_of(node.config)
    rep = node.config.stash[REPORT]
    by_id = {c.id: c for c in [*all_cases(), *model_case_list()]}
    for case_id, declared, ok, seconds in rows:
        rep.record(by_id[case_id], declared, ok, seconds)


def pytest_terminal_summary(terminalreporter, config):
    from poot.conformance.session import REPORT

    if hasattr(config, "workeroutput") or REPORT not in config.stash:
        return
    rep = config.stash[REPORT]
    if not rep.rows:
        return
    tr = terminalreporter
    tr.section(f"poot conformance: {rep.target}")
    for line in rep.summary_lines():
        tr.write_line(line)
    if config.getoption("--poot-perf"):
        tr.section("poot conformance perf (one replayed step per case)")
        for line in rep.perf_lines():
            tr.write_line(line)
    path = config.getoption("--poot-support")
    if path:
        rep.write_support(path)
        tr.write_line(f"support matrix written to {path}")
