"""The host's HIP compiler driver on printed sources: `hipcc --genco` to a code-object
bundle, always with HIP_PLATFORM=amd (with CUDA installed, hipcc would hand the source
to nvcc otherwise). CI uses it as a second, independent compiler of what hiprtc builds.
"""
from __future__ import annotations

import pathlib
import subprocess
import tempfile

from poot_rocm.archs import Target
from poot_rocm.codeobject import CodeObject, read
from poot_rocm.compiler import CompileError, options
from poot_rocm.toolchain import hipcc, hipcc_env


def genco(source: str, t: Target, timeout: float = 600) -> list[CodeObject]:
    """Compile one translation unit for `t` with hipcc and read back its code objects."""
    with tempfile.TemporaryDirectory(prefix="poot-hipcc-") as d:
        src, out = pathlib.Path(d, "unit.hip"), pathlib.Path(d, "unit.hsaco")
        src.write_text(source)
        flags = [o for o in options(t) if o != "-std=c++17"] + ["-std=c++17"]
        r = subprocess.run([hipcc(), "--genco", *flags, str(src), "-o", str(out)],
                           env=hipcc_env(), capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise CompileError(f"hipcc --genco failed for {t} (exit {r.returncode}):\n"
                               f"{(r.stderr or r.stdout).strip()[-4000:]}", backend="rocm",
                               device=t.name)
        return read(out.read_bytes())
