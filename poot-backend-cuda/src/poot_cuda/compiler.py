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
"""
from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import threading

from poot.errors import DeviceUnavailable, LoweringError, MissingPackage
from poot.optional import require

_lock = threading.Lock()


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
    with _lock:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)  # atomic: a reader never sees half a file
    return cubin


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
