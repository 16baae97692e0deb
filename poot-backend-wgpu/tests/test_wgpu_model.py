"""A whole (tiny, random-weight) Llama step through compile, plan and Executor on wgpu,
compared with the reference backend step after step: dense and paged KV, prefill, f32, bf16
and packed GGUF weights decoded in the kernels. The dense decode steps ask for every fusion
the table declares (a CPU adapter such as lavapipe elects only the SwiGLU), so the normed
contractions run wherever the suite does; the other steps compile as the adapter elects."""
import numpy as np
import poot
import pytest
from poot.compiler.policy import Policy
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plan import plan
from poot.runtime.executor import Executor
from poot_wgpu.capability import OFFERED
from poot_wgpu.step import implicit_barriers

CONFIG = tiny_config()
#: every offered fusion the table declares, elected here or not
FUSED = Policy(fuse=OFFERED)


def _executors(weights_kw, policy=None, **build_kw):
    w = random_weights(CONFIG, seed=7, **weights_kw)
    step = build_decoder(CONFIG, w, **build_kw)
    consts = const_inputs(step, w)
    ref = Executor(plan(step.graph, "reference"), consts)
    compiled = poot.compile(step.graph, "wgpu", policy=policy)
    return ref, Executor(plan(compiled), consts)


def _check(ref, dev, slots_list):
    for slots in slots_list:
        want, got = ref.step(slots).result, dev.step(slots).result
        assert got.shape == want.shape and np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        assert (got.argmax(-1) == want.argmax(-1)).all()


def _decode_slots(tokens):
    return [{"tokens": np.array([t], np.int32), "pos": np.array([p], np.int32)}
            for p, t in enumerate(tokens)]


@pytest.mark.parametrize("weights_kw", [{}, {"dtype": "bf16"}, {"packed_format": "gguf:Q4_1"},
                                        {"packed_format": "gguf:Q8_0"}],
                         ids=["f32", "bf16", "Q4_1", "Q8_0"])
def test_dense_decode_matches_reference(wgpu_device, weights_kw):
    ref, dev = _executors(weights_kw, FUSED)
    _check(ref, dev, _decode_slots([3, 17, 42, 5]))
    assert dev.executable.recorded  # later steps replayed the recorded dispatch list
    step = dev.executable.step
    assert step._next is not None   # and each encoded the next one ahead of its submit
    for d in step.dispatches:       # what plan readers (the step profile) see of a dispatch
        assert len(d.resources) == len(d.writes) == d.kernel.n_bindings and any(d.writes)
    # read-only bindings and banked outputs: a layer's rotation of q no longer orders the
    # writes of its K and V rows (everything bound read_write to one arena would)
    assert implicit_barriers(step.dispatches) <= len(step.dispatches) - 1 - 2 * CONFIG.layers


def test_prefill_then_decode_share_state(wgpu_device):
    ref, dev = _executors({}, tokens=4)
    _check(ref, dev, [{"tokens": np.array([3, 17, 42, 5], np.int32),
                       "pos": np.array([0], np.int32)}])
    for name in ref.state_names():
        np.testing.assert_allclose(dev.read_state(name), ref.read_state(name), rtol=1e-3,
                                   atol=1e-4)


def test_paged_batch_decode_matches_reference(wgpu_device):
    ref, dev = _executors({}, batch=2, kv="paged", pool_slots=64)
    rng = np.random.default_rng(5)
    slot_map = np.stack([np.arange(32), 32 + np.arange(32)]).astype(np.int32)
    steps = []
    for p in range(3):
        steps.append({"tokens": rng.integers(0, CONFIG.vocab, (2, 1)).astype(np.int32),
                      "pos": np.full((2, 1), p, np.int32),
                      "write_map": np.array([p, 32 + p], np.int32), "slot_map": slot_map})
    _check(ref, dev, steps)


def test_decode_takes_norms_and_swiglu_in(wgpu_device):
    """The offered fusions the table declares: no RMSNorm (FusedRow) or SwiGLU (Fused)
    kernel of its own in a decode step; each goes inside the contraction reading it (the
    dense decode test above runs that step against the reference backend). A plain compile
    does so on a GPU; a CPU adapter (lavapipe, where the normed GEMV measured slower)
    elects only the SwiGLU and keeps the norms apart. Every adapter writes the rotated keys
    straight to the cache (RopeUpdateSlice); a GPU attends over the step's own rows
    (FreshKVAttention)."""
    from collections import Counter

    w = random_weights(CONFIG, seed=7, packed_format="gguf:Q4_1")

    def compiled(policy=None):
        return poot.compile(build_decoder(CONFIG, w).graph, "wgpu", policy=policy)
    ops = Counter(e.op.name for e in compiled(FUSED).graph.eqns())
    assert "FusedRow" not in ops and ops["GatedContraction"] == CONFIG.layers
    assert ops["NormedPackedContraction"] == CONFIG.layers + 1     # q|k|v and the head
    plain = compiled()
    own = Counter(e.op.name for e in plain.graph.eqns())
    assert own["GatedContraction"] == own["RopeUpdateSlice"] == CONFIG.layers
    assert ops["FreshKVAttention"] == CONFIG.layers and "Attention" not in ops
    if wgpu_device.is_software:
        assert own["FusedRow"] == 2 * CONFIG.layers + 1 and "NormedPackedContraction" not in own
        assert "NormedPackedContraction is declared but not elected" in plain.explain()
    else:
        assert own == ops
