"""Collectives as cuts between stages: split a rank graph there, compile each stage, join.

An eqn's stage is the largest stage of its operands; a collective's result belongs to the
stage after its operand's. Stage k is an ordinary graph: the binders it reads, a region
parameter for every value of an earlier stage (or a collective's result) it reads, an
export for every value a later stage, a collective or the graph's outputs read, and the
state updates it computes. Each stage compiles alone (so no fusion reaches across a
collective), and the join lays the compiled stages and the collectives between them back
into one graph, which the planner plans like any other: each collective becomes a step of
its own that the runtime's communicator runs.
"""
from __future__ import annotations

from poot.ir.builder import Builder, Ref
from poot.ir.graph import Graph, Lit, OutputKind
from poot.ir.ops import COLLECTIVES
from poot.ir.types import StorageClass, ValueId


def has_collectives(graph: Graph) -> bool:
    return any(isinstance(e.op, COLLECTIVES) for e in graph.eqns())


def stage_of(graph: Graph) -> dict[ValueId, int]:
    """Each value's stage. An eqn that reads only the graph's inputs (a weight's dequant,
    the rows of a table) moves to the first stage that reads it, so the contraction
    reading it finds it in its own stage, and no stage exports a whole model's
    weights."""
    level: dict[ValueId, int] = {v: 0 for v in graph.inputs()}
    free = set(graph.inputs())          # values computed from the graph's inputs alone
    for e in graph.eqns():
        at = max((level[v] for v in e.value_inputs()), default=0)
        level[e.out] = at + 1 if isinstance(e.op, COLLECTIVES) else at
        if not isinstance(e.op, COLLECTIVES) and all(v in free for v in e.value_inputs()):
            free.add(e.out)
    readers: dict[ValueId, list[ValueId]] = {}
    for e in graph.eqns():
        for v in e.value_inputs():
            readers.setdefault(v, []).append(e.out)
    pinned = {o.value for o in graph.outputs()} | {v for e in graph.eqns()
                                                   if isinstance(e.op, COLLECTIVES)
                                                   for v in e.value_inputs()}
    for e in reversed(graph.eqns()):
        if e.out in free and e.out not in pinned and readers.get(e.out):
            level[e.out] = min(level[r] for r in readers[e.out])
    return level


def split(graph: Graph) -> list[tuple[Graph, dict[ValueId, ValueId]]]:
    """The stage graphs, each with the map from its parameters and binders to the source
    graph's values. Exports are named by the source value they carry (`v<index>`)."""
    level = stage_of(graph)
    stages = 1 + max((level[e.out] for e in graph.eqns()), default=0)
    read_later: dict[ValueId, int] = {}      # the last stage reading each value
    for e in graph.eqns():
        # a collective reads its operand between its stage and the next: exported
        here = level[e.out]
        for v in e.value_inputs():
            read_later[v] = max(read_later.get(v, 0), here)
    for o in graph.outputs():
        read_later[o.value] = stages
    out = []
    for k in range(stages):
        b = Builder(f"{graph.name}.stage{k}", compiler=True)
        env: dict[ValueId, Ref] = {}
        source: dict[ValueId, ValueId] = {}

        def operand(v, b=b, env=env, source=source, k=k):
            if v not in env:
                meta = graph.meta(v)
                if meta.storage.cls is not StorageClass.DEVICE and level[v] == 0:
                    gen = graph.computed_def(v) if meta.storage.cls is \
                        StorageClass.COMPUTED else None
                    env[v] = b.binder_like(meta, gen)
                else:
                    env[v] = b.param(meta.aval, f"v{v.index}")
                source[env[v].id] = v
            return env[v]

        exports = []
        for e in graph.eqns():
            if isinstance(e.op, COLLECTIVES) or level[e.out] != k:
                continue
            args = [x if isinstance(x, Lit) else operand(x.id) for x in e.inputs]
            env[e.out] = b.eqn(e.op, *args)
            if read_later.get(e.out, 0) > k:
                exports.append(e.out)
        states = [(st, nxt) for st, nxt in graph.state() if level[nxt] == k]
        for st, nxt in states:
            operand(st)
            operand(nxt)
        if not exports:           # a stage has one result: a binder passed through if need be
            exports.append(next(iter(env)))
        for v in exports:
            b.export(operand(v), f"v{v.index}")
        b.result(operand(exports[-1]))
        for st, nxt in states:
            b.state_next(env[st], env[nxt])
        out.append((b.finish(), source))
    return out


def join(graph: Graph, compiled: list[tuple[Graph, dict[ValueId, ValueId]]]) -> Graph:
    """One graph of the compiled stages (with their source maps) and the source graph's
    collectives between them; the source graph's outputs."""
    level = stage_of(graph)
    b = Builder(graph.name, compiler=True)
    value: dict[ValueId, Ref] = {}        # source value -> joined value
    for v in graph.inputs():
        meta = graph.meta(v)
        gen = graph.computed_def(v) if meta.storage.cls is StorageClass.COMPUTED else None
        value[v] = b.binder_like(meta, gen)
    collectives = [e for e in graph.eqns() if isinstance(e.op, COLLECTIVES)]
    by_name = {f"v{v.index}": v for v, _ in graph.values()}
    for k, (stage, source) in enumerate(compiled):
        for e in collectives:
            if level[e.out] == k:
                value[e.out] = b.eqn(e.op, value[e.inputs[0].id])
        env: dict[ValueId, Ref] = {}
        for v in stage.inputs():
            if v in source:
                env[v] = value[source[v]]
            else:                 # a binder compile introduced (a folded Iota)
                meta = stage.meta(v)
                gen = stage.computed_def(v) if meta.storage.cls is \
                    StorageClass.COMPUTED else None
                env[v] = b.binder_like(meta, gen)
        for e in stage.eqns():
            env[e.out] = b.eqn(e.op, *(x if isinstance(x, Lit) else env[x.id]
                                       for x in e.inputs))
        for o in stage.outputs():
            if o.kind is OutputKind.EXPORT:
                value[by_name[o.boundary.name]] = env[o.value]
    for o in graph.outputs():
        ref = value[o.value]
        if o.kind is OutputKind.RESULT:
            b.result(ref)
        elif o.kind is OutputKind.WITNESS:
            b.witness(ref, o.label)
        elif o.kind is OutputKind.EXPORT:
            b.export(ref, o.boundary.name)
        else:
            b.state_next(value[o.input], ref)
    return b.finish()
