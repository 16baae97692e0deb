"""Finding ROCm devices without ever hanging or crashing: no library, no device and
no driver each give a reason ("no ROCm device: ...") instead of an exception."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from poot.errors import PootError
from poot.optional import require


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    arch: str             # gcnArchName, e.g. gfx90a:sramecc+:xnack-
    wavefront: int
    lds_bytes: int        # sharedMemPerBlock
    total_bytes: int


def _text(value) -> str:
    raw = bytes(value) if not isinstance(value, str) else value.encode()
    return raw.split(b"\0", 1)[0].decode(errors="replace")


@functools.cache
def probe() -> tuple[tuple[GpuInfo, ...], str | None]:
    """(devices, None), or ((), "no ROCm device: <reason>"). Cached per process."""
    from poot_rocm.toolchain import locate

    try:
        locate()
        hip = require("hip.hip", "hip-python")
    except (PootError, ImportError) as e:
        return (), f"no ROCm device: {e}"
    try:
        err, count = hip.hipGetDeviceCount()
    except Exception as e:  # noqa: BLE001 - a runtime that fails to load raises
        return (), f"no ROCm device: hipGetDeviceCount failed: {type(e).__name__}: {e}"
    if err != hip.hipError_t.hipSuccess or count == 0:
        return (), f"no ROCm device: hipGetDeviceCount gave {count} ({err.name})"
    found = []
    for i in range(count):
        err, p = hip.hipGetDeviceProperties(i)
        if err != hip.hipError_t.hipSuccess:
            return (), f"no ROCm device: hipGetDeviceProperties({i}) gave {err.name}"
        found.append(GpuInfo(i, _text(p.name), _text(p.gcnArchName), int(p.warpSize),
                             int(p.sharedMemPerBlock), int(p.totalGlobalMem)))
    return tuple(found), None
