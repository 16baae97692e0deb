"""One BLAS thread while the reference runtime runs a step.

A decode step is hundreds of small GEMVs. OpenBLAS splits each over its threads, and on
a loaded 2-core machine the hand-off costs far more than the work (measured here: a
576x1536 f32 GEMV takes 0.05 ms on one thread and 0.35 to 12 ms on two). `single_thread`
lowers OpenBLAS to one thread for the duration of a step and restores it afterwards, by
the library's own set/get calls (found in the loaded OpenBLAS, as threadpoolctl does).
Where no OpenBLAS is loaded it does nothing; results do not depend on it (a GEMV's sum
order is per output element, the same on any thread count).
"""
from __future__ import annotations

import ctypes
import functools
from contextlib import contextmanager

_PREFIXES = ("openblas", "scipy_openblas")
_SUFFIXES = ("", "64_")


@functools.cache
def _openblas() -> tuple | None:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(p for p in paths if p.startswith("/")):
        lib = ctypes.CDLL(path)
        for pre in _PREFIXES:
            for suf in _SUFFIXES:
                get = getattr(lib, f"{pre}_get_num_threads{suf}", None)
                set_ = getattr(lib, f"{pre}_set_num_threads{suf}", None)
                if get is not None and set_ is not None:
                    return get, set_
    return None


@contextmanager
def single_thread():
    fns = _openblas()
    if fns is None:
        yield
        return
    get, set_ = fns
    before = get()
    set_(1)
    try:
        yield
    finally:
        set_(before)
