"""Which wgpu device poot would use here, or why there is none. Never raises."""
from __future__ import annotations

from dataclasses import dataclass

from poot.errors import DeviceUnavailable

from poot_wgpu.device import AdapterInfo


@dataclass(frozen=True)
class ProbeResult:
    devices: tuple[AdapterInfo, ...]
    reason: str = ""

    @property
    def available(self) -> bool:
        return bool(self.devices)

    def __str__(self) -> str:
        if not self.devices:
            return self.reason
        return "; ".join(d.describe() for d in self.devices)


def probe() -> ProbeResult:
    """Open the process's device (cached) and report its adapter, or the reason it failed."""
    from poot_wgpu.device import open_device

    try:
        dev = open_device()
    except DeviceUnavailable as e:
        return ProbeResult((), str(e))
    return ProbeResult((dev.info,))
