"""Capability tables: what one backend can do on one device, declared, never guessed.

A table answers "can this device run this eqn" without trying. For each dtype
it lists the uses the device supports (storage, conversion, arithmetic, dot
product); for each op (and each Unary/Binary/Reduce sub-op) the dtypes it
lowers; for packed ops, the formats. `check` raises the typed refusal that
names op, dtype, backend and device; compile consults `allows` before it
rewrites, and the planner calls `check` on every eqn before anything runs.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from poot.dtypes import DType
from poot.errors import DtypeLowering, LoweringError, UnsupportedOp
from poot.ir import ops as O
from poot.ir.types import TensorType


class Use(enum.Flag):
    NONE = 0
    STORAGE = enum.auto()      # buffers of this dtype can be held and copied
    CONVERT = enum.auto()      # Cast to and from F32
    ARITH = enum.auto()        # elementwise arithmetic in this dtype
    DOT = enum.auto()          # contraction operands (MatMul, Attention, dense weights)

    @classmethod
    def all(cls) -> "Use":
        return cls.STORAGE | cls.CONVERT | cls.ARITH | cls.DOT


def op_key(op: O.OpKind) -> str:
    """The table key of an op: "Binary.Add", "Unary.Exp", "Reduce.Max", or the op name."""
    sub = getattr(op, "op", None)
    return f"{op.name}.{sub.name}" if sub is not None and hasattr(sub, "name") else op.name


def primary_dtype(op: O.OpKind, ins: Sequence[TensorType], out: TensorType) -> DType | str:
    """The dtype (or packed format name) that decides whether a device lowers this eqn."""
    if isinstance(op, (O.PackedDequant, O.PackedContraction, O.PackedRowGather,
                       O.IndexedPackedContraction)):
        return op.weight.format
    if isinstance(op, O.Select):
        return ins[1].dtype
    if isinstance(op, (O.Binary, O.Unary, O.Reduce, O.ArgTopK, O.MatMul, O.IndexedMatMul,
                       O.Attention, O.SelectedAttention, O.Rope, O.BlockTopK)):
        return ins[0].dtype
    if isinstance(op, (O.Gather, O.ScatterUpdate, O.DynamicUpdateSlice, O.Broadcast, O.Reshape,
                       O.Transpose, O.Slice, O.Concat, O.AllReduce, O.AllGather)):
        return ins[0].dtype
    if isinstance(op, (O.DenseContraction, O.GroupedDenseContraction)):
        return ins[1].dtype
    if isinstance(op, O.DenseRowGather):
        return ins[0].dtype
    return out.dtype


@dataclass
class CapabilityTable:
    """One device's declaration. `ops` maps an op key to the dtypes (or formats) it lowers."""

    backend: str
    device: str
    dtypes: dict[DType, Use]
    ops: dict[str, frozenset]
    limits: dict[str, int] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    # -- queries -------------------------------------------------------------------
    def uses(self, dtype: DType) -> Use:
        return self.dtypes.get(dtype, Use.NONE)

    def refusal(self, op: O.OpKind, ins: Sequence[TensorType],
                out: TensorType) -> LoweringError | None:
        """The typed error this eqn would get, or None when the table declares it."""
        where = dict(backend=self.backend, device=self.device)
        key = op_key(op)
        if key not in self.ops and op.name not in self.ops:
            return UnsupportedOp(f"{self.backend} does not lower {key}", op=key, **where)
        for t in list(ins) + [out]:
            if Use.STORAGE not in self.uses(t.dtype):
                return DtypeLowering(f"{t.dtype} tensors cannot be stored on this device",
                                     op=key, dtype=str(t.dtype), **where)
        if isinstance(op, O.Cast):
            for d in (ins[0].dtype, op.to):
                if d is not DType.F32 and Use.CONVERT not in self.uses(d):
                    return DtypeLowering(f"no conversion between {ins[0].dtype} and {op.to}",
                                         op=key, dtype=str(d), **where)
        dt = primary_dtype(op, ins, out)
        allowed = self.ops.get(key, self.ops.get(op.name, frozenset()))
        if dt not in allowed:
            reason = self.notes.get(f"{key}:{dt}") or self.notes.get(str(dt)) or \
                "not declared in its capability table"
            return DtypeLowering(f"{key} on {dt}: {reason}", op=key, dtype=str(dt), **where)
        for region_op, r_ins, r_out in _region_eqns(op):
            err = self.refusal(region_op, r_ins, r_out)
            if err is not None:
                return err
        return None

    def allows(self, op: O.OpKind, ins: Sequence[TensorType], out: TensorType) -> bool:
        return self.refusal(op, ins, out) is None

    def check(self, op: O.OpKind, ins: Sequence[TensorType], out: TensorType) -> None:
        err = self.refusal(op, ins, out)
        if err is not None:
            raise err

    def summary(self) -> str:
        """A few lines for `poot backends`."""
        dts = ", ".join(f"{d}:{_uses(u)}" for d, u in self.dtypes.items() if u)
        return (f"dtypes {dts}\n"
                f"ops {len(self.ops)} ({', '.join(sorted(k for k in self.ops if '.' not in k))})")

    def to_markdown(self) -> str:
        """The support matrix: one row per op key, one column per dtype."""
        cols = [d for d in DType if self.uses(d)]
        fmts = sorted({x for v in self.ops.values() for x in v if isinstance(x, str)})
        head = "| op | " + " | ".join(map(str, cols + fmts)) + " |"
        lines = [f"# {self.backend} on {self.device}", "", head,
                 "|" + "---|" * (len(cols) + len(fmts) + 1)]
        for k in sorted(self.ops):
            v = self.ops[k]
            lines.append(f"| {k} | " + " | ".join("yes" if c in v else "-" for c in cols + fmts)
                         + " |")
        lines += ["", "| dtype | uses |", "|---|---|"]
        lines += [f"| {d} | {_uses(u)} |" for d, u in self.dtypes.items()]
        if self.notes:
            lines += ["", "Notes:"] + [f"- {k}: {v}" for k, v in sorted(self.notes.items())]
        return "\n".join(lines) + "\n"


def _uses(u: Use) -> str:
    return "+".join(m.name.lower() for m in Use if m and m in u and m is not Use.NONE) or "none"


def _region_eqns(op: O.OpKind) -> Iterable[tuple[O.OpKind, list, TensorType]]:
    """Every eqn inside a fused region's body (and an epilogue's head), for checking."""
    body = getattr(op, "body", None)
    if isinstance(op, O.ContractionEpilogue):
        pass  # the head is checked by its own key through the composite's dtype
    if body is None or isinstance(op, O.Scan):
        return ()
    from poot.ir.graph import Lit

    out = []
    for e in body.eqns():
        ins = [x.type if isinstance(x, Lit) else body.type_of(x.id) for x in e.inputs]
        out.append((e.op, ins, body.type_of(e.out)))
    return out


def every_op_key() -> list[str]:
    """All op keys a table may declare (sub-ops expanded)."""
    keys = []
    for name, cls in O.ALL_OPS.items():
        if cls is O.Unary:
            keys += [f"Unary.{u.name}" for u in O.UnaryOp]
        elif cls is O.Binary:
            keys += [f"Binary.{b.name}" for b in O.BinaryOp]
        elif cls is O.Reduce:
            keys += [f"Reduce.{r.name}" for r in O.ReduceOp]
        else:
            keys.append(name)
    return keys
