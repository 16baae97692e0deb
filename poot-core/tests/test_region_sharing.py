"""A fused region's shared values are computed once per element, however deep the chain.

The sampler's hash (poot.models.counter_rng) uses each intermediate twice. While the
region evaluator told coordinates apart by identity, every use of a value at a broadcast
coordinate emitted it again, so a chain of n rounds printed 2^n copies (a 7 MB C source
for SmolLM2's sampled decode step)."""
from __future__ import annotations

import numpy as np
import poot
from poot.codegen.interp import run_lowering
from poot.codegen.lower import lower
from poot.codegen.program import Let
from poot.ir.graph import Lit
from poot.models import counter_rng
from poot.oracle.evaluate import bind_inputs, output_arrays, run_eqns

VOCAB = 300
SEEDS = np.array([[7, 0], [123456789, 42]], np.uint32)
COUNTERS = np.array([0, 5], np.uint32)


def _uniforms_graph(rows: int):
    g = poot.trace(lambda s, c: counter_rng.graph_uniforms(s, c, VOCAB),
                   poot.spec((rows, 2), "u32", name="seed"),
                   poot.spec((rows,), "u32", name="counter"))
    graph = poot.compile(g, "reference").graph
    # the hash rounds: the region with the most eqns
    fused = max((e for e in graph.eqns() if e.op.name == "Fused"),
                key=lambda e: len(e.op.body.eqns()))
    return graph, fused


def _lowered(graph, fused):
    ins = [x if isinstance(x, Lit) else graph.type_of(x.id) for x in fused.inputs]
    return lower(fused.op, ins, graph.type_of(fused.out))


def test_each_value_of_the_hash_chain_is_one_let():
    graph, fused = _uniforms_graph(1)     # one row: every row coordinate is a broadcast 0
    lets = sum(isinstance(s, Let) for k in _lowered(graph, fused).kernels
               for s in k.statements())
    # one Let per body value at most, plus the thread's index and its coordinates
    assert lets <= len(fused.op.body.eqns()) + 4, lets


def test_the_lowered_region_draws_the_host_uniforms():
    for rows in (1, 2):
        graph, fused = _uniforms_graph(rows)
        env = bind_inputs(graph, {"seed": SEEDS[:rows], "counter": COUNTERS[:rows]})
        for _ in run_eqns(graph, env):
            pass
        args = [None if isinstance(x, Lit) else env[x.id] for x in fused.inputs]
        out = graph.type_of(fused.out)
        got = run_lowering(_lowered(graph, fused), args, out).reshape(out.shape)
        np.testing.assert_array_equal(got, env[fused.out])
        want = [counter_rng.uniforms(int(s[0]) | int(s[1]) << 32, int(c), VOCAB)
                for s, c in zip(SEEDS[:rows], COUNTERS[:rows], strict=True)]
        np.testing.assert_array_equal(output_arrays(graph, env, "result")[0], np.stack(want))
