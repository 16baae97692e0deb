"""The session's target and report, kept in the pytest config (shared by the plugin
module, which resolves the target early when --poot-backend is given, and conftest.py)."""
from __future__ import annotations

import pytest

from poot.conformance.report import Report
from poot.conformance.target import DEFAULT_SEED, resolve
from poot.errors import PootError

TARGET = pytest.StashKey()
REPORT = pytest.StashKey()


def target_of(config):
    """The backend device under test (resolved once; a wrong name or a missing device is a
    usage error with the reason, never a silent skip)."""
    if TARGET not in config.stash:
        name = config.getoption("--poot-backend") or "reference"
        seed = config.getoption("--poot-seed")
        try:
            config.stash[TARGET] = resolve(name, config.getoption("--poot-device"),
                                           DEFAULT_SEED if seed is None else seed)
        except PootError as exc:
            raise pytest.UsageError(f"poot conformance: {exc}") from None
        config.stash[REPORT] = Report(config.stash[TARGET])
    return config.stash[TARGET]
