"""Every lowering's kernels, run by the numpy kernel interpreter, against the oracle."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from poot.codegen.cases import Case, all_cases, mismatch
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.oracle import apply

CASES = all_cases()


def operands(case: Case, seed: int = 0) -> list:
    rng = np.random.default_rng(zlib.crc32(case.id.encode()) + seed)
    return case.make(rng)


def oracle_args(case: Case, arrays) -> list:
    return [np.asarray(x.value, x.dtype.numpy) if a is None else a
            for a, x in zip(arrays, case.ins, strict=True)]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_lowering_matches_oracle(case: Case):
    out = case.out()
    arrays = operands(case)
    want = np.asarray(apply(case.op, oracle_args(case, arrays), case.types(), out))
    lowering = lower(case.op, case.ins, out)
    got = run_lowering(lowering, arrays, out)
    problem = mismatch(got, np.ascontiguousarray(want).reshape(out.shape), case.tol)
    assert problem is None, f"{case.id}: {problem}"


def test_catalog_covers_every_lowered_op():
    from poot.codegen.lower import LOWERINGS

    covered = {type(c.op) for c in CASES}
    missing = sorted(t.__name__ for t in LOWERINGS if t not in covered)
    assert not missing, f"ops with a lowering but no case: {missing}"
