"""The text form of a Plan: what `poot plan` prints (`format_plan`, `format_summary`)."""
from __future__ import annotations

from poot.contract import Place, Plan
from poot.ir.graph import Lit


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**16 else f"{n} B"


def format_summary(p: Plan) -> str:
    weights = sum(r.nbytes for r in p.weight_regions())
    state = sum(r.nbytes for r in p.state_regions())
    slots = sum(r.nbytes for r in p.slot_regions())
    kinds: dict[str, int] = {}
    for n in p.notes:
        kinds[n.kind] = kinds.get(n.kind, 0) + 1
    ratio = p.unshared_bytes / p.arena_size if p.arena_size else 0.0
    return "\n".join([
        f"plan {p.graph.name} on {p.backend.name} {p.device}",
        f"  {len(p.graph.eqns())} eqns: {len(p.steps)} kernels ({p.dispatches} dispatches), "
        f"{kinds.get('alias', 0)} aliases, {kinds.get('view', 0)} strided views, "
        f"{kinds.get('bind', 0)} folded at bind, {len(p.copies)} end-of-step copies, "
        f"{sum(s.inplace for s in p.steps)} in-place state updates",
        f"  arena {mib(p.arena_size)} for {len(p.intervals)} buffers totalling "
        f"{mib(p.unshared_bytes)} ({ratio:.1f}x reuse)",
        f"  weights {mib(weights)} in {len(p.weight_regions())} buffers, state {mib(state)} "
        f"in {len(p.state_regions())}, slots {mib(slots)} in {len(p.slot_regions())}",
    ])


def _operand(x: Place | Lit) -> str:
    return repr(x) if isinstance(x, Lit) else str(x)


def format_plan(p: Plan) -> str:
    lines = [format_summary(p), "", "kernels:"]
    for s in p.steps:
        launch = str(s.lowering)
        mark = " (in place)" if s.inplace else ""
        ins = ", ".join(_operand(x) for x in s.inputs)
        lines.append(f"  {s.index:4d} {s.eqn.op!r:<24} {launch:<18} {s.out}{mark} <- {ins}")
    for c in p.copies:
        lines.append(f"   end copy {c.src} -> {c.dst}")
    free = [n for n in p.notes]
    if free:
        lines += ["", "no dispatch:"]
        lines += [f"  {n.index:4d} {n.kind:<5} {n.eqn.op!r:<24} {n.out or ''}" for n in free]
    lines += ["", "regions:"]
    lines += [f"  {r.name:<32} {r.kind:<6} {mib(r.nbytes)}" for r in p.regions.values()]
    return "\n".join(lines)
