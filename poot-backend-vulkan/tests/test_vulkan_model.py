"""A tiny random-weight Llama decode step on vulkan: the RMSNorms inside the contractions
that read them, the SwiGLU inside the gate|up GEMV and the rotated keys written straight to
the cache (the offered fusions the table declares; asked for through the policy, since a
software device such as lavapipe keeps the norms apart), the reference backend's results,
and fewer dependent batches than the same step compiled without those fusions; and what a
plain compile forms on this device."""
from collections import Counter

import numpy as np
import poot
import pytest
from poot.compiler.policy import Policy
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plan import plan
from poot.runtime.executor import Executor
from poot_vulkan.capability import OFFERED

CONFIG = tiny_config()
#: the passes that move the norms and the SwiGLU into the contractions, the rotation of
#: the keys into their cache write, and the attention onto the step's own rows
FUSIONS = frozenset({"norm_contraction", "gated", "rope_update", "fresh_kv"})


@pytest.mark.parametrize("weights_kw", [{}, {"packed_format": "gguf:Q4_1"}],
                         ids=["f32", "Q4_1"])
def test_decode_takes_norms_and_swiglu_in_fewer_batches(vulkan_target, weights_kw):
    w = random_weights(CONFIG, seed=7, **weights_kw)
    step = build_decoder(CONFIG, w)
    consts = const_inputs(step, w)
    fused = poot.compile(step.graph, vulkan_target, policy=Policy(fuse=OFFERED))
    ops = Counter(e.op.name for e in fused.graph.eqns())
    assert "FusedRow" not in ops and ops["GatedContraction"] == CONFIG.layers
    assert ops["RopeUpdateSlice"] == ops["FreshKVAttention"] == CONFIG.layers
    assert "Attention" not in ops and "Rope" not in ops     # q rotated as attention reads it
    apart = poot.compile(step.graph, vulkan_target, policy=Policy(disable=FUSIONS))
    ref = Executor(plan(step.graph, "reference"), consts)
    dev, before = (Executor(plan(c), consts) for c in (fused, apart))
    for pos, token in enumerate([3, 17, 42]):
        slots = {"tokens": np.array([token], np.int32), "pos": np.array([pos], np.int32)}
        want = ref.step(slots).result
        for ex in (dev, before):
            got = ex.step(slots).result
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
            assert (got.argmax(-1) == want.argmax(-1)).all()
    # a layer's two norms and its SwiGLU (with the slices of gate|up it read, where those
    # were kernels), and the head's norm, are no batches of their own; nor is its KV write,
    # which no longer waits for the rotation of q, nor the rotation (the attention reads
    # the step's rows, not the cache they are written to)
    saved = len(before.executable.step.batches) - len(dev.executable.step.batches)
    assert saved >= 5 * CONFIG.layers + 1


def test_a_plain_compile_forms_the_fusions_the_device_elects(vulkan_target):
    """Every device declares the normed contractions; a software device (lavapipe, where
    the normed GEMV measured slower) keeps the norms apart unless the policy asks. Every
    device writes the rotated keys straight to the cache (v's write stays apart)."""
    w = random_weights(CONFIG, seed=7, packed_format="gguf:Q4_1")
    compiled = poot.compile(build_decoder(CONFIG, w).graph, vulkan_target)
    ops = Counter(e.op.name for e in compiled.graph.eqns())
    assert set(OFFERED) <= set(compiled.table.ops) and ops["GatedContraction"] == CONFIG.layers
    assert ops["RopeUpdateSlice"] == CONFIG.layers and ops["DynamicUpdateSlice"] == CONFIG.layers
    assert ops["FreshKVAttention"] == CONFIG.layers and "Attention" not in ops
    if vulkan_target[1].is_software:
        assert ops["FusedRow"] == 2 * CONFIG.layers + 1 and "NormedPackedContraction" not in ops
        assert "NormedPackedContraction is declared but not elected" in compiled.explain()
    else:
        assert "FusedRow" not in ops and ops["NormedPackedContraction"] == CONFIG.layers + 1
