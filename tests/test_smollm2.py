"""The main job end to end: the real SmolLM2-135M GGUF on the reference backend (its dense
and paged KV caches against each other also on the compiled cpu backend)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from test_families import skip_without

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model(smollm2_gguf):
    import poot

    return poot.load(str(smollm2_gguf), backend="reference", max_seq=128)


@pytest.fixture(scope="module")
def cpu_model(smollm2_gguf):
    import poot

    return poot.load(str(smollm2_gguf), backend="cpu", max_seq=128)


def _poot(*args, timeout=600):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "poot", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_python_api_answers_paris(model):
    text = "".join(model.generate(PROMPT, max_tokens=3))
    assert text.startswith(" Paris"), text
    assert model.stats.generated_tokens == 3 and model.stats.decode_tps > 0


def test_prefill_logits_match_the_independent_numpy_llama(model, smollm2_gguf):
    from reference_llama import prefill_logits

    ids = model.tokenize(PROMPT)
    got = model.prefill_logits(ids)
    want = prefill_logits(str(smollm2_gguf), ids)
    assert got.shape == want.shape == (len(ids), model.config.vocab)
    assert got.dtype == np.float32
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"max |poot - numpy llama| / max |logit| = {err:.2e}")
    assert err < 1e-3


def test_dense_and_paged_kv_give_the_same_32_greedy_tokens(cpu_model):
    """On the cpu backend, whose dense and paged steps run different attention kernels (on
    the reference backend the two forms meet in test_two_prompts_share_one_paged_pool); the
    paged sequence runs into its third block."""
    model = cpu_model
    ids = model.tokenize(PROMPT)

    def greedy(session):
        seq = "s"
        session.open(seq)
        try:
            logits = session.prefill(seq, ids)
            out = []
            for _ in range(32):
                tok = int(np.argmax(logits))
                out.append(tok)
                logits = session.decode({seq: tok})[seq]
            return out
        finally:
            session.close(seq)

    dense = greedy(model.session("dense"))
    session = model.session("paged", batch=1)
    paged = greedy(session)
    assert len(ids) < 2 * session.blocks.block < len(ids) + len(paged)
    assert dense == paged
    assert model.tokenizer.decode(dense).startswith(" Paris")


def test_greedy_text_on_cuda_equals_the_reference_backends(model, smollm2_gguf):
    """Prefill, then 12 greedy tokens on cuda (scripts/h200_families.sh runs it on the
    device; cpu, wgpu and vulkan run theirs in their packages' tests): the reference
    backend's text."""
    import poot

    skip_without("cuda")
    want = "".join(model.generate(PROMPT, max_tokens=12))
    cuda = poot.load(str(smollm2_gguf), backend="cuda", max_seq=128)
    assert "".join(cuda.generate(PROMPT, max_tokens=12)) == want and want.startswith(" Paris")


def test_two_prompts_share_one_paged_pool(model):
    outs = model.generate_many([PROMPT, "The capital of Germany is"], max_tokens=4)
    alone = "".join(model.generate("The capital of Germany is", max_tokens=4))
    assert outs[0].startswith(" Paris")
    assert outs[1] == alone


def test_poot_run_streams_paris_and_reports_speed(smollm2_gguf):
    r = _poot("run", str(smollm2_gguf), "--prompt", PROMPT, "--max-tokens", "4",
              "--backend", "reference", "--max-seq", "64")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(PROMPT + " Paris"), r.stdout
    assert "decode:" in r.stderr and "tok/s" in r.stderr


def test_poot_run_tp_2_prints_what_one_rank_does(smollm2_gguf, model):
    """Two ranks (threads over the reference runtime), the heads split 3+6 and the
    vocabulary in halves: the same greedy text as the unsharded model."""
    r = _poot("run", str(smollm2_gguf), "--prompt", PROMPT, "--max-tokens", "4",
              "--backend", "reference", "--max-seq", "64", "--tp", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout == PROMPT + "".join(model.generate(PROMPT, max_tokens=4)) + "\n"


def test_poot_info_and_graph(smollm2_gguf):
    r = _poot("info", str(smollm2_gguf))
    assert r.returncode == 0, r.stderr
    assert "llama: 30 layers" in r.stdout and "gguf:Q4_1" in r.stdout
    r = _poot("graph", str(smollm2_gguf))
    assert r.returncode == 0, r.stderr
    assert "after compile" in r.stdout and "Attention" in r.stdout
