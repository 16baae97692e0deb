"""Grow a closed region of eqns (forward from a start value, or backward from a root),
and build its body graph.

A region is closed when every value it defines, except its root (the last member),
is read only inside it and is no output: then one eqn writing the root's value can
replace it, and nothing outside needs an interior value. Growth takes the readers
of region values in graph order (a heap on positions), so each eqn is looked at a
bounded number of times: linear in the size of what it covers.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable

from poot.compiler.view import GraphView
from poot.ir.builder import region
from poot.ir.graph import Eqn, Lit, Value
from poot.ir.types import ValueId


def grow(view: GraphView, start: ValueId, admit: Callable[[Eqn], bool],
         taken: Callable[[ValueId], bool], members: list[Eqn] | None = None) -> list[Eqn]:
    """The largest closed region grown from `start` (its producer in `members`, or
    outside the region as an epilogue's head) with eqns `admit` accepts. Growth stops
    at the first reader it cannot take: past it, the region can never close again."""
    members = list(members or [])
    inside = {start} | {e.out for e in members}
    open_uses = {start: view.uses(start)}
    total = open_uses[start]
    best = list(members)
    heap = [view.position[u.out] for u in view.users.get(start, ())]
    heapq.heapify(heap)
    while heap:
        u = view.eqns[heapq.heappop(heap)]
        if u.out in inside:
            continue
        if taken(u.out) or not admit(u):
            break
        for x in u.inputs:
            if isinstance(x, Value) and x.id in inside:
                open_uses[x.id] -= 1
                total -= 1
        members.append(u)
        inside.add(u.out)
        open_uses[u.out] = view.uses(u.out)
        total += open_uses[u.out]
        if total == open_uses[u.out]:
            best = list(members)
        for r in view.users.get(u.out, ()):
            heapq.heappush(heap, view.position[r.out])
    return best


def grow_back(view: GraphView, root: Eqn, admit: Callable[[Eqn], bool],
              taken: Callable[[ValueId], bool]) -> list[Eqn]:
    """The closed region rooted at `root`, grown backward over producers: a producer
    joins once every reader of its value is in the region (and the value is no output),
    so the region is closed by construction. Members in graph order."""
    members = {root.out: root}
    inside_uses: dict[ValueId, int] = {}
    work = [root]
    while work:
        e = work.pop()
        for x in e.inputs:
            if not isinstance(x, Value):
                continue
            v = x.id
            inside_uses[v] = inside_uses.get(v, 0) + 1
            p = view.producer(v)
            if p is None or v in members or inside_uses[v] != view.uses(v) or taken(v) or \
                    not admit(p):
                continue
            members[v] = p
            work.append(p)
    return sorted(members.values(), key=lambda e: view.position[e.out])


def external_inputs(members: list[Eqn], first: list[ValueId] = ()) -> list[ValueId]:
    """Values the members read but do not define, in order of first use (after `first`)."""
    defined = {e.out for e in members}
    out = list(first)
    seen = set(out) | defined
    for e in members:
        for x in e.inputs:
            if isinstance(x, Value) and x.id not in seen:
                seen.add(x.id)
                out.append(x.id)
    return out


def body_graph(view: GraphView, members: list[Eqn], params: list[ValueId], name: str):
    """A region body (poot.ir.region): `params` become its parameters, members its eqns."""

    def emit(b, *refs):
        env = dict(zip(params, refs, strict=True))
        for e in members:
            env[e.out] = b.eqn(e.op, *(x if isinstance(x, Lit) else env[x.id]
                                       for x in e.inputs))
        return env[members[-1].out]

    return region([view.type_of(p) for p in params], emit, name)
