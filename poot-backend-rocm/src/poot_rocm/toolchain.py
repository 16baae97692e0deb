"""The installed HIP toolchain: where its libraries are, its version, which targets it
can build, and the `hipcc` compiler driver.

hip-python finds the HIP runtime and hiprtc through $ROCM_PATH (lib/libamdhip64.so,
lib/libhiprtc.so). A ROCm install has both; Debian's packages (apt `hipcc`, ROCm
5.2) ship only libamdhip64.so.5, which exports hiprtc too. Where $ROCM_PATH is not
set, `locate()` finds the library and, for Debian's layout, makes a folder of the
two links under $POOT_CACHE/rocm/toolchain that hip-python then reads.

An old toolchain crashes (not errs) on a target newer than itself: ROCm 5.2's hiprtc
aborts the process on gfx942 or gfx1100. So whether a target builds is asked once
per toolchain and target in a child process (`buildable`), and the answer kept.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys
from dataclasses import dataclass

from poot.errors import DeviceUnavailable, LoweringError, MissingPackage
from poot.optional import require as require_package

ENV = "ROCM_PATH"
LIB_DIRS = ("/opt/rocm/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


class UnsupportedTarget(LoweringError):
    """The installed toolchain cannot build code for this target (e.g. gfx942 with ROCm
    5.2); names the target and the toolchain."""


@dataclass(frozen=True)
class Toolchain:
    root: pathlib.Path          # what $ROCM_PATH names for hip-python
    library: pathlib.Path       # the HIP runtime library it loads (resolved)
    version: int                # hipRuntimeGetVersion: major * 10^7 + minor * 10^5 + patch

    @property
    def release(self) -> str:
        v = self.version
        return f"{v // 10_000_000}.{v // 100_000 % 100}.{v % 100_000}"

    def __str__(self) -> str:
        return f"ROCm {self.release} ({self.library})"


def cache_dir() -> pathlib.Path:
    """Where compiled code objects and the toolchain's facts live ($POOT_CACHE/rocm)."""
    from poot.paths import cache_dir as root

    path = root() / "rocm"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _find_runtime() -> pathlib.Path | None:
    for d in LIB_DIRS:
        for name in ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"):
            p = pathlib.Path(d) / name
            if p.exists():
                return p
    return None


def _link_root(runtime: pathlib.Path) -> pathlib.Path:
    """A folder whose lib/ holds libamdhip64.so and libhiprtc.so, both linking `runtime`
    (Debian's libamdhip64 exports hiprtc as well)."""
    lib = cache_dir() / "toolchain" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    target = runtime.resolve()
    for name in ("libamdhip64.so", "libhiprtc.so"):
        link = lib / name
        if link.is_symlink() and link.resolve() == target:
            continue
        tmp = lib / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)
    return lib.parent


_LINKED: list[str] = [""]     # the $ROCM_PATH set here for hip-python, if any


def _configure() -> tuple[pathlib.Path, pathlib.Path]:
    """(root, runtime library), setting $ROCM_PATH for hip-python when it was not set."""
    configured = os.environ.get(ENV)
    if configured:
        root = pathlib.Path(configured)
        runtime = root / "lib" / "libamdhip64.so"
        if not runtime.exists():
            raise DeviceUnavailable(f"${ENV}={configured} has no lib/libamdhip64.so")
        return root, runtime
    runtime = _find_runtime()
    if runtime is None:
        raise DeviceUnavailable(
            "no HIP runtime library (libamdhip64.so) found in " + ", ".join(LIB_DIRS)
            + f" and ${ENV} is not set; install ROCm, or on Debian `apt-get install hipcc`")
    root = runtime.parent.parent
    if not (root / "lib" / "libhiprtc.so").exists() or root / "lib" != runtime.parent:
        root = _link_root(runtime)
    os.environ[ENV] = _LINKED[0] = str(root)
    return root, runtime


@functools.cache
def locate() -> Toolchain:
    """The HIP toolchain hip-python will use (DeviceUnavailable when there is none)."""
    root, runtime = _configure()
    try:
        hip = require_package("hip.hip", "hip-python")
    except MissingPackage as e:
        raise DeviceUnavailable(str(e)) from None
    try:
        err, version = hip.hipRuntimeGetVersion()
    except Exception as e:  # noqa: BLE001 - a library that fails to load raises
        raise DeviceUnavailable(f"the HIP runtime in {root} does not load: {e}") from None
    if err != hip.hipError_t.hipSuccess:
        raise DeviceUnavailable(f"hipRuntimeGetVersion failed: {err.name}")
    return Toolchain(root, runtime.resolve(), int(version))


# -- which targets the toolchain builds ----------------------------------------------
PROBE_SOURCE = 'extern "C" __global__ void poot_probe(float* x) { x[threadIdx.x] = 1.0f; }'

_PROBE = """\
import sys
from hip import hiprtc
err, prog = hiprtc.hiprtcCreateProgram(sys.argv[2].encode(), b"probe.hip", 0, None, None)
opts = [b"--offload-arch=" + sys.argv[1].encode()]
(err,) = hiprtc.hiprtcCompileProgram(prog, len(opts), opts)
err2, size = hiprtc.hiprtcGetCodeSize(prog)
print("POOT-PROBE", int(err), int(size))
"""


def _probe_file(tc: Toolchain) -> pathlib.Path:
    return cache_dir() / f"targets-{tc.version}.json"


def buildable(gfx: str) -> tuple[bool, str]:
    """(whether hiprtc builds code for `gfx`, why not). Asked in a child process once per
    toolchain and target, then read from $POOT_CACHE/rocm/targets-<version>.json."""
    tc = locate()
    path = _probe_file(tc)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if gfx in known:
        return tuple(known[gfx])
    env = dict(os.environ, ROCM_PATH=str(tc.root))
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, gfx, PROBE_SOURCE], env=env,
                           capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        answer = (False, f"hiprtc did not finish a one-line kernel for {gfx} in 120 s")
    else:
        words = r.stdout.split()
        if r.returncode == 0 and words[:1] == ["POOT-PROBE"] and words[1:] == ["0", words[2]] \
                and int(words[2]) > 0:
            answer = (True, "")
        elif r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
            answer = (False, f"hiprtc crashed compiling for {gfx} (exit {r.returncode}: "
                             f"{tail})")
        else:
            answer = (False, f"hiprtc refused {gfx}: {r.stdout.strip()}")
    known[gfx] = list(answer)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return answer


def require(gfx: str) -> Toolchain:
    """The toolchain, after checking it builds `gfx` (UnsupportedTarget otherwise)."""
    tc = locate()
    ok, why = buildable(gfx)
    if not ok:
        raise UnsupportedTarget(f"the installed HIP toolchain, {tc}, cannot build code for "
                                f"{gfx}: {why}. A newer ROCm is needed for this target",
                                backend="rocm", device=gfx)
    return tc


# -- hipcc ------------------------------------------------------------------------------
def hipcc() -> str:
    """The hipcc driver's path (DeviceUnavailable when not installed)."""
    path = shutil.which("hipcc") or (
        "/opt/rocm/bin/hipcc" if os.path.exists("/opt/rocm/bin/hipcc") else None)
    if path is None:
        raise DeviceUnavailable("hipcc is not installed (Debian: apt-get install hipcc)")
    return path


def hipcc_env() -> dict:
    """hipcc's environment: always the AMD platform (with CUDA installed, hipcc would
    otherwise hand the source to nvcc), and without the $ROCM_PATH set here for
    hip-python (a folder of two links; hipcc reads $ROCM_PATH for its whole tree)."""
    env = dict(os.environ, HIP_PLATFORM="amd", HIP_COMPILER="clang")
    if _LINKED[0] and env.get(ENV) == _LINKED[0]:
        del env[ENV]
    return env
