"""The pass pipeline: each pass opens graph.edit(), commits a checked draft, and records
what it did. The order matters: chains are recognized before their pieces are fused."""
from __future__ import annotations

import time
from dataclasses import dataclass

from poot.capability import CapabilityTable
from poot.compiler import stages
from poot.compiler.context import PassContext
from poot.contract import Backend, Device
from poot.compiler.passes import (
    attention,
    attention_rows,
    collectives,
    contraction_dense,
    contraction_packed,
    cse,
    dce,
    epilogue,
    fresh_kv,
    fusion,
    iota_fold,
    kv_write,
    norm_contraction,
    precision,
    prologue,
    relabel,
    rope,
    selection,
    stacked_gate,
)
from poot.compiler.policy import Policy, PolicyError
from poot.compiler.report import CompileReport, PassRecord
from poot.ir.graph import Graph

#: (name, run) in order: refuse collectives, round activations as the policy's precision
#: says (before anything reads the contractions), clean up (dce, cse), find the chains
#: (selection before attention, which it contains), then contractions, epilogues, regions, norms
#: into the packed contractions that read them, pointwise regions into the contractions
#: that read them (prologue), or whose two halves they join (gated; stacked_gate where
#: the halves are two contractions over one stacked weight's rows).
PASSES = [
    ("collectives", collectives.run),
    ("precision", precision.run),
    ("dce", dce.run),
    ("cse", cse.run),
    ("selection", selection.run),
    ("attention", attention.run),
    ("rope_fusion", rope.run),
    ("rope_scatter", rope.scatter_run),
    ("rope_update", rope.update_run),
    ("fresh_kv", fresh_kv.run),
    ("kv_write", kv_write.run),
    ("attention_rows", attention_rows.run),
    ("iota_fold", iota_fold.run),
    ("dense_contraction", contraction_dense.run),
    ("packed_contraction", contraction_packed.run),
    ("q8_contraction", precision.q8_run),
    ("epilogue", epilogue.run),
    ("fusion", fusion.run),
    ("norm_contraction", norm_contraction.run),
    ("prologue", prologue.run),
    ("gated", epilogue.gated_run),
    ("stacked_gate", stacked_gate.run),
    ("relabel", relabel.run),
    ("dce_final", dce.run),
]


@dataclass
class Compiled:
    """A compiled graph and the target it was compiled for (the planner's input)."""

    graph: Graph
    source: Graph
    backend: Backend
    device: Device
    table: CapabilityTable
    policy: Policy
    report: CompileReport

    def explain(self, **kw) -> str:
        return self.report.explain(**kw)


def resolve_target(target) -> tuple[Backend, Device]:
    """None (best available), a backend name or Backend, or a (backend, device) pair."""
    from poot.plugin import get_backend, select_backend

    if target is None or isinstance(target, str):
        return select_backend(target)
    if isinstance(target, Backend):
        return target, target.default_device()
    if isinstance(target, tuple) and len(target) == 2:
        backend, device = target
        backend = get_backend(backend) if isinstance(backend, str) else backend
        return backend, device if device is not None else backend.default_device()
    from poot.errors import UnknownBackend

    raise UnknownBackend(f"target must be None, a backend name, or a (backend, device) pair; "
                         f"got {target!r}")


def run_pass(graph: Graph, name: str, target=None, *,
             policy: Policy | None = None) -> tuple[Graph, PassRecord]:
    """Run one pass of PASSES alone (tests, and explaining one step)."""
    runs = dict(PASSES)
    if name not in runs:
        raise PolicyError(f"no pass named {name!r}; passes: {', '.join(runs)}")
    backend, device = resolve_target(target)
    rec = PassRecord(name, eqns_before=len(graph.eqns()))
    g = runs[name](graph, PassContext(backend.capabilities(device), policy or Policy(), rec))
    rec.eqns_after = len(g.eqns())
    return g, rec


def compile(graph: Graph, target=None, *, policy: Policy | None = None,
            communicator=None) -> Compiled:
    """Rewrite `graph` for `target`: find the composites the target can lower. With a
    `communicator` (poot.contract.Communicator: the target's runtime is one rank of a
    tensor-parallel group) the table declares the collectives, and a graph holding them is
    cut there into stages compiled one by one (poot.compiler.stages)."""
    backend, device = resolve_target(target)
    table = backend.capabilities(device)
    if communicator is not None:
        table = table.with_communicator(communicator)
    policy = policy or Policy()
    report = CompileReport(f"{backend.name} on {device}")
    if communicator is not None and stages.has_collectives(graph):
        for e in graph.eqns():
            if isinstance(e.op, stages.COLLECTIVES):
                table.check_eqn(e, graph)
        parts = [(_passes(stage, table, policy, report), source)
                 for stage, source in stages.split(graph)]
        g = stages.join(graph, parts)
    else:
        g = _passes(graph, table, policy, report)
    report.graph = g
    return Compiled(g, graph, backend, device, table, policy, report)


def _passes(g: Graph, table: CapabilityTable, policy: Policy, report: CompileReport) -> Graph:
    for name, run in PASSES:
        rec = report.record(name)
        rec.eqns_before = len(g.eqns())
        if name in policy.disable:
            rec.skipped, rec.eqns_after = "disabled by policy", rec.eqns_before
            continue
        start = time.perf_counter()
        g = run(g, PassContext(table, policy, rec))
        rec.seconds = time.perf_counter() - start
        rec.eqns_after = len(g.eqns())
    return g
