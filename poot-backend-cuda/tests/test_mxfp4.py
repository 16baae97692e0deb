"""MXFP4 on cuda (no GPU): its E8M0 scales and E2M1 codes are packed sources on every
architecture, so every MXFP4 conformance case (OCP `mxfp4`, as gpt-oss's experts are
stored, and `gguf:MXFP4`) is declared and, being declared, must compile to CUBIN in
test_ci_compile's whole-suite check; the dtype cases of those byte floats stay refused.
"""
from __future__ import annotations

import pytest
from poot.conformance.compile_only import conformance_cases
from poot.dtypes import DType
from poot.errors import DtypeLowering
from poot_cuda.backend import CudaBackend


@pytest.fixture(scope="module")
def cases():
    return conformance_cases()


def is_mxfp4(case) -> bool:
    return "mxfp4" in case.id.lower()


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_every_mxfp4_case_is_declared(cases, arch):
    """Every MXFP4 case of an op cuda lowers is declared; the others (offered fusions cuda
    does not elect) are refused for the op, never for the format's dtypes."""
    table = CudaBackend().capabilities(CudaBackend.compile_only_device(arch))
    declared, by_dtype = set(), []
    for c in [c for c in cases if is_mxfp4(c)]:
        refusals = table.graph_refusals(c.graph)
        if not refusals:
            declared.add(c.id)
        by_dtype += [(c.id, err) for _, err in refusals if isinstance(err, DtypeLowering)]
    assert not by_dtype, by_dtype
    for fmt in ("mxfp4", "gguf:MXFP4"):
        assert {f"PackedDequant-{fmt}-8x256", f"PackedContraction-{fmt}-3x256",
                f"GatedContraction-PackedContraction-{fmt}-1x256", f"PackedRowGather-{fmt}-5",
                f"IndexedPackedContraction-{fmt}-4x256-2experts"} <= declared, (fmt, declared)
    assert {"PackedContraction-mxfp4-longK-2x14336", "Q8PackedContraction-gguf:MXFP4-1x256"} \
        <= declared


def test_byte_floats_are_storage_only(cases):
    """f8e8m0 / f4e2m1 hold packed bytes only: an op computing with them is refused."""
    table = CudaBackend().capabilities(CudaBackend.compile_only_device("sm_90"))
    for dtype in (DType.F8E8M0, DType.F4E2M1):
        own = [c for c in cases if f"-{dtype}-" in c.id]
        assert own, dtype
        assert all(table.graph_refusals(c.graph) for c in own), dtype
