"""Wave64 and wave32 semantics without the hardware: every kernel program the ROCm
backend lowers (the whole lowering catalog, with the features its targets declare)
runs in the numpy kernel interpreter at subgroup width 64 and 32 against the oracle,
with its race, bounds and divergence checks on. Reductions fold in the order the HIP
printer prints them for that width (poot.codegen.simt)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from poot.codegen.cases import Case, all_cases, mismatch
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.oracle import apply
from poot_rocm.backend import RocmBackend

CASES = all_cases()
TARGETS = {64: "gfx90a", 32: "gfx1030"}


def operands(case: Case) -> list:
    return case.make(np.random.default_rng(zlib.crc32(case.id.encode())))


@pytest.mark.parametrize("wave", sorted(TARGETS))
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rocm_lowering_matches_oracle_at_wave_width(case: Case, wave: int):
    backend = RocmBackend()
    device = backend.compile_only_device(TARGETS[wave])
    assert backend.target(device).wave == wave
    out = case.out()
    arrays = operands(case)
    args = [np.asarray(x.value, x.dtype.numpy) if a is None else a
            for a, x in zip(arrays, case.ins, strict=True)]
    want = np.ascontiguousarray(apply(case.op, args, case.types(), out)).reshape(out.shape)
    lowering = lower(case.op, case.ins, out, backend.features(device))
    got = run_lowering(lowering, arrays, out, subgroup=wave)
    problem = mismatch(got, want, case.tol)
    assert problem is None, f"{case.id} at wave{wave}: {problem}"


def test_fold_order_follows_the_wavefront_width():
    """A width-128 F32 sum: wave64 adds two butterflied halves, wave32 four quarters;
    the interpreter reproduces each order bit for bit."""
    from poot.codegen.builder import KernelBuilder
    from poot.codegen.expr import Load
    from poot.codegen.interp import run
    from poot.codegen.program import Access, local_index
    from poot.dtypes import DType
    from poot.ir.ops import ReduceOp

    kb = KernelBuilder("fold", (1,), (128,))
    kb.buffer("x", DType.F32, Access.READ, 128)
    kb.buffer("out", DType.F32, Access.WRITE, 128)
    kb.store("out", local_index(), kb.reduce("r", ReduceOp.Sum,
                                              Load("x", local_index(), DType.F32)))
    k = kb.finish()
    x = (np.random.default_rng(1).standard_normal(128) * 1e4).astype(np.float32)

    def butterfly(v):
        v = v.copy()
        off = v.size // 2
        while off:
            v = v + v[np.arange(v.size) ^ off]
            off //= 2
        return v[0]

    for wave in (64, 32):
        out = np.zeros(128, np.float32)
        run(k, {"x": x, "out": out}, subgroup=wave)
        parts = [butterfly(x[i:i + wave]) for i in range(0, 128, wave)]
        want = parts[0]
        for p in parts[1:]:
            want = np.float32(want + p)
        assert np.all(out == want), wave
