"""The backend device under test: resolved once per session from --poot-backend."""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from poot.backend import Backend, Device, get_backend
from poot.capability import CapabilityTable
from poot.errors import DeviceUnavailable

DEFAULT_SEED = 20261129


@dataclass
class Target:
    backend: Backend
    device: Device
    table: CapabilityTable
    seed: int = DEFAULT_SEED
    _runtime: object = field(default=None, repr=False)

    @property
    def runtime(self):
        """One runtime for the whole session (a GPU runtime's set-up is paid once)."""
        if self._runtime is None:
            self._runtime = self.backend.runtime(self.device)
        return self._runtime

    def rng(self, case_id: str) -> np.random.Generator:
        """The case's own stream: reproducible from (seed, case id), independent of order."""
        return np.random.default_rng([self.seed, zlib.crc32(case_id.encode())])

    def declares(self, graph) -> bool:
        return not self.table.graph_refusals(graph)

    def __str__(self) -> str:
        return f"{self.backend.name} on {self.device}"


def resolve(name: str, device_index: int = 0, seed: int = DEFAULT_SEED) -> Target:
    """The named installed backend's device; DeviceUnavailable (with the probe's reason)
    when it has none, UnknownBackend (listing the installed ones) for a wrong name."""
    from poot import plugin
    from poot.conformance import roles

    plugin.register(roles, name="poot.conformance.roles")
    backend = get_backend(name)
    devices = backend.probe()
    if not devices:
        raise DeviceUnavailable(f"backend {name} has no device: "
                                f"{backend.unavailable_reason() or 'no reason given'}")
    if not 0 <= device_index < len(devices):
        raise DeviceUnavailable(f"backend {name} has {len(devices)} device(s); "
                                f"there is no device {device_index}")
    device = devices[device_index]
    return Target(backend, device, backend.capabilities(device), seed)


__all__ = ["Target", "resolve", "DEFAULT_SEED"]
