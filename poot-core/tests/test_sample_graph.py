"""The sampler inside a step graph: the same tokens as the host sampler, on every backend,
and its slot roles declared through the plugin hook."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from poot import ops, plugin
from poot.dtypes import DType
from poot.errors import IRError, SlotRangeError
from poot.ir.types import SlotKind
from poot.models import counter_rng
from poot.models.sample_graph import SLOTS, sample_tokens, slot_values
from poot.models.sampling import Sampler
from poot.tracer import trace

B, V = 4, 300
SETTINGS = [dict(temperature=0.8, seed=7), dict(temperature=1.2, top_k=5, seed=9,
                                                  repetition_penalty=1.3),
            dict(temperature=0.7, top_p=0.9, seed=2 ** 40 + 3),
            dict(repetition_penalty=1.5)]


def _sampler_graph(mode="full"):
    from poot.conformance import roles

    plugin.register(roles, name="poot.conformance.roles")

    def f():
        x = ops.slot(roles.input_role(DType.F32), (B, V), "logits")
        return sample_tokens(x, mode)
    return trace(f, name=f"sampler_{mode}")


def _executor(backend: str, graph):
    import poot
    from poot.plan import plan
    from poot.runtime.executor import Executor

    sys.path.insert(0, str(Path(__file__).parent))   # the helpers beside this file
    from test_runtime_support import backend_target

    b, dev = backend_target(backend)
    return Executor(plan(poot.compile(graph, (b, dev)), (b, dev)), {})


def test_generator_in_the_graph_draws_the_host_bits():
    from poot.oracle import evaluate

    plugin.manager()

    def f():
        seed = ops.slot(SlotKind.get("sampler.seed"), (3, 2), "sampler.seed")
        counter = ops.slot(SlotKind.get("sampler.counter"), (3,), "sampler.counter")
        return counter_rng.graph_uniforms(seed, counter, 1000)
    seeds = [0, 7, 2 ** 64 - 1]
    got = evaluate(trace(f), {"sampler.seed": np.array([counter_rng.split_seed(s)
                                                          for s in seeds], np.uint32),
                              "sampler.counter": np.array([0, 5, 2 ** 32 - 1], np.uint32)})
    want = np.stack([counter_rng.uniforms(s, c, 1000)
                     for s, c in zip(seeds, [0, 5, 2 ** 32 - 1], strict=True)])
    np.testing.assert_array_equal(got[0], want)
    assert 0 < want.min() and want.max() < 1 and abs(want.mean() - 0.5) < 0.02
    edges = (np.array([0, 2 ** 23 - 1], np.float32) + np.float32(0.5)) * np.float32(2 ** -23)
    assert 0 < edges[0] and edges[1] < 1          # the extreme words stay inside (0, 1)


@pytest.mark.parametrize("backend", ["reference", "cpu", "wgpu", "vulkan", "cuda", "rocm"])
def test_graph_draws_the_host_sampler_tokens(backend):
    ex = _executor(backend, _sampler_graph())
    rng = np.random.default_rng(1)
    host = [Sampler(**s) for s in SETTINGS]
    device = [Sampler(**s) for s in SETTINGS]
    hist = [list(rng.integers(0, V, 10)) for _ in range(B)]
    for step in range(3 if backend in ("wgpu", "vulkan") else 12):   # lavapipe is slow
        logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
        want = [h.sample(logits[i], hist[i]) for i, h in enumerate(host)]
        slots = slot_values([(s, hist[i]) for i, s in enumerate(device)], B)
        got = ex.step({"logits": logits, **slots}).result
        assert got.dtype == np.int32 and got.shape == (B,)
        assert got.tolist() == want, f"step {step}"
        assert got[3] == np.argmax(logits[3] / np.where(np.isin(np.arange(V), hist[3]),
                                                        np.where(logits[3] > 0, 1.5, 1 / 1.5),
                                                        1))


def test_argmax_mode_has_no_slots_and_takes_the_argmax():
    ex = _executor("reference", _sampler_graph("argmax"))
    assert set(ex.slots) == {"logits"}
    logits = np.random.default_rng(3).standard_normal((B, V)).astype(np.float32)
    assert ex.step({"logits": logits}).result.tolist() == np.argmax(logits, 1).tolist()
    with pytest.raises(ValueError, match="greedy"):
        slot_values([(Sampler(temperature=1.0), [])], B, "argmax")


def test_roles_come_from_the_hook_and_values_are_range_checked():
    declared = plugin.manager().slot_roles()
    assert set(SLOTS) <= set(declared)
    assert declared["sampler.top_k"].owner == "poot.models.sample_graph"
    ex = _executor("reference", _sampler_graph())
    slots = slot_values([], B)
    slots["sampler.top_k"][0] = 65
    with pytest.raises(SlotRangeError, match="sampler.top_k"):
        ex.step({"logits": np.zeros((B, V), np.float32), **slots})


def test_an_undeclared_role_is_refused():
    with pytest.raises(IRError, match="unknown slot kind"):
        SlotKind.get("sampler.min_p")
    stray = SlotKind("sampler.min_p", DType.F32, 0, None, owner="nobody")

    def f():
        return ops.slot(stray, (1,), "min_p")
    with pytest.raises(IRError, match="not declared"):
        trace(f)
