"""The token mask and the logit bias inside the sampling step graph ("masked" mode): each
row draws the host sampler's token from its logits with its bias added and the ids its
mask leaves out set to -inf (poot.serve.logits' order), the oracle and every backend alike;
a row whose mask allows every id and that has no bias draws what the unmasked sampler
draws."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from poot import ops, plugin
from poot.models.sample_graph import (ALL_ALLOWED, BIAS_IDS, biased_logits, mask_words,
                                      masked_logits, slot_values)
from poot.models.sampling import Sampler
from poot.tracer import trace

sys.path.insert(0, str(Path(__file__).parent))   # the helpers beside this file
# B rows of V = 300 ids: 10 mask words, the last one's high 20 bits past the vocabulary
from test_sample_graph import SETTINGS, B, V, _executor  # noqa: E402
from test_sample_graph import _sampler_graph as _graph  # noqa: E402


class Allowed:
    """A mask writer that allows a fixed set of ids (and sets every bit past V, which the
    graph must ignore)."""

    def __init__(self, ids):
        self.ids = np.asarray(ids)

    def write_mask(self, words: np.ndarray) -> None:
        bits = np.zeros(words.size * 32, np.uint8)
        bits[self.ids] = 1
        bits[V:] = 1
        words[:] = np.packbits(bits, bitorder="little").view(np.uint32)


def _masked(logits: np.ndarray, ids) -> np.ndarray:
    z = np.full_like(logits, -np.inf)
    z[ids] = logits[ids]
    return z


def _drawing(backend: str, seed: int):
    """The masked sampler graph, its executor on `backend`, a generator, three copies of
    SETTINGS' samplers (the host's, the backend's, the oracle's) and each row's history."""
    graph = _graph("masked")
    rng = np.random.default_rng(seed)
    samplers = tuple([Sampler(**s) for s in SETTINGS] for _ in range(3))
    return graph, _executor(backend, graph), rng, samplers, \
        [list(rng.integers(0, V, 10)) for _ in range(B)]


@pytest.mark.parametrize("vocab", [V, 320, 5])    # a last word partly past it, none, most
def test_mask_bits_spread_to_ids_as_the_oracle_defines(vocab):
    from poot.oracle import evaluate

    plugin.manager()
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2 ** 32, (B, mask_words(vocab)), dtype=np.uint64).astype(np.uint32)
    logits = rng.standard_normal((B, vocab)).astype(np.float32)

    def f():
        from poot.conformance import roles
        from poot.dtypes import DType
        from poot.ir.types import SlotKind

        plugin.register(roles, name="poot.conformance.roles")
        m = ops.slot(SlotKind.get("sampler.mask"), (B, mask_words(vocab)), "sampler.mask")
        return masked_logits(ops.slot(roles.input_role(DType.F32), (B, vocab), "logits"), m)
    got = evaluate(trace(f), {"sampler.mask": words, "logits": logits})[0]
    allowed = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab] == 1
    assert got.dtype == np.float32 and got.shape == (B, vocab)
    np.testing.assert_array_equal(got, np.where(allowed, logits, -np.inf))


@pytest.mark.parametrize("backend", ["reference", "cpu", "wgpu", "vulkan", "cuda", "rocm"])
def test_masked_graph_draws_the_host_sampler_tokens_of_the_masked_logits(backend):
    from poot.oracle import evaluate

    graph, ex, rng, (host, device, oracle), hist = _drawing(backend, 1)
    for step in range(3 if backend in ("wgpu", "vulkan") else 10):   # lavapipe is slow
        logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
        # rows 0 and 2 constrained (row 2 to one id: a forced token); rows 1 and 3 free
        allowed = {0: rng.choice(V, 1 + step * 7, replace=False), 2: [int(rng.integers(V))]}
        want = [h.sample(_masked(logits[i], allowed[i]) if i in allowed else logits[i],
                         hist[i]) for i, h in enumerate(host)]
        masks = [Allowed(allowed[i]) if i in allowed else None for i in range(B)]
        slots = slot_values([(s, hist[i]) for i, s in enumerate(device)], B, "masked",
                            vocab=V, masks=masks)
        got = ex.step({"logits": logits, **slots}).result
        assert got.dtype == np.int32 and got.shape == (B,)
        assert got.tolist() == want, f"step {step}"
        assert got[0] in allowed[0] and got[2] == allowed[2][0]
        again = slot_values([(s, hist[i]) for i, s in enumerate(oracle)], B, "masked",
                            vocab=V, masks=masks)
        assert evaluate(graph, {"logits": logits, **again})[0].tolist() == want


def _biased(logits: np.ndarray, bias) -> np.ndarray:
    """The host's bias (poot.serve.logits.LogitRule.apply's step 1)."""
    z = np.array(logits, np.float32)
    ids, values = bias
    z[ids] += values
    return z


def test_bias_adds_at_each_rows_ids_as_the_oracle_defines():
    from poot.oracle import evaluate

    plugin.manager()
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((B, V)).astype(np.float32)
    biases = [(rng.choice(V, 5, replace=False), rng.uniform(-100, 100, 5).astype(np.float32)),
              None, (np.array([0, V - 1]), np.array([3.5, -2.25], np.float32)), None]
    slots = slot_values([(Sampler(), [])] * B, B, "masked", vocab=V, biases=biases)
    assert (slots["sampler.bias_ids"][1] == -1).all() and slots["sampler.bias_ids"].shape == \
        (B, BIAS_IDS)

    def f():
        from poot.conformance import roles
        from poot.dtypes import DType
        from poot.ir.types import SlotKind

        plugin.register(roles, name="poot.conformance.roles")
        ids = ops.slot(SlotKind.get("sampler.bias_ids"), (B, BIAS_IDS), "sampler.bias_ids", V)
        bias = ops.slot(SlotKind.get("sampler.bias"), (B, BIAS_IDS), "sampler.bias")
        return biased_logits(ops.slot(roles.input_role(DType.F32), (B, V), "logits"), ids, bias)
    got = evaluate(trace(f), {"logits": logits, "sampler.bias_ids": slots["sampler.bias_ids"],
                              "sampler.bias": slots["sampler.bias"]})[0]
    want = np.stack([_biased(logits[i], b) if b is not None else logits[i]
                     for i, b in enumerate(biases)])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", ["reference", "cpu", "wgpu", "vulkan", "cuda", "rocm"])
def test_biased_and_masked_rows_draw_the_host_sampler_tokens(backend):
    """Rows with a bias alone, a bias and a mask (json_object with a bias), a mask alone and
    neither: greedy and seeded settings, each step's token the host path's."""
    from poot.oracle import evaluate

    graph, ex, rng, (host, device, oracle), hist = _drawing(backend, 4)
    moved = 0
    for step in range(2 if backend in ("wgpu", "vulkan") else 6):    # lavapipe is slow
        logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
        # large enough to move the draw: a few ids pushed up, the argmax pushed down
        favoured = rng.choice(V, 3, replace=False)
        biases = [(np.concatenate([favoured, [int(np.argmax(logits[i]))]]),
                   np.array([6.0, 5.0, 4.0, -100.0], np.float32)) if i in (0, 1, 3) else None
                  for i in range(B)]
        biases = [b if b is None or len(set(b[0].tolist())) == 4 else
                  (b[0][:3], b[1][:3]) for b in biases]
        allowed = {1: np.concatenate([favoured[1:], rng.choice(V, 20, replace=False)]),
                   2: rng.choice(V, 30, replace=False)}
        want = []
        for i, h in enumerate(host):
            z = _biased(logits[i], biases[i]) if biases[i] is not None else logits[i]
            want.append(h.sample(_masked(z, allowed[i]) if i in allowed else z, hist[i]))
        moved += want[3] != Sampler(**SETTINGS[3]).sample(logits[3], hist[3])   # greedy
        masks = [Allowed(allowed[i]) if i in allowed else None for i in range(B)]
        slots = slot_values([(s, hist[i]) for i, s in enumerate(device)], B, "masked",
                            vocab=V, masks=masks, biases=biases)
        got = ex.step({"logits": logits, **slots}).result
        assert got.tolist() == want, f"step {step}"
        assert got[1] in allowed[1] and got[2] in allowed[2]
        again = slot_values([(s, hist[i]) for i, s in enumerate(oracle)], B, "masked",
                            vocab=V, masks=masks, biases=biases)
        assert evaluate(graph, {"logits": logits, **again})[0].tolist() == want
    assert moved     # the bias changed the greedy row's tokens


def test_a_row_allowing_every_id_draws_the_unmasked_token():
    masked, full = _executor("reference", _graph("masked")), _executor("reference",
                                                                        _graph("full"))
    rng = np.random.default_rng(2)
    a, b = [Sampler(**s) for s in SETTINGS], [Sampler(**s) for s in SETTINGS]
    for _ in range(5):
        logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
        slots = slot_values([(s, []) for s in a], B, "masked", vocab=V)
        assert (slots["sampler.mask"] == ALL_ALLOWED).all()
        got = masked.step({"logits": logits, **slots}).result
        want = full.step({"logits": logits, **slot_values([(s, []) for s in b], B)}).result
        assert got.tolist() == want.tolist()


def test_slot_values_refuse_a_mask_where_it_has_no_place():
    with pytest.raises(ValueError, match="vocabulary"):
        slot_values([], B, "masked")
    with pytest.raises(ValueError, match="no token mask"):
        slot_values([(Sampler(), [])], B, "full", masks=[Allowed([1])])
    with pytest.raises(ValueError, match="logit bias"):
        slot_values([(Sampler(), [])], B, "full", biases=[([1], [2.0])])
    many = np.arange(BIAS_IDS + 1)
    with pytest.raises(ValueError, match=f"at most {BIAS_IDS}"):
        slot_values([(Sampler(), [])], B, "masked", vocab=V * 2,
                    biases=[(many, np.ones(many.size, np.float32))])
    assert "sampler.mask" not in slot_values([], B, "full", vocab=V)


@pytest.mark.parametrize("module, cls", [("poot_cuda.backend", "CudaBackend"),
                                         ("poot_rocm.backend", "RocmBackend")])
def test_masked_graph_plans_for_the_gpus_without_one(module, cls):
    """The mask's ops (u32 shift, and, unsigned compare) lower for the cuda and rocm
    backends: the compile check CI runs where no GPU is (their tokens are compared above
    where one is)."""
    import poot
    from poot.plan import plan

    backend = getattr(pytest.importorskip(module, reason=f"{module} is not installed"), cls)()
    device = backend.compile_only_device()
    p = plan(poot.compile(_graph("masked"), (backend, device)), (backend, device))
    assert any(s.lowering.dispatches for s in p.steps)
