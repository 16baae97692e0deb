"""The oracle of N tensor-parallel ranks: their graphs evaluated together.

Each rank's graph runs eqn by eqn (poot.oracle.evaluate.run_eqns) until it reaches a
collective; when every rank has reached it, the collective is computed from all their
operands (AllReduce: the sum, accumulated in float64 in rank order and rounded once;
AllGather: the concatenation in rank order) and each rank goes on. Rank graphs whose
collectives differ in kind, order or rank count are refused.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from poot.errors import GraphError
from poot.ir.graph import Graph
from poot.ir.ops import AllGather, AllReduce
from poot.oracle.evaluate import bind_inputs, output_arrays, run_eqns


def combine(op, parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each rank's result of one collective, from every rank's operand."""
    if isinstance(op, AllReduce):
        total = np.sum(np.stack([p.astype(np.float64) for p in parts]), axis=0)
        return [total.astype(parts[0].dtype)] * len(parts)
    if isinstance(op, AllGather):
        return [np.concatenate(parts, axis=op.axis)] * len(parts)
    raise GraphError(f"{op!r} is not a collective")  # pragma: no cover


def evaluate_ranks(graphs: Sequence[Graph], inputs: Sequence, outputs: str = "all") \
        -> list[list[np.ndarray]]:
    """Evaluate rank graphs together; `inputs[r]` binds graph r (as poot.evaluate does).
    Returns each rank's output arrays."""
    if len(inputs) != len(graphs):
        raise GraphError(f"{len(graphs)} rank graphs but {len(inputs)} input sets")
    envs = [bind_inputs(g, i) for g, i in zip(graphs, inputs, strict=True)]
    runs = [run_eqns(g, env) for g, env in zip(graphs, envs, strict=True)]
    while True:
        reached = [next(r, None) for r in runs]
        if all(x is None for x in reached):
            break
        ops = {None if x is None else x[0].op for x in reached}
        if None in ops or len(ops) != 1:
            raise GraphError(f"rank graphs reach different collectives: "
                             f"{[None if x is None else x[0].op for x in reached]}")
        (op,) = ops
        if op.ranks != len(graphs):
            raise GraphError(f"{op!r} over {op.ranks} ranks, evaluated with {len(graphs)}")
        for run, result in zip(runs, combine(op, [x[1][0] for x in reached]), strict=True):
            run.send(result)
    return [output_arrays(g, env, outputs) for g, env in zip(graphs, envs, strict=True)]


__all__ = ["evaluate_ranks", "combine"]
