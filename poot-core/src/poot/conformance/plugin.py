"""pytest plugin of the conformance suite (loaded through the `pytest11` entry point)."""


def pytest_addoption(parser):
    group = parser.getgroup("poot", "poot backend conformance")
    group.addoption("--poot-backend", action="store", default=None,
                    help="name of the installed poot backend to check against the oracle")
