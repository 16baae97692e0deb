"""hiprtc: HIP source -> code object for one target, with an on-disk cache.

Each kernel's code object is cached under $POOT_CACHE/rocm by a key of its printed
source, the target, the options and the toolchain's version, so a changed kernel,
target or compiler never reuses a stale binary. hiprtc parses the HIP runtime
header again for every program, a fixed cost near half a second, so kernels are
built several to a translation unit (printed units concatenate, see
poot_rocm.printer): `build(sources, target)` compiles what the cache lacks in
units of up to `BATCH` kernels, and `batch()` defers every compile made inside it
(a whole plan, or CI's thousand kernels) to its end, and builds its units in
parallel processes (hiprtc serializes the threads of one process). A unit's code
object is stored once; each member's key then names it.

A target the installed toolchain cannot build is refused before hiprtc sees it
(`poot_rocm.toolchain.require`): old hiprtc crashes on newer targets.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import multiprocessing
import os
import pathlib
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from poot.errors import LoweringError
from poot.optional import require as require_package

from poot_rocm.archs import Target
from poot_rocm.toolchain import cache_dir, locate, require

BATCH = 64            # kernels per translation unit
_lock = threading.Lock()
_deferred: list | None = None


class CompileError(LoweringError):
    """hiprtc rejected a kernel; the message holds its log."""

    def __init__(self, message: str, **names):
        super().__init__(message, **names)
        self._given = (message, names)

    def __reduce__(self):   # crosses back from a compile process with its names
        message, names = self._given
        return _rebuild, (message, names)


def _rebuild(message: str, names: dict) -> CompileError:
    return CompileError(message, **names)


def options(t: Target) -> list[str]:
    opts = [f"--offload-arch={t.arch.name}", "-O3", "-std=c++17"]
    if t.arch.rdna:    # RDNA runs wave32 or wave64; the printed reductions fix one
        opts.append("-mwavefrontsize64" if t.wave == 64 else "-mno-wavefrontsize64")
    return opts


def cache_key(source: str, t: Target) -> str:
    h = hashlib.sha256()
    for part in (source, t.name, str(locate().version), repr(options(t))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _path(key: str) -> pathlib.Path:
    return cache_dir() / f"{key}.hsaco"


def cached(key: str) -> bytes | None:
    """The code object holding the kernel of `key`, if it was built."""
    path = _path(key)
    if not path.exists():
        return None
    data = path.read_bytes()
    if data.startswith(b"ref:"):            # built in a unit with others
        unit = cache_dir() / data[4:].decode().strip()
        return _unit_bytes(str(unit)) if unit.exists() else None
    return data


@functools.lru_cache(maxsize=64)
def _unit_bytes(path: str) -> bytes:
    """A unit's code object, read once per process: its kernels all return the same
    bytes object (a unit is written once, atomically, and never changes)."""
    return pathlib.Path(path).read_bytes()


def _store(path: pathlib.Path, data: bytes) -> None:
    with _lock:
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic: a reader never sees half a file


@dataclass(frozen=True)
class CodeRef:
    """A kernel's code object by cache key: inside `batch()` it exists once the batch
    ends, so plans hold the reference and the runtime loads the bytes."""

    key: str
    name: str

    def load(self) -> bytes:
        code = cached(self.key)
        if code is None:
            raise CompileError(f"kernel {self.name} has no code object in {cache_dir()} "
                               "(printed inside a compiler.batch() that has not ended, or "
                               "the cache was cleared)", op=self.name, backend="rocm")
        return code


def compile_code(source: str, name: str, t: Target) -> CodeRef:
    """One printed kernel's code object for `t` (built now unless a batch is open)."""
    build([(name, source)], t)
    return CodeRef(cache_key(source, t), name)


def build(items: list[tuple[str, str]], t: Target) -> None:
    """Make sure every (kernel name, source) has a cached code object for `t`; inside
    `batch()` the work waits for the batch's end."""
    if _deferred is not None:
        _deferred.append((items, t))
        return
    _build(items, t)


@contextlib.contextmanager
def batch(workers: int | None = None):
    """Defer every compile asked inside to the end, then build them in units of BATCH
    kernels on `workers` processes (default: one per CPU)."""
    global _deferred
    if _deferred is not None:          # nested: the outer batch builds
        yield
        return
    _deferred = []
    try:
        yield
    finally:
        pending, _deferred = _deferred, None
    by_target: dict[Target, dict[str, str]] = {}
    for items, t in pending:
        for name, source in items:
            by_target.setdefault(t, {})[cache_key(source, t)] = (name, source)
    for t, todo in by_target.items():
        _build(list(todo.values()), t, workers)


def _build(items: list[tuple[str, str]], t: Target, workers: int | None = None) -> None:
    require(t.arch.name)
    todo, seen = [], set()
    for name, source in items:
        key = cache_key(source, t)
        if key not in seen and cached(key) is None:
            seen.add(key)
            todo.append((key, name, source))
    if not todo:
        return
    units = [todo[i:i + BATCH] for i in range(0, len(todo), BATCH)]
    if len(units) == 1:
        _unit(units[0], t)
        return
    workers = max(1, min(len(units), workers or os.cpu_count() or 1))
    if workers == 1:
        for u in units:
            _unit(u, t)
        return
    # spawned, not forked: the parent holds the HIP runtime, which a fork would copy
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for f in [pool.submit(_unit, u, t) for u in units]:
            f.result()


def _unit(members: list[tuple[str, str, str]], t: Target) -> None:
    """Compile members as one unit; on failure, one by one, to name the bad kernel."""
    if len(members) == 1:
        key, name, source = members[0]
        _store(_path(key), hiprtc(source, name, t))
        return
    source = "\n".join(m[2] for m in members)
    unit_key = hashlib.sha256("\0".join(m[0] for m in members).encode()).hexdigest()
    try:
        code = hiprtc(source, f"poot_unit_{unit_key[:10]}", t)
    except CompileError:
        for m in members:
            _unit([m], t)
        return
    unit = f"unit-{unit_key}.hsaco"
    _store(cache_dir() / unit, code)
    for key, _, _ in members:
        _store(_path(key), f"ref:{unit}".encode())


def _check(result, what: str):
    rtc = require_package("hip.hiprtc", "hip-python")

    err, *rest = result
    if err != rtc.hiprtcResult.HIPRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err.name}", backend="rocm")
    return rest[0] if len(rest) == 1 else rest


def hiprtc(source: str, name: str, t: Target) -> bytes:
    """Compile one translation unit with hiprtc (no cache)."""
    locate()                 # points hip-python at the toolchain first
    rtc = require_package("hip.hiprtc", "hip-python")

    prog = _check(rtc.hiprtcCreateProgram(source.encode(), f"{name}.hip".encode(), 0, None,
                                          None), "hiprtcCreateProgram")
    try:
        opts = [o.encode() for o in options(t)]
        (err,) = rtc.hiprtcCompileProgram(prog, len(opts), opts)
        if err != rtc.hiprtcResult.HIPRTC_SUCCESS:
            size = _check(rtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
            log = bytearray(size)
            _check(rtc.hiprtcGetProgramLog(prog, log), "hiprtcGetProgramLog")
            raise CompileError(f"hiprtc could not compile {name} for {t}:\n"
                               f"{bytes(log).decode(errors='replace').strip(chr(0)).strip()}",
                               op=name, backend="rocm", device=t.name)
        size = _check(rtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
        code = bytearray(size)
        _check(rtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
        return bytes(code)
    finally:
        rtc.hiprtcDestroyProgram(prog.createRef())   # takes hiprtcProgram*
