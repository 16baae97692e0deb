"""Shared fixtures: the probe's reason for skipping GPU runs, and compiled cases."""
from __future__ import annotations

import functools

import pytest
from poot.codegen.cases import all_cases
from poot.codegen.lower import lower
from poot_cuda.kernels import compile_lowering
from poot_cuda.printer import CudaPrinter
from poot_cuda.probe import probe

ARCH = "sm_90"
CASES = all_cases()


@functools.cache
def compiled(case_id: str, arch: str = ARCH):
    """A case lowered, printed and compiled once per session (and cached on disk)."""
    case = next(c for c in CASES if c.id == case_id)
    return compile_lowering(lower(case.op, case.ins, case.out()), CudaPrinter(arch))


@pytest.fixture(scope="session")
def gpu():
    """The first CUDA device's info, or a skip naming why there is none."""
    devices, reason = probe()
    if not devices:
        pytest.skip(reason)
    return devices[0]
