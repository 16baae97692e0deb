"""poot.plan: lay a compiled graph out for one backend device.

`plan(compiled_or_graph, target=None) -> Plan`: the kernel sequence (each eqn with the
backend's Lowering), every value placed before the first dispatch (an arena with fixed,
256-aligned offsets reused across disjoint lifetimes; Reshape, and a Slice that is one
contiguous run of its operand, as an alias; Transpose as a strided view where the consumer
accepts one; consts bound once; slots and state at stable addresses; state updated in
place where the donate contract allows).
`poot.plan.show.format_plan(plan)` prints it. The Plan's data classes are defined in
`poot.contract` (what a backend's runtime reads).
"""
from __future__ import annotations

from poot.contract import ALIGN, ARENA, Copy, Note, Place, Plan, Region, Step, WeightSpec

__all__ = ["plan", "Plan", "Place", "Region", "Step", "Copy", "Note", "WeightSpec", "ALIGN",
           "ARENA"]


def plan(compiled_or_graph, target=None) -> Plan:
    """Plan a Graph (or a `poot.compile` result with .graph/.backend/.device) for `target`
    (a backend name, a Backend, a (Backend, Device) pair, or None for the compiled
    result's backend or else the best available one)."""
    from poot.plan.planner import make_plan

    return make_plan(compiled_or_graph, target)
