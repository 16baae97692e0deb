"""The system C compiler: C source -> a shared library loaded with ctypes, cached.

The compiler is `$CC`, else `gcc` (Debian's gcc 12 on the machines poot runs on).
Flags: -O3 for the host's instruction set (-march=native), OpenMP, and the IEEE
semantics the oracle has (no -ffast-math: no reassociation, no flush to zero).
Libraries are cached under `$POOT_CACHE/cpu`, keyed by the source, the flags, the
compiler's own version line and the host CPU's feature flags (what -march=native
targets), so a changed kernel, flag, compiler or CPU never reuses a stale library.
"""
from __future__ import annotations

import ctypes
import functools
import os
import pathlib
import shutil
import tempfile
import threading

from poot.digest import hexdigest
from poot.errors import DeviceUnavailable, LoweringError

FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11",
         "-fno-math-errno", "-ffp-contract=off", "-w")
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


class CompileError(LoweringError):
    """The C compiler rejected a translation unit; the message holds its log."""


def compiler() -> str:
    return os.environ.get("CC") or "gcc"


@functools.cache
def compiler_version(cc: str | None = None) -> str:
    """The compiler's version line; DeviceUnavailable when there is no compiler."""
    cc = cc or compiler()
    path = shutil.which(cc)
    if path is None:
        raise DeviceUnavailable(f"no C compiler: {cc!r} is not on PATH (apt-get install gcc)")
    memo = _version_memo(path)
    try:
        return memo.read_text()
    except OSError:
        pass
    import subprocess  # only here and for a compile: a warm run keeps none of its imports

    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DeviceUnavailable(f"C compiler {cc!r} does not run: {e}") from None
    if out.returncode != 0:
        raise DeviceUnavailable(f"C compiler {cc!r} --version failed: {out.stderr.strip()}")
    line = out.stdout.splitlines()[0].strip()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
        tmp.write_text(line)
        os.replace(tmp, memo)      # atomic: concurrent runs write the same line
    except OSError:
        pass                       # a read-only cache: ask the compiler each run
    return line


def _version_memo(path: str) -> pathlib.Path:
    """Where the version line of the compiler binary at `path` is kept, named by the
    binary's identity (resolved path, inode, size, modification time): a reinstalled or
    upgraded compiler is asked again."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return cache_dir() / "compilers" / \
        f"{hexdigest(real, str(st.st_ino), str(st.st_size), str(st.st_mtime_ns))}.txt"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The host CPU's feature flags (cpuid, as /proc/cpuinfo lists them; empty where it
    cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cache_dir() -> pathlib.Path:
    from poot.paths import cache_dir as root

    return root() / "cpu"


def library_key(source: str, flags=FLAGS) -> str:
    return hexdigest(compiler_version(), " ".join(flags), " ".join(sorted(cpu_flags())),
                     source)


def build(source: str, flags=FLAGS) -> pathlib.Path:
    """The shared library of `source`, compiled now or found in the cache."""
    key = library_key(source, flags)
    out_dir = cache_dir()
    lib = out_dir / f"{key}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        src = pathlib.Path(tmp) / f"{key}.c"
        src.write_text(source)
        tmp_lib = pathlib.Path(tmp) / f"{key}.so"
        cmd = [compiler(), *flags, str(src), "-o", str(tmp_lib), "-lm"]
        import subprocess

        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise CompileError(f"{compiler()} took over 600 s on {src.name}",
                               backend="cpu") from None
        if res.returncode != 0:
            raise CompileError(f"{compiler()} failed on {key}.c:\n{res.stderr[-4000:]}",
                               backend="cpu")
        os.replace(tmp_lib, lib)       # atomic: a concurrent build of the same key is fine
        (out_dir / f"{key}.c").write_text(source)
    return lib


def _wait_policy() -> None:
    """OpenMP threads sleep at barriers unless the user chose otherwise: spinning (libgomp's
    default) collapses when the cores are shared with other work (a decode step went from
    35 ms to 7 s on a 2-core machine at load 14). Read by libgomp when it is first loaded."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "passive"


def load(source: str, flags=FLAGS) -> ctypes.CDLL:
    """`source` compiled and loaded (once per process and library)."""
    _wait_policy()
    path = str(build(source, flags))
    with _lock:
        lib = _loaded.get(path)
        if lib is None:
            lib = _loaded[path] = ctypes.CDLL(path)
    return lib


__all__ = ["FLAGS", "CompileError", "build", "cache_dir", "compiler", "compiler_version",
           "cpu_flags", "load", "library_key"]
