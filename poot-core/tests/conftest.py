"""Shared fixtures of poot-core's tests: a seeded rng per test and random array helpers,
and `site`, a folder on sys.path to install fake plugin distributions in.

Every test gets fresh inputs drawn from a seed derived from its node id and POOT_SEED
(default 0), so a failure reproduces and a different POOT_SEED draws different inputs.
Random floats are never zero (nor so small they round to zero in a narrow dtype);
random integers avoid zero unless asked.
"""
from __future__ import annotations

import os
import sys
import zlib

import numpy as np
import pytest
from poot.dtypes import DType


@pytest.fixture
def rng(request) -> np.random.Generator:
    seed = zlib.crc32(request.node.nodeid.encode()) ^ int(os.environ.get("POOT_SEED", "0"))
    return np.random.default_rng(seed)


def random_array(rng: np.random.Generator, shape, dtype="f32", *, lo=None, hi=None,
                 scale: float = 1.0, zero_ok: bool = False) -> np.ndarray:
    """A random array of `dtype`: floats normal*scale (|x| >= scale/64, so never zero),
    integers uniform in [lo, hi) (default [-100, 100)), zeros redrawn unless zero_ok."""
    dtype = DType.parse(dtype)
    shape = tuple(shape)
    if dtype.is_float:
        x = rng.standard_normal(shape) * scale
        tiny = np.abs(x) < scale / 64
        x = np.where(tiny, np.copysign(scale / 8, x + 1e-300), x)
        if lo is not None or hi is not None:
            x = np.clip(x, lo if lo is not None else -np.inf, hi if hi is not None else np.inf)
        return x.astype(np.float32).astype(dtype.numpy)
    info = np.iinfo(dtype.numpy)
    lo = max(info.min, -100) if lo is None else lo
    hi = min(info.max, 100) if hi is None else hi
    x = rng.integers(lo, hi, size=shape, dtype=np.int64)
    if not zero_ok and lo < 0 < hi - 1:
        while (x == 0).any():
            x = np.where(x == 0, rng.integers(lo, hi, size=shape, dtype=np.int64), x)
    return x.astype(dtype.numpy)


@pytest.fixture
def rand(rng):
    """rand(shape, dtype="f32", **kw): a fresh random array (see random_array)."""
    return lambda shape, dtype="f32", **kw: random_array(rng, shape, dtype, **kw)


@pytest.fixture
def run_traced():
    """run_traced(fn, *arrays, kinds=...) -> (graph, outputs): trace fn on specs made from
    the arrays (consts unless `specs` overrides them) and evaluate it on the oracle."""
    import poot

    def go(fn, *arrays, specs=None):
        specs = specs or [poot.spec(a.shape, DType.of(a), name=f"a{i}")
                          for i, a in enumerate(arrays)]
        g = poot.trace(fn, *specs)
        return g, poot.evaluate(g, list(arrays))

    return go


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bits of an array, as unsigned integers of its width."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


@pytest.fixture
def as_bits():
    return bits


class Site:
    """A folder on sys.path that fake installed distributions are written to."""

    def __init__(self, root):
        self.root = root

    def distribution(self, name: str, module: str, body: str, *, group: str = "poot",
                     entry: str | None = None, core: str = ">=0.1.0,<1",
                     extra: str = "") -> None:
        """Distribution `name` 0.1.0, requiring poot-core`core` (plus `extra` METADATA
        lines), whose entry point `entry` (default: `module`) of `group` is `module`, a
        module of source `body`."""
        info = self.root / f"{name.replace('-', '_')}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n"
                                       f"Requires-Dist: poot-core{core}\n{extra}")
        (info / "entry_points.txt").write_text(f"[{group}]\n{entry or module} = {module}\n")
        (self.root / f"{module}.py").write_text(body)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A Site on sys.path; the modules imported from it are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield Site(tmp_path)
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]
