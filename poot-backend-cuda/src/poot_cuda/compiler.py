"""NVRTC: CUDA C source -> CUBIN for one architecture, with an on-disk cache.

The cache key is the printed source, the architecture, the NVRTC version and
the options, so a changed kernel, device or compiler never reuses a stale
binary. CUBIN (not PTX) is the product: it runs ptxas inside NVRTC, which is
also the strongest check available on a machine without a GPU.

Every kernel starts with the same two fp16/bf16 headers, so NVRTC 12.8+ compiles
with its automatic precompiled header (`-pch`): the first compile of a process
parses them once into a PCH (a temporary file NVRTC removes at exit), later ones
load it (docs/performance.md). A PCH changes no output (the
CUBINs are the same bytes), so these flags stay out of the cache key.

A compile-only check of many kernels (CI's, without a GPU) pays NVRTC's fixed cost per
program a thousand times over; inside `batch()` the kernels are compiled at its end
instead, small ones up to `BATCH` to one NVRTC program (their shared header printed
once, see `split`; a large kernel costs NVRTC far more than that fixed cost, and
programs of many large kernels cost more than their kernels alone). Such a unit's CUBIN
is cached under a key of its own, never under a kernel's: a run on a GPU still loads the
CUBIN of the kernel alone.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pathlib
import threading
from dataclasses import dataclass, field

from poot.errors import DeviceUnavailable, LoweringError, MissingPackage
from poot.optional import require

BATCH = 64                          # kernels per NVRTC program inside batch()
UNIT_BYTES = 64 * 1024              # and their printed bodies' characters, at most
KERNEL_BYTES = 8 * 1024             # a larger kernel compiles alone
_lock = threading.Lock()
_deferred: list | None = None


class CompileError(LoweringError):
    """NVRTC rejected a kernel; the message holds its log."""


def _check(result, what: str):
    nvrtc = require("cuda.bindings.nvrtc", "cuda-bindings")

    err, *rest = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise CompileError(f"{what} failed: {msg.decode()}", backend="cuda")
    return rest[0] if len(rest) == 1 else rest


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    try:
        nvrtc = require("cuda.bindings.nvrtc", "cuda-bindings")
    except MissingPackage as e:
        raise DeviceUnavailable(str(e)) from None
    major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Where cuda_fp16.h and cuda_bf16.h live (the nvidia-cuda-runtime wheel)."""
    pathfinder = require("cuda.pathfinder", "cuda-pathfinder")

    found = pathfinder.find_nvidia_header_directory("cudart")
    if not found:
        raise DeviceUnavailable("CUDA runtime headers not found (pip install "
                                "'nvidia-cuda-runtime==13.0.*')")
    return (str(found),)


def cache_dir() -> pathlib.Path:
    """Compiled kernels live under poot's one cache root ($POOT_CACHE, see poot.paths)."""
    from poot.paths import cache_dir as root

    path = root() / "cuda"
    path.mkdir(parents=True, exist_ok=True)
    return path


def options(arch: str) -> list[str]:
    return [f"-arch={arch}", "--std=c++17", "-default-device",
            *(f"-I{d}" for d in include_dirs())]


@functools.cache
def speed_options() -> tuple[str, ...]:
    """Flags that make NVRTC faster without changing what it builds: the automatic
    precompiled header (NVRTC 12.8+), without its "creating/using" lines in the log."""
    return ("-pch", "--pch-messages=false") if nvrtc_version() >= (12, 8) else ()


@functools.cache
def headers_digest() -> str:
    """The bytes of the headers kernels compile against. The key holds these rather than
    the -I paths: a fresh virtual environment or clone puts the same headers elsewhere, and
    its kernels are the same build."""
    h = hashlib.sha256()
    for d in include_dirs():
        for f in sorted(p for p in pathlib.Path(d).rglob("*") if p.is_file()):
            h.update(f.relative_to(d).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(source: str, arch: str) -> str:
    flags = [o for o in options(arch) if not o.startswith("-I")]
    h = hashlib.sha256()
    for part in (source, arch, repr(nvrtc_version()), repr(flags), headers_digest()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_cubin(source: str, name: str, arch: str = "sm_90") -> bytes:
    """The CUBIN of `source` for `arch` (from the cache when this exact build exists)."""
    path = cache_dir() / f"{cache_key(source, arch)}.cubin"
    if path.exists():
        return path.read_bytes()
    cubin = _nvrtc(source, name, arch)
    _store(path, cubin)
    return cubin


def _store(path: pathlib.Path, data: bytes) -> None:
    with _lock:
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic: a reader never sees half a file


# -- compile-only batches --------------------------------------------------------------------
#: where a printed kernel's own part begins (poot.codegen.simt's signature); what comes
#: before it is the header and the scalar helpers, the same for every kernel of a dialect
KERNEL_START = 'extern "C" __global__'


def split(source: str) -> tuple[str, str]:
    """(shared header, the kernel's own part) of a printed source; ("", source) when it
    has no kernel signature to split at."""
    i = source.find(KERNEL_START)
    return (source[:i], source[i:]) if i > 0 else ("", source)


@dataclass(frozen=True)
class UnitRef:
    """A kernel compiled inside `batch()`: `load()` gives a CUBIN that holds it, the
    kernel's own if one was cached, else that of the NVRTC program it was built in with
    others (for checking; a runtime loads `compile_cubin`'s)."""

    key: str
    name: str

    def load(self) -> bytes:
        own = cache_dir() / f"{self.key}.cubin"
        if own.exists():
            return own.read_bytes()
        ref = cache_dir() / f"{self.key}.unit"
        unit = cache_dir() / ref.read_text().strip() if ref.exists() else None
        if unit is None or not unit.exists():
            raise CompileError(f"kernel {self.name} has no CUBIN in {cache_dir()} (compiled "
                               "inside a compiler.batch() that has not ended, or the cache "
                               "was cleared)", op=self.name, backend="cuda")
        return _unit_bytes(str(unit))


@functools.lru_cache(maxsize=64)
def _unit_bytes(path: str) -> bytes:
    """A unit's CUBIN, read once per process (written once, atomically, never changed)."""
    return pathlib.Path(path).read_bytes()


def batching() -> bool:
    return _deferred is not None


def defer(source: str, name: str, arch: str) -> UnitRef:
    """Inside `batch()`: the kernel's CUBIN, compiled when the batch ends."""
    _deferred.append((source, name, arch))
    return UnitRef(cache_key(source, arch), name)


@contextlib.contextmanager
def batch():
    """Compile every kernel deferred inside (`defer`) at the end: the small ones up to BATCH
    of one architecture and header (UNIT_BYTES of kernel text) to an NVRTC program, a
    larger one alone. A program that fails is compiled again kernel by kernel, so the
    CompileError names the kernel and holds its log."""
    global _deferred
    if _deferred is not None:          # nested: the outer batch builds
        yield
        return
    _deferred = []
    try:
        yield
    finally:
        pending, _deferred = _deferred, None
    _build(pending)


def _built(key: str) -> bool:
    if (cache_dir() / f"{key}.cubin").exists():
        return True
    ref = cache_dir() / f"{key}.unit"
    return ref.exists() and (cache_dir() / ref.read_text().strip()).exists()


@dataclass
class _Unit:
    """Kernels of one architecture and header to compile as one NVRTC program."""

    members: list = field(default_factory=list)     # (key, name, source)
    chars: int = 0                                   # of their own parts

    def fits(self, name: str, chars: int) -> bool:
        # a name once per program: kernels of one name and different bodies go apart
        return (len(self.members) < BATCH and self.chars + chars <= UNIT_BYTES
                and all(m[1] != name for m in self.members))


def _build(pending: list[tuple[str, str, str]]) -> None:
    units: dict[tuple[str, str], list[_Unit]] = {}
    seen = set()
    for source, name, arch in pending:
        key = cache_key(source, arch)
        if key in seen or _built(key):
            continue
        seen.add(key)
        header, own = split(source)
        if not header or len(own) > KERNEL_BYTES:   # NVRTC's fixed cost is little of its own
            compile_cubin(source, name, arch)
            continue
        of_header = units.setdefault((arch, header), [])
        unit = next((u for u in of_header if u.fits(name, len(own))), None)
        if unit is None:
            of_header.append(unit := _Unit())
        unit.members.append((key, name, source))
        unit.chars += len(own)
    for (arch, header), of_header in units.items():
        for unit in of_header:
            _unit(unit.members, header, arch)


def _unit(members: list[tuple[str, str, str]], header: str, arch: str) -> None:
    if len(members) == 1:
        for _, name, source in members:
            compile_cubin(source, name, arch)
        return
    unit_key = hashlib.sha256("\0".join(m[0] for m in members).encode()).hexdigest()
    try:
        cubin = _nvrtc(header + "".join(split(m[2])[1] for m in members),
                       f"poot_unit_{unit_key[:10]}", arch)
    except CompileError:
        for _, name, source in members:
            compile_cubin(source, name, arch)
        return
    unit = f"unit-{unit_key}.cubin"
    _store(cache_dir() / unit, cubin)
    for key, _, _ in members:
        _store(cache_dir() / f"{key}.unit", unit.encode())


def _nvrtc(source: str, name: str, arch: str) -> bytes:
    nvrtc = require("cuda.bindings.nvrtc", "cuda-bindings")

    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []),
                  "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in (*options(arch), *speed_options())]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            _check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            raise CompileError(f"NVRTC could not compile kernel {name} for {arch}:\n"
                               f"{log.decode(errors='replace').strip()}", op=name,
                               backend="cuda", device=arch)
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
