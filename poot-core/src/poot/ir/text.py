"""The text form of a graph, printed like a jaxpr: one line per binder and per eqn."""
from __future__ import annotations

from typing import TYPE_CHECKING

from poot.ir.types import StorageClass

if TYPE_CHECKING:  # pragma: no cover
    from poot.ir.graph import Graph


def _binder(g: "Graph", vid) -> str:
    meta = g.meta(vid)
    s = meta.storage
    label = meta.identity.label
    name = f" {label!r}" if label else ""
    if s.cls is StorageClass.CONST:
        ref = meta.identity.weight
        what = f"const {ref.tensor!r} from {ref.checkpoint!r}" if ref else f"const{name}"
    elif s.cls is StorageClass.SLOT:
        lo, hi = s.slot.valid_range()
        what = f"slot {s.slot.kind.label}{name} in [{lo}, {'..' if hi is None else hi})"
    elif s.cls is StorageClass.STATE:
        what = f"state{name}"
    elif s.cls is StorageClass.COMPUTED:
        what = f"computed {g.computed_def(vid)!r}{name}"
    else:
        what = f"param{name}"
    return f"{vid!r}: {meta.aval} = {what}"


def format_graph(g: "Graph", indent: str = "") -> str:
    lines = [f"{indent}{g.name}("]
    lines += [f"{indent}  {_binder(g, v)}" for v in g.inputs()]
    lines.append(f"{indent}) {{")
    for e in g.eqns():
        meta = g.meta(e.out)
        label = meta.identity.label
        args = ", ".join(map(repr, e.inputs))
        tail = f"  # {label}" if label else ""
        lines.append(f"{indent}  {e.out!r}: {meta.aval} = {e.op!r} {args}{tail}")
        body = getattr(e.op, "body", None)
        if body is not None:
            lines.append(format_graph(body, indent + "      "))
    lines.append(f"{indent}}} -> " + "; ".join(map(repr, g.outputs())))
    return "\n".join(lines)
