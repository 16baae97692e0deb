"""The reference backend: the oracle, registered through the same seam as any backend.

It declares everything: every dtype for every use, every op key for every
dtype, and the packed ops for every registered packed format. It is the embedded default when no
GPU backend is installed. Its runtime (runtime.py) runs plans with numpy.
"""
from __future__ import annotations

from poot.backends.reference.runtime import ReferenceRuntime
from poot.builtin_formats import FORMATS
from poot.capability import PACKED_KEYS, CapabilityTable, Use, every_op_key
from poot.contract import Backend, Device, hookimpl
from poot.dtypes import DType
from poot.formats import formats


#: declared (their conformance cases run here) but not formed by compile: FreshKVAttention
#: exists to shorten a GPU's chain of dependent kernels, and its definition reads each cache
#: as a written copy, so inlined here it would copy both caches of every layer each step
NOT_ELECTED = frozenset({"FreshKVAttention"})


class ReferenceBackend(Backend):
    name = "reference"
    priority = 0
    language = "numpy"
    inlines_composites = True    # its composites are exactly their definitions

    def __init__(self):
        self._tables: dict = {}

    def probe(self):
        return [Device(self.name, 0, "numpy oracle (CPU)")]

    def capabilities(self, device):
        """The full table, built once per device and set of registered formats (the
        planner asks for it once per eqn)."""
        packed = frozenset(formats())
        key = (device.id, packed)
        table = self._tables.get(key)
        if table is None:
            dtypes = frozenset(DType)
            table = self._tables[key] = CapabilityTable(
                backend=self.name, device=device.id,
                dtypes={d: Use.all() for d in DType},
                ops={k: packed if k in PACKED_KEYS else dtypes for k in every_op_key()},
                notes={"all": "the oracle evaluates every op; composites through their "
                                "definition"},
                unelected=NOT_ELECTED)
        return table

    def runtime(self, device):
        return ReferenceRuntime(device)

    def tensor_parallel_group(self, ranks: int):
        """Ranks as threads of this process, over host arrays (poot.parallel.local)."""
        from poot.parallel.local import LocalGroup

        return LocalGroup(ranks)


BACKEND = ReferenceBackend()


@hookimpl
def poot_backends():
    return [BACKEND]


@hookimpl
def poot_weight_formats():
    return FORMATS
