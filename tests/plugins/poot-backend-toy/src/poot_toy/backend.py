"""The toy backend: a deliberately partial table (F32 elementwise and reductions only)."""
from __future__ import annotations

from poot.capability import CapabilityTable, Use, op_keys
from poot.contract import Backend, Device, Lowering
from poot.dtypes import DType

from poot_toy.kernels import BINARY, UNARY, kernel_for

#: what the toy lowers: the Unary and Binary ops it has kernels for, both reductions (a
#: sub-op added to the IR later is not claimed until the toy has a kernel for it)
DECLARED = ([f"Unary.{k}" for k in UNARY] + [f"Binary.{k}" for k in BINARY]
            + op_keys("Reduce"))


class ToyBackend(Backend):
    name = "toy"
    priority = -1          # never picked over the reference unless asked for by name
    language = "toy-numpy"

    def probe(self):
        return [Device(self.name, 0, "toy numpy kernels (CPU)")]

    def capabilities(self, device):
        return CapabilityTable.declare(
            self.name, device.id, dtypes={DType.F32: Use.STORAGE | Use.ARITH},
            ops={k: [DType.F32] for k in DECLARED},
            notes={"f16": "the toy computes in float32 only"})

    def lower(self, eqn, graph, device):
        super().lower(eqn, graph, device)   # the table's typed refusal, before anything runs
        family, name = type(eqn.op).__name__, eqn.op.op.name
        return Lowering(f"toy.{name.lower()}", program=kernel_for(family, name, eqn.op))

    def runtime(self, device):
        from poot_toy.runtime import ToyRuntime

        return ToyRuntime(device)
