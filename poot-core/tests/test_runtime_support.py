"""Helpers of the plan, runtime and kv tests (no tests here): small decoders, the oracle."""
from __future__ import annotations

import numpy as np
import poot
import pytest
from poot import plugin
from poot.errors import UnknownBackend
from poot.ir.graph import OutputKind
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config


def decoder(layers: int = 2, kv: str = "dense", tokens: int = 1, batch: int = 1,
            pool_slots: int | None = None, seed: int = 0, max_seq: int = 32):
    """A traced random-weight decoder step and its const arrays by name."""
    c = tiny_config(layers=layers, max_seq=max_seq)
    w = random_weights(c, seed=seed)
    step = build_decoder(c, w, tokens=tokens, batch=batch, kv=kv, pool_slots=pool_slots)
    return c, step, const_inputs(step, w)


class OracleStepper:
    """`poot.evaluate` step by step with the state threaded by hand."""

    def __init__(self, graph, consts):
        # the graph's own consts: a source's arrays may hold tensors it reads in another
        # form (q, k and v stacked by rows)
        labels = {graph.meta(v).identity.label for v in graph.consts()}
        self.g, self.consts = graph, {k: a for k, a in consts.items() if k in labels}
        self.state = {graph.meta(v).identity.label: np.zeros(graph.type_of(v).shape,
                                                              graph.type_of(v).dtype.numpy)
                      for v, _ in graph.state()}

    def step(self, slots: dict) -> np.ndarray:
        outs = poot.evaluate(self.g, {**self.consts, **self.state, **slots})
        result = None
        for o, a in zip(self.g.outputs(), outs, strict=True):
            if o.kind is OutputKind.STATE_NEXT:
                self.state[self.g.meta(o.input).identity.label] = a
            elif o.kind is OutputKind.RESULT:
                result = a
        return result


def backend_target(name: str):
    """(backend, device) of an installed backend, or a skip saying why this machine has
    none; a backend installed whose plugin failed to load is a failure."""
    try:
        backend = plugin.get_backend(name)
    except UnknownBackend as exc:
        if plugin.manager().failure(name) is not None:
            raise
        pytest.skip(f"backend {name} is not installed here: {exc}")
    devices, why = plugin.probe(backend)
    if not devices:
        pytest.skip(f"backend {name} finds no device here: {why}")
    return backend, devices[0]
