"""Capability tables: what one backend can do on one device, declared, never guessed.

A table answers "can this device run this eqn" without trying. It has two parts:

- `dtypes`: for each dtype, the uses the device supports (`Use`): STORAGE (hold and
  copy buffers), CONVERT (Cast to and from F32), ARITH (elementwise arithmetic,
  reductions, selects), DOT (contraction operands: MatMul, Attention, dense weights).
- `ops`: for each op key ("Binary.Add", "Unary.Exp", "Reduce.Max", "Select",
  "MatMul", "Fused", "PackedContraction", ...; `every_op_key()` lists them) the
  dtypes it lowers; for packed ops, the packed format names ("gguf:Q4_K").

An eqn is allowed when its op key is declared, every operand and the result can be
stored, its deciding dtype (`primary_dtype`) is in the op's set and has the use the
op needs, and, for a region (Fused, FusedRow, ContractionEpilogue), every eqn of
its body (and the epilogue's head) is allowed too. `refusal` returns the typed
error otherwise (UnsupportedOp, DtypeLowering, LimitExceeded), naming op, dtype,
backend and device; `check` raises it. compile consults `allows` before it
rewrites; the planner calls `Backend.lower` (which calls `check`) on every eqn
before anything runs. A backend never emulates what its table does not declare.

Build a table with `CapabilityTable.declare(...)`, which checks the keys:

    CapabilityTable.declare("toy", "toy:0",
        dtypes={DType.F32: Use.all()},
        ops={k: {DType.F32} for k in op_keys("Unary", "Binary", "Reduce")},
        notes={"Select:f16": "OpSelect has no 16-bit float form here"})

Declared is not elected. Every declared key lowers: conformance runs its cases and the
support matrix lists it. `unelected` names the declared composites compile does not rewrite
graphs into by default on this device (a fusion that measured slower there); a pass forms
one only where the compile policy asks for it (`Policy.fuse`). Every other declared key is
elected: compile forms it wherever it matches.

A backend that prints poot's kernel programs declares no op list of its own: its table is
the shared lowerings' declaration on its device facts (`poot.codegen.coverage.kernel_table`).
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from poot.dtypes import DType
from poot.errors import DtypeLowering, LimitExceeded, LoweringError, PootError, UnsupportedOp
from poot.ir import ops as O
from poot.ir.graph import Lit
from poot.ir.types import TensorType


class Use(enum.Flag):
    NONE = 0
    STORAGE = enum.auto()      # buffers of this dtype can be held and copied
    CONVERT = enum.auto()      # Cast to and from F32
    ARITH = enum.auto()        # elementwise arithmetic, reductions, selects in this dtype
    DOT = enum.auto()          # contraction operands (MatMul, Attention, dense weights)

    @classmethod
    def all(cls) -> Use:
        return cls.STORAGE | cls.CONVERT | cls.ARITH | cls.DOT


def op_key(op: O.OpKind) -> str:
    """The table key of an op: "Binary.Add", "Unary.Exp", "Reduce.Max", or the op name."""
    sub = getattr(op, "op", None)
    return f"{op.name}.{sub.name}" if sub is not None and hasattr(sub, "name") else op.name


def primary_dtype(op: O.OpKind, ins: Sequence[TensorType], out: TensorType) -> DType | str:
    """The dtype (or packed format name) that decides whether a device lowers this eqn,
    as the op's class declares it (`OpKind.deciding`): Select its branches' dtype; dense
    contractions the weight's; attentions their keys' (so "Attention" on F16 is attention
    over f16 keys and values, whether the query is f16 or f32); packed ops the format name; Cast its source; regions and
    generators the result's."""
    if op.deciding == "format":
        return op.weight.format
    if op.deciding in ("branches", "weight", "kv"):
        return ins[1].dtype
    if op.deciding == "operand":
        return ins[0].dtype
    return out.dtype


def _needed_use(op: O.OpKind) -> Use:
    """The use of its deciding dtype the op needs (`OpKind.needs`)."""
    return Use[op.needs.upper()]


def op_keys(*families: str) -> list[str]:
    """The op keys of whole families: op_keys("Binary") is every Binary.<op> key;
    a plain op name ("Select") gives itself. Unknown names are a PootError."""
    every = every_op_key()
    out = []
    for fam in families:
        got = [k for k in every if k == fam or k.startswith(fam + ".")]
        if not got:
            raise PootError(f"unknown op family {fam!r}; op keys are: {', '.join(every)}")
        out += got
    return out


@dataclass
class CapabilityTable:
    """One device's declaration. `ops` maps an op key to the dtypes (or formats) it lowers.

    `limits` may hold "max_buffer_bytes" (the largest tensor one binding may hold);
    `notes` maps "<op key>:<dtype>", "<op key>" or "<dtype>" to the reason a refusal
    gives ("OpSelect has no 16-bit float form in SPIR-V"). `unelected`: declared keys
    compile forms only where the policy asks (module docstring).
    """

    backend: str
    device: str
    dtypes: dict[DType, Use]
    ops: dict[str, frozenset]
    limits: dict[str, int] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    unelected: frozenset[str] = frozenset()

    @classmethod
    def declare(cls, backend: str, device: str, dtypes: Mapping[DType, Use],
                ops: Mapping[str, Iterable], limits: Mapping[str, int] | None = None,
                notes: Mapping[str, str] | None = None,
                unelected: Iterable[str] = ()) -> CapabilityTable:
        """A table from plain mappings, with every op key checked (a typo is a PootError,
        not a silently undeclared op; an unelected key must be declared)."""
        known = set(every_op_key())
        bad = sorted(k for k in ops if k not in known)
        if bad:
            raise PootError(f"{backend}: unknown op keys {bad}; see poot.capability.every_op_key()")
        unelected = frozenset(unelected)
        if not unelected <= set(ops):
            raise PootError(f"{backend}: {sorted(unelected - set(ops))} are unelected but not "
                            f"declared (only a key it lowers can be left unelected)")
        return cls(backend, device, {DType.parse(d): u for d, u in dtypes.items()},
                   {k: frozenset(map(_entry, v)) for k, v in ops.items()},
                   dict(limits or {}), dict(notes or {}), unelected)

    def with_communicator(self, communicator) -> CapabilityTable:
        """This table with AllReduce and AllGather declared over the communicator's group
        (poot.contract.Communicator) for the dtypes it moves; a table without one refuses
        them."""
        from dataclasses import replace

        dts = frozenset(communicator.dtypes)
        return replace(self, ops={**self.ops, "AllReduce": dts, "AllGather": dts},
                       limits={**self.limits, "ranks": communicator.ranks})

    # -- queries -------------------------------------------------------------------
    def uses(self, dtype: DType) -> Use:
        return self.dtypes.get(dtype, Use.NONE)

    def lowers(self, key: str) -> frozenset:
        """The dtypes and formats declared for an op key (empty when not declared)."""
        return self.ops.get(key, frozenset())

    def _reason(self, key: str, dt) -> str:
        return (self.notes.get(f"{key}:{dt}") or self.notes.get(key) or self.notes.get(str(dt))
                or "not declared in its capability table")

    def refusal(self, op: O.OpKind, ins: Sequence[TensorType],
                out: TensorType) -> LoweringError | None:
        """The typed error this eqn would get, or None when the table declares it."""
        where = dict(backend=self.backend, device=self.device)
        key = op_key(op)
        if key not in self.ops:
            return UnsupportedOp(f"{self.backend} does not lower {key}: {self._reason(key, '')}",
                                 op=key, **where)
        ranks = getattr(op, "ranks", None)
        group = self.limits.get("ranks", 1)
        if key in self.ops and isinstance(op, O.COLLECTIVES) and ranks != group:
            why = f"the runtime's communicator has {group}" if "ranks" in self.limits else \
                "no communicator (one rank only)"
            return UnsupportedOp(f"{key} over {ranks} ranks: {why}", op=key, **where)
        for t in list(ins) + [out]:
            if Use.STORAGE not in self.uses(t.dtype):
                return DtypeLowering(f"{key}: {t.dtype} tensors cannot be stored on this device "
                                     f"({self._reason(key, t.dtype)})", op=key,
                                     dtype=str(t.dtype), **where)
        limit = self.limits.get("max_buffer_bytes")
        for t in list(ins) + [out]:
            if limit is not None and t.nbytes > limit:
                return LimitExceeded(f"{key}: a {t} tensor ({t.nbytes} bytes) exceeds the "
                                     f"{limit}-byte binding limit", op=key, dtype=str(t.dtype),
                                     **where)
        if isinstance(op, O.Cast):
            for d in (ins[0].dtype, op.to):
                if d is not DType.F32 and Use.CONVERT not in self.uses(d):
                    return DtypeLowering(f"Cast: no conversion between {ins[0].dtype} and "
                                         f"{op.to}", op=key, dtype=str(d), **where)
        dt = primary_dtype(op, ins, out)
        if dt not in self.lowers(key):
            return DtypeLowering(f"{key} on {dt}: {self._reason(key, dt)}", op=key,
                                 dtype=str(dt), **where)
        need = _needed_use(op)
        if isinstance(dt, DType) and need not in self.uses(dt):
            return DtypeLowering(f"{key} on {dt}: the device has no {need.name.lower()} use of "
                                 f"{dt} ({self._reason(key, dt)})", op=key, dtype=str(dt),
                                 **where)
        for inner, r_ins, r_out in region_eqns(op, ins):
            err = self.refusal(inner, r_ins, r_out)
            if err is not None:  # the inner message, without its "[op=..., ...]" tail
                inner_msg = str(err).rsplit(" [op=", 1)[0]
                return type(err)(f"inside {key}: {inner_msg}", op=err.op, dtype=err.dtype,
                                 **where)
        return None

    def unelected_key(self, op: O.OpKind, ins: Sequence[TensorType],
                      asked: Iterable[str] = ()) -> str | None:
        """The key of a declared but unelected composite that `op` is or lowers with it (a
        ContractionEpilogue's or GatedContraction's normed head), unless `asked` names it;
        None when compile may form `op` by default."""
        key = op_key(op)
        if key in self.unelected and key not in asked:
            return key
        for inner, r_ins, _ in region_eqns(op, ins):
            got = self.unelected_key(inner, r_ins, asked)
            if got is not None:
                return got
        return None

    def allows(self, op: O.OpKind, ins: Sequence[TensorType], out: TensorType) -> bool:
        return self.refusal(op, ins, out) is None

    def check(self, op: O.OpKind, ins: Sequence[TensorType], out: TensorType) -> None:
        err = self.refusal(op, ins, out)
        if err is not None:
            raise err

    def check_eqn(self, eqn, graph) -> str:
        """`check` one eqn of `graph`; returns its op key (what `Backend.lower` names)."""
        self.check(eqn.op, operand_types(graph, eqn), graph.type_of(eqn.out))
        return op_key(eqn.op)

    def graph_refusals(self, graph) -> list[tuple[object, LoweringError]]:
        """Every (eqn, error) of a graph this device refuses, in order (empty: it plans)."""
        out = []
        for e in graph.eqns():
            err = self.refusal(e.op, operand_types(graph, e), graph.type_of(e.out))
            if err is not None:
                out.append((e, err))
        return out

    # -- printing --------------------------------------------------------------------
    def summary(self) -> str:
        """A few lines for `poot backends`: dtype uses, then how many op keys per family."""
        dts = ", ".join(f"{d}:{_uses(u)}" for d, u in self.dtypes.items() if u)
        fams: dict[str, list[str]] = {}
        for k in sorted(self.ops):
            fams.setdefault(k.split(".")[0], []).append(k)
        total = {f: sum(1 for k in every_op_key() if k.split(".")[0] == f) for f in fams}
        parts = [f"{f} {len(ks)}/{total[f]}" if total[f] > 1 else f for f, ks in fams.items()]
        fmts = sorted({x for v in self.ops.values() for x in v if isinstance(x, str)})
        lines = [f"dtypes: {dts or 'none'}",
                 f"ops ({len(self.ops)} of {len(every_op_key())} keys): {', '.join(parts)}"]
        if fmts:
            lines.append(f"packed formats: {', '.join(fmts)}")
        if self.unelected:
            lines.append(f"declared, not elected: {', '.join(sorted(self.unelected))}")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """The support matrix: op keys by dtype, then packed op keys by format."""
        cols = [d for d in DType if self.uses(d)]
        fmts = sorted({x for v in self.ops.values() for x in v if isinstance(x, str)})
        lines = [f"# {self.backend} on {self.device}", "",
                 "Generated from the backend's own capability table "
                 "(`poot conformance NAME --support`).", ""]
        lines += _matrix([k for k in every_op_key() if k not in PACKED_KEYS], cols, self.lowers)
        if fmts:
            lines += ["", "Packed weight formats:", ""]
            lines += _matrix(PACKED_KEYS, fmts, self.lowers)
        lines += ["", "| dtype | uses |", "|---|---|"]
        lines += [f"| {d} | {_uses(self.uses(d))} |" for d in DType]
        if self.unelected:
            lines += ["", "Declared but not elected (compile forms them only where the policy "
                      "asks, `Policy(fuse=...)`): " + ", ".join(sorted(self.unelected))]
        if self.limits:
            lines += ["", "Limits:"] + [f"- {k}: {v}" for k, v in sorted(self.limits.items())]
        if self.notes:
            lines += ["", "Notes:"] + [f"- {k}: {v}" for k, v in sorted(self.notes.items())]
        return "\n".join(lines) + "\n"


#: the op keys whose deciding "dtype" is a packed format name
PACKED_KEYS = [name for name, cls in O.ALL_OPS.items() if cls.deciding == "format"]


def _matrix(keys, cols, lowers) -> list[str]:
    head = "| op | " + " | ".join(map(str, cols)) + " |"
    rows = [head, "|" + "---|" * (len(cols) + 1)]
    for k in keys:
        v = lowers(k)
        rows.append(f"| {k} | " + " | ".join("yes" if c in v else "-" for c in cols) + " |")
    return rows


def _entry(x: DType | str) -> DType | str:
    """A declared dtype ("f16" or DType.F16), or else a packed format name ("gguf:Q4_K")."""
    if isinstance(x, DType):
        return x
    try:
        return DType(str(x).lower())
    except ValueError:
        return str(x)


def _uses(u: Use) -> str:
    return "+".join(m.name.lower() for m in Use if m and m in u and m is not Use.NONE) or "none"


def operand_types(graph, eqn) -> list[TensorType]:
    """The operand types of one eqn of `graph` (literals are rank-0 tensors)."""
    return [x.type if isinstance(x, Lit) else graph.type_of(x.id) for x in eqn.inputs]


def region_eqns(op: O.OpKind, ins: Sequence[TensorType]) \
        -> Iterable[tuple[O.OpKind, list, TensorType]]:
    """Every eqn a region lowers with it: a Fused/FusedRow body's eqns, and a
    ContractionEpilogue's or GatedContraction's head followed by its body, a Scan's body
    (its kernel evaluates the body). The other composites are checked by their own key
    only."""
    out = []
    if isinstance(op, (O.ContractionEpilogue, O.GatedContraction)):
        head_ins = list(ins[: op.n_head])
        out.append((op.head, head_ins, op.head.infer(head_ins)))
    body = getattr(op, "body", None)
    if body is None:
        return out
    for e in body.eqns():
        out.append((e.op, operand_types(body, e), body.type_of(e.out)))
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
