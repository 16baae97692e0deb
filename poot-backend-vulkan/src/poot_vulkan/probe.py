"""Which Vulkan devices poot would use here, or why there are none. Never raises."""
from __future__ import annotations

from dataclasses import dataclass

from poot.errors import DeviceUnavailable

from poot_vulkan.device import DeviceFacts


@dataclass(frozen=True)
class ProbeResult:
    devices: tuple[DeviceFacts, ...]
    reason: str = ""

    @property
    def available(self) -> bool:
        return bool(self.devices)

    def __str__(self) -> str:
        return "; ".join(d.describe() for d in self.devices) if self.devices else self.reason


def probe() -> ProbeResult:
    """The ranked devices of the process's Vulkan instance, or the reason there are none."""
    from poot_vulkan.device import physical_devices

    try:
        found = tuple(physical_devices())
    except DeviceUnavailable as e:
        return ProbeResult((), str(e))
    except Exception as e:  # a broken driver must not take `poot backends` down
        return ProbeResult((), f"no Vulkan device: {type(e).__name__}: {e}")
    if not found:
        return ProbeResult((), "no Vulkan device: the loader found no device with Vulkan 1.2")
    return ProbeResult(found)
