"""Run scalar expressions on the device and compare them with the oracle's rules."""
from __future__ import annotations

import numpy as np
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Expr, Load, evaluate, ge, i32
from poot.codegen.program import Access, global_id
from poot.dtypes import DType

from poot_wgpu.launch import run_kernels

WORKGROUP = 64
GID = global_id()  # every Load of an input indexes its buffer by the global thread id


def inputs_for(dtype: DType, n: int, rng: np.random.Generator, special: bool = True):
    """Random values of `dtype`; floats get NaN, +-Inf, +-0, huge and subnormal ones."""
    if dtype.is_float:
        x = (rng.standard_normal(n) * rng.choice([0.01, 1.0, 100.0], n)).astype(np.float32)
        if special:
            x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -7e4, 1e-40]
        with np.errstate(over="ignore"):  # huge values become Inf in the narrow floats
            return x.astype(dtype.numpy)
    info = np.iinfo(dtype.numpy)
    x = rng.integers(info.min, int(info.max) + 1, n, dtype=np.int64)
    x[:4] = [0, 1, info.min, info.max]
    return x.astype(dtype.numpy)


def load(name: str, dtype: DType) -> Load:
    return Load(name, GID, dtype)


def run_exprs(dev, inputs: dict[str, np.ndarray], exprs: dict[str, Expr]):
    """Evaluate each expression per element on the device (one kernel, one launch) and with
    numpy (`poot.codegen.expr.evaluate`). Returns {name: (got, want)}."""
    n = len(next(iter(inputs.values())))
    kb = KernelBuilder("exprs", grid=(-(-n // WORKGROUP),), workgroup=(WORKGROUP,))
    for name, a in inputs.items():
        kb.buffer(name, DType.of(a), Access.READ, n)
    for name, e in exprs.items():
        kb.buffer(name, e.dtype, Access.WRITE, n)
    with kb.if_(ge(i32(n - 1), GID)):
        for name, e in exprs.items():
            kb.store(name, GID, e)
    arrays = dict(inputs)
    arrays.update({name: np.zeros(n, e.dtype.numpy) for name, e in exprs.items()})
    got = run_kernels(dev, [kb.finish()], arrays)
    env = {GID.name: np.arange(n, dtype=np.int32)}
    want = {name: np.broadcast_to(evaluate(e, env, inputs), (n,)).astype(e.dtype.numpy)
            for name, e in exprs.items()}
    return {name: (got[name], want[name]) for name in exprs}


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str):
    """Bit-for-bit equality, except that any NaN matches any NaN."""
    if _is_float(want):
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan), \
            f"{what}: NaN positions differ"
        got, want = got[~nan], want[~nan]
    bad = np.flatnonzero(_bits(got) != _bits(want))
    assert bad.size == 0, (f"{what}: {bad.size} elements differ, first at {bad[0]}: "
                           f"got {got[bad[0]]!r}, want {want[bad[0]]!r}")


def assert_close(got: np.ndarray, want: np.ndarray, what: str, rtol: float, atol: float = 0.0):
    """NaN and Inf in place and sign; finite values within rtol/atol."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{what}: NaN positions differ"
    inf = np.isinf(w)
    assert np.array_equal(g[inf], w[inf]), f"{what}: Inf differs"
    fin = np.isfinite(w)
    ok = np.isclose(g[fin], w[fin], rtol=rtol, atol=atol)
    if not ok.all():
        i = np.flatnonzero(~ok)[0]
        raise AssertionError(f"{what}: {np.count_nonzero(~ok)} elements off; first: "
                             f"got {g[fin][i]!r}, want {w[fin][i]!r}")
