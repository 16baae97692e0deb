"""The text form of a graph, printed like a jaxpr: one line per binder and per eqn.

    name(
      %0: f32[2,8] = const 'q'
      %1: f32[2,5,8] = const 'blk.0.k' from 'model.gguf' payload 'sha:..' format 'bf16'
      %2: i32[1] = slot Pos 'pos' in [0, 5)
      %3: f32[8,4] = state 'cache'
      %4: i32[1,5] = computed Iota{shape=(1,5), axis=1, dtype=i32} 'iota'
    ) {
      %5: f32[2,1,5] = MatMul %0, %1
      %6: f32[2,1,5] = Mul %5, 0.5:f32  # scores
      %7: f32[2,8] = Fused{eqns=1} %0, %0
          region(
            ...                         (a region's body graph, indented under its eqn)
          ) -> result %2
    } -> result %6; witness %5 'label'; export %6 @boundary; state_next %9 <- %3

`poot.ir.parse.parse` reads it back: `parse(str(g))` gives an equal graph.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from poot.ir.nodes import GraphOutput, OutputKind
from poot.ir.ops.base import OpKind, _fmt
from poot.ir.types import StorageClass

if TYPE_CHECKING:  # pragma: no cover
    from poot.ir.graph import Graph


def _name(s: str) -> str:
    """A name printed bare where it reads unambiguously, else quoted."""
    return s if s.isidentifier() else repr(s)


def _param(v) -> str:
    if isinstance(v, OpKind):
        return format_op(v)
    return _fmt(v)  # a PackedWeight prints its own text form (its __str__)


def format_op(op: OpKind) -> str:
    """An op as `Name{param=value, ...}` (Unary/Binary by their sub-op: `Exp`, `Mul`)."""
    ps = op.params()
    sub = ps.pop("op", None)
    head = sub.name if sub is not None and op.name in ("Unary", "Binary") else op.name
    if sub is not None and head == op.name:
        ps = {"op": sub, **ps}
    inner = ", ".join(f"{k}={_param(v)}" for k, v in ps.items())
    return head + ("{" + inner + "}" if ps else "")


def _binder(g: Graph, vid) -> str:
    meta = g.meta(vid)
    s = meta.storage
    label = meta.identity.label
    name = f" {label!r}" if label else ""
    if s.cls is StorageClass.CONST:
        ref = meta.identity.weight
        if ref:
            what = f"const {ref.tensor!r} from {ref.checkpoint!r}"
            what += f" payload {ref.payload!r}" if ref.payload else ""
            what += f" format {ref.format!r}" if ref.format else ""
        else:
            what = f"const{name}"
    elif s.cls is StorageClass.SLOT:
        lo, hi = s.slot.valid_range()
        what = f"slot {s.slot.kind.label}{name} in [{lo}, {'..' if hi is None else hi})"
        if s.slot.kind.hi is not None and s.slot.bound is not None:
            what += f" bound {s.slot.bound}"  # the kind's own range wins; keep the bound
    elif s.cls is StorageClass.STATE:
        what = f"state{name}"
    elif s.cls is StorageClass.COMPUTED:
        what = f"computed {format_op(g.computed_def(vid))}{name}"
    else:
        what = f"param{name}"
    return f"{vid!r}: {meta.aval} = {what}"


def format_output(o: GraphOutput) -> str:
    if o.kind is OutputKind.EXPORT:
        return f"export {o.value!r} @{_name(o.boundary.name)}"
    if o.kind is OutputKind.WITNESS:
        return f"witness {o.value!r} {o.label!r}"
    return repr(o)


def _comment(label: str) -> str:
    plain = label.isprintable() and label == label.strip() and label[:1] not in ("'", '"')
    return label if plain and label else repr(label)


def format_graph(g: Graph, indent: str = "") -> str:
    lines = [f"{indent}{g.name}("]
    lines += [f"{indent}  {_binder(g, v)}" for v in g.inputs()]
    lines.append(f"{indent}) {{")
    for e in g.eqns():
        meta = g.meta(e.out)
        label = meta.identity.label
        args = ", ".join(map(repr, e.inputs))
        tail = f"  # {_comment(label)}" if label else ""
        rhs = f"{format_op(e.op)} {args}".rstrip()
        lines.append(f"{indent}  {e.out!r}: {meta.aval} = {rhs}{tail}")
        body = getattr(e.op, "body", None)
        if body is not None:
            lines.append(format_graph(body, indent + "      "))
    lines.append(f"{indent}}} -> " + "; ".join(map(format_output, g.outputs())))
    return "\n".join(lines)
