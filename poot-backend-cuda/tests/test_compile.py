"""The CI check of the CUDA backend: every kernel the lowerings produce compiles to CUBIN."""
from __future__ import annotations

import pytest
from poot_cuda.testing import ARCH, cases, compiled

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernels_compile_to_cubin(case):
    result = compiled(case.id)
    assert len(result.kernels) == len(result.program.kernels)
    for ck in result.kernels:
        assert ck.binary[:4] == b"\x7fELF", f"{ck.kernel.name}: NVRTC gave no ELF CUBIN"
        assert f"{ck.kernel.name}(" in ck.source
    assert result.target == ARCH
