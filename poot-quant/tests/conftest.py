"""Shared test helpers for poot-quant (fixtures only: module names stay unique in the monorepo)."""
from __future__ import annotations

import numpy as np
import pytest
from poot.codegen.expr import Load, Var, evaluate
from poot.dtypes import DType
from poot.formats import words_of


def same_f32(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equal f32 arrays, where any NaN matches any NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(nan_a, nan_b)
                and np.array_equal(a.view(np.uint32)[~nan_a], b.view(np.uint32)[~nan_b]))


def run_decode_program(fmt, sources, shape, attrs=None) -> np.ndarray:
    """Evaluate fmt.decode_expr for every (n, k) at once with the oracle's scalar rules."""
    attrs = dict(attrs or {})
    roles = [s.role for s in fmt.roles(shape, attrs)]
    loaded = []

    def load(role, index):
        loaded.append(role)
        return Load(role, index, DType.U32)

    expr = fmt.decode_expr(load, Var("n"), Var("k"), shape, attrs)
    assert expr.dtype is DType.F32 and set(loaded) <= set(roles)
    n, k = shape
    env = {"n": np.arange(n, dtype=np.int32)[:, None], "k": np.arange(k, dtype=np.int32)[None, :]}
    buffers = {role: words_of(np.asarray(src)) for role, src in zip(roles, sources, strict=True)}
    with np.errstate(all="ignore"):
        return np.broadcast_to(evaluate(expr, env, buffers), shape)


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


def random_sources(fmt, shape, attrs, rng) -> list[np.ndarray]:
    """Random bytes for every source role (any bit pattern: NaN/Inf scales included);
    a group index gets random valid groups."""
    out = []
    for spec in fmt.roles(shape, dict(attrs)):
        if spec.role == "g_idx":
            groups = fmt.groups(shape[1], dict(attrs))
            out.append(rng.integers(0, groups, spec.type.shape, dtype=np.int32))
            continue
        raw = rng.integers(0, 256, spec.type.nbytes, dtype=np.uint8)
        out.append(raw.view(spec.type.dtype.numpy).reshape(spec.type.shape))
    return out


@pytest.fixture
def bitwise():
    return same_f32


@pytest.fixture
def decode_program():
    return run_decode_program


@pytest.fixture
def random_packed():
    return random_sources
