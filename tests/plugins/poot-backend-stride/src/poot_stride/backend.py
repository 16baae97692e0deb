"""The stride backend: movement, data, select, cast and F32 contraction ops, run by its
own numpy kernels that read their operands through strided views (so a Transpose or a
Slice feeding them costs no copy)."""
from __future__ import annotations

from poot.capability import CapabilityTable, Use, op_keys
from poot.contract import Backend, Device, Lowering
from poot.dtypes import DType

from poot_stride import kernels

F32, F16, I32 = DType.F32, DType.F16, DType.I32
MOVES = ["Broadcast", "Transpose", "Slice", "Concat", "Gather", "ScatterUpdate",
         "DynamicUpdateSlice", "Select"]
ARITH = [f"Binary.{n}" for n in ("Add", "Sub", "Mul", "Max")]


class StrideBackend(Backend):
    name = "stride"
    priority = -2          # an example: never picked unless asked for by name
    language = "numpy"     # host kernels: constant eqns fold on the host at bind time

    def __init__(self):
        self._tables: dict[str, CapabilityTable] = {}

    def probe(self):
        return [Device(self.name, 0, "strided numpy kernels (CPU)")]

    def capabilities(self, device):
        table = self._tables.get(device.id)
        if table is None:
            table = self._tables[device.id] = CapabilityTable.declare(
                self.name, device.id,
                dtypes={F32: Use.all(), I32: Use.STORAGE | Use.CONVERT | Use.ARITH,
                        F16: Use.STORAGE | Use.CONVERT},
                ops={**{k: [F32, I32] for k in MOVES + op_keys(*ARITH)},
                     "Cast": [F32, F16, I32], "MatMul": [F32]},
                notes={"f16": "f16 is stored and converted only: no f16 arithmetic",
                       "MatMul:i32": "contractions are F32 only"})
        return table

    def lower(self, eqn, graph, device):
        key = super().lower(eqn, graph, device).kernel   # the table's typed refusal
        return Lowering(f"stride.{key.lower()}", program=kernels.for_op(eqn.op),
                        strided_inputs=True)

    def runtime(self, device):
        from poot_stride.runtime import StrideRuntime

        return StrideRuntime(device)
