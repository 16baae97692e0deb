"""The backend device under test: resolved once per session from --poot-backend."""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from poot.capability import CapabilityTable
from poot.contract import Backend, Device
from poot.errors import DeviceUnavailable, PootError

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

    def rerun(self, case_id: str | None = None) -> str:
        """The command that reruns one case (or the whole suite) with this seed, verbose."""
        dev = f" --device {self.device.index}" if self.device.index else ""
        only = f" -k '{case_id}'" if case_id else ""
        return f"poot conformance {self.backend.name} --seed {self.seed}{dev}{only} -- -v"

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
    backend = plugin.get_backend(name)
    devices, why = plugin.probe(backend)  # a probe that raises is reported, not a crash
    if not devices:
        raise DeviceUnavailable(f"backend {name} has no device: {why}")
    if not 0 <= device_index < len(devices):
        raise DeviceUnavailable(f"backend {name} has {len(devices)} device(s); "
                                f"there is no device {device_index}")
    device = devices[device_index]
    try:
        table = backend.capabilities(device)
    except Exception as exc:  # a usage error with the reason, never an INTERNALERROR
        raise PootError(f"backend {name}: capabilities({device.id}) raised "
                        f"{type(exc).__name__}: {exc}") from None
    return Target(backend, device, table, seed)


__all__ = ["Target", "resolve", "DEFAULT_SEED"]
