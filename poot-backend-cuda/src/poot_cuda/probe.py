"""Finding CUDA devices without ever hanging: cuInit raises when there is no driver."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from poot.errors import MissingPackage
from poot.optional import require

from poot_cuda.capability import arch_of


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    major: int
    minor: int
    total_bytes: int

    @property
    def arch(self) -> str:
        return arch_of(self.major, self.minor)


@functools.cache
def probe() -> tuple[tuple[GpuInfo, ...], str | None]:
    """(devices, None), or ((), "no CUDA device: <reason>"). Cached per process."""
    try:
        cu = require("cuda.bindings.driver", "cuda-bindings")
    except MissingPackage as e:
        return (), f"no CUDA device: {e}"
    try:
        (err,) = cu.cuInit(0)
    except Exception as e:  # noqa: BLE001 - no libcuda raises (DynamicLibNotFoundError, ...)
        return (), f"no CUDA device: cuInit failed: {type(e).__name__}: {e}"
    if err != cu.CUresult.CUDA_SUCCESS:
        return (), f"no CUDA device: cuInit returned {err.name}"
    err, count = cu.cuDeviceGetCount()
    if err != cu.CUresult.CUDA_SUCCESS or count == 0:
        return (), f"no CUDA device: cuDeviceGetCount gave {count} ({err.name})"
    found = []
    for i in range(count):
        _, dev = cu.cuDeviceGet(i)
        _, raw = cu.cuDeviceGetName(64, dev)
        attr = cu.CUdevice_attribute
        _, major = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        _, total = cu.cuDeviceTotalMem(dev)
        name = raw.split(b"\0", 1)[0].decode(errors="replace")
        found.append(GpuInfo(i, name, int(major), int(minor), int(total)))
    return tuple(found), None
