"""How a backend's result is compared with the oracle's.

NMSE = sum((a - b)^2) / sum(a^2) over the finite elements, a the oracle's result.
Before that: a NaN the oracle does not have fails (and one it has must be there);
an Inf must match in place and sign. Exact cases compare bytes.
"""
from __future__ import annotations

import numpy as np


def nmse(oracle: np.ndarray, got: np.ndarray) -> float:
    a = np.asarray(oracle, np.float64).reshape(-1)
    b = np.asarray(got, np.float64).reshape(-1)
    den = float(np.sum(a * a))
    num = float(np.sum((a - b) ** 2))
    return num / den if den > 0 else num


def _where(mask: np.ndarray) -> str:
    idx = np.argwhere(mask)
    return f"{len(idx)} element(s), first at {tuple(int(i) for i in idx[0])}"


def mismatch(oracle: np.ndarray, got: np.ndarray, exact: bool, tol: float) -> str | None:
    """Why `got` does not match the oracle's result, or None when it does."""
    if got.shape != oracle.shape or got.dtype != oracle.dtype:
        return f"result is {got.dtype}{list(got.shape)}, the oracle's {oracle.dtype}" \
               f"{list(oracle.shape)}"
    if exact:
        a = np.ascontiguousarray(oracle).view(np.uint8).reshape(oracle.shape + (-1,))
        b = np.ascontiguousarray(got).view(np.uint8).reshape(got.shape + (-1,))
        bad = np.any(a != b, axis=-1)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"not bit-exact: {_where(bad)}: oracle {oracle[first]!r}, got {got[first]!r}"
                    if oracle.ndim else f"not bit-exact: oracle {oracle!r}, got {got!r}")
        return None
    a, b = oracle.astype(np.float64), got.astype(np.float64)
    na, nb = np.isnan(a), np.isnan(b)
    if (nb & ~na).any():
        return f"NaN where the oracle has a number: {_where(nb & ~na)}"
    if (na & ~nb).any():
        return f"a number where the oracle has NaN: {_where(na & ~nb)}"
    ia, ib = np.isinf(a), np.isinf(b)
    bad_inf = (ia | ib) & ~(na | nb) & ((ia != ib) | (np.sign(a) != np.sign(b)))
    if bad_inf.any():
        return f"Inf does not match in place and sign: {_where(bad_inf)}"
    fin = ~(na | ia)
    err = nmse(a[fin], b[fin])
    if not err <= tol:
        return f"NMSE {err:.3e} over the threshold {tol:.1e}"
    return None


__all__ = ["nmse", "mismatch"]
