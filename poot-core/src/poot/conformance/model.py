"""Cases exported op by op from a real model's graph: one decoder layer of a small GQA
Llama (random weights), as traced and as compiled for the reference (which forms every
composite), each distinct (op, operand types) once."""
from __future__ import annotations

import functools
from collections.abc import Iterator

from poot.capability import op_key, operand_types, primary_dtype
from poot.conformance.cases import Case, case
from poot.conformance.domains import domains
from poot.conformance.inputs import Arg
from poot.ir import ops as O
from poot.ir.graph import Lit

#: results the suite compares bit for bit (besides integer results)
EXACT = (O.Select, O.Cast, O.Broadcast, O.Reshape, O.Transpose, O.Slice, O.Concat, O.Gather,
         O.ScatterUpdate, O.DynamicUpdateSlice, O.ArgTopK, O.Iota)


def model_graphs():
    import poot
    from poot.models.llama import build_decoder, random_weights, tiny_config

    cfg = tiny_config(layers=1)
    traced = build_decoder(cfg, random_weights(cfg), tokens=1).graph
    return [traced, poot.compile(traced, "reference").graph]


@functools.lru_cache(maxsize=1)
def model_case_list() -> tuple[Case, ...]:
    """The model's cases, built once per process."""
    return tuple(c for c in model_cases() if c is not None)


def model_cases() -> Iterator[Case]:
    seen = set()
    for stage, g in zip(("traced", "compiled"), model_graphs(), strict=True):
        for i, e in enumerate(g.eqns()):
            ins = operand_types(g, e)
            sig = (repr(e.op), tuple(ins), tuple(x for x in e.inputs if isinstance(x, Lit)))
            if sig in seen:
                continue
            seen.add(sig)
            key, out = op_key(e.op), g.type_of(e.out)
            doms = domains(e.op, ins)
            args = [Arg(t, d) for x, t, d in zip(e.inputs, ins, doms, strict=True)
                    if not isinstance(x, Lit)]
            yield case(f"model-{stage}-{i}-{key}-{primary_dtype(e.op, ins, out)}", key,
                       primary_dtype(e.op, ins, out), args, _replay(e),
                       exact=isinstance(e.op, EXACT), growth="compose")


def _replay(e):
    """fn(b, *value operands) that records `e` again, literals in place."""
    def fn(b, *refs):
        it = iter(refs)
        return b.eqn(e.op, *[x if isinstance(x, Lit) else next(it) for x in e.inputs])
    return fn


__all__ = ["model_cases", "model_case_list", "model_graphs"]
