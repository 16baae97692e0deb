"""pytest plugin of the conformance suite (loaded through the `pytest11` entry point).

It adds the command-line options and the report header (pytest asks only plugins and
the root conftest for the header, never a package's conftest); the suite itself
(fixtures, cases, reports) lives in this package's conftest.py and test modules, which
pytest loads only when the suite is collected:
`pytest --pyargs poot.conformance --poot-backend NAME`.
"""


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
