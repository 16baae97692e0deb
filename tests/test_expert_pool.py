"""The expert pool (poot.models.expert_pool): MoE experts paged into a device pool with
fewer rows than experts must give the logits of the model with every expert resident, bit
for bit (same plans, same kernels, the pool row in place of the expert index), on random-
weight HF folders of the MoE families (tests/test_families.py builds them), and the numpy
forward of tests/reference_decoder.py within float32 tolerance.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from reference_decoder import forward
from test_families import IDS, make_folder, rel_err

BACKEND = os.environ.get("POOT_FAMILY_BACKEND", "reference")


def load(folder, pool, backend=BACKEND, kv="dense", prefill_tokens=2):
    import poot

    return poot.load(str(folder), backend=backend, max_seq=32, prefill_tokens=prefill_tokens,
                     kv=kv, expert_pool=pool)


def run_dense(model, ids=IDS[:20], prompt=12):
    """Logits after a chunked prefill of `prompt` tokens, then after each decode step."""
    s = model.session()
    s.open("s")
    try:
        out = [s.prefill("s", ids[:prompt])]
        out += [s.decode({"s": t})["s"] for t in ids[prompt:]]
    finally:
        s.close("s")
    return np.stack(out), s


def check_identical(tmp_path, family, rows, backend):
    folder, cfg, tensors = make_folder(tmp_path, family)
    model = load(folder, rows, backend)
    pooled, session = run_dense(model)     # prompt chunks of as many tokens as the pool holds
    full, _ = run_dense(load(folder, None, backend, prefill_tokens=model.prefill_tokens))
    assert rel_err(pooled, full) < 1e-6          # then bit for bit: the same kernels run
    assert np.array_equal(pooled, full)
    c = session.stepper.counters
    assert c["evicted"] > 0 and c["runs"] > c["steps"], c   # it paged and re-ran
    want = forward(tensors, cfg, IDS[:20])
    assert rel_err(pooled, want[11:20]) < 1e-4


@pytest.mark.parametrize("family,rows", [("qwen3-moe", 4), ("qwen2-moe", 3), ("mixtral", 2)])
def test_pooled_experts_give_the_fully_resident_logits(tmp_path, family, rows):
    check_identical(tmp_path, family, rows, BACKEND)


def test_pooled_experts_on_wgpu(tmp_path, wgpu_device):
    check_identical(tmp_path, "qwen3-moe", 4, "wgpu")


def test_a_batch_of_sequences_shares_the_pool(tmp_path):
    """Paged KV, two sequences decoded together: each row as with every expert resident."""
    folder, _, _ = make_folder(tmp_path, "qwen3-moe")

    def rows(model):
        s = model.session("paged", batch=2)
        for q in (0, 1):
            s.open(q)
        out = [s.prefill(0, IDS[:5]), s.prefill(1, IDS[7:10])]
        for i in range(4):
            got = s.decode({0: IDS[5 + i], 1: IDS[10 + i]})
            out += [got[0], got[1]]
        return np.stack(out), s

    full, _ = rows(load(folder, None))
    pooled, session = rows(load(folder, 4))
    assert np.array_equal(pooled, full)
    assert session.stepper.counters["paged"] > 0


def test_the_step_holds_the_pool_not_the_experts(tmp_path):
    from poot.models.expert_pool import SLOT, pool_state

    folder, cfg, _ = make_folder(tmp_path, "qwen3-moe")
    g = load(folder, 3).step_graph(1, 1, compiled=False)
    consts = [g.meta(v).identity.label for v in g.consts()]
    assert not [x for x in consts if "exps" in x]
    state = {g.meta(v).identity.label: g.type_of(v).shape for v, _ in g.state()}
    assert state[pool_state(0, "ffn_up_exps")] == (3, 32, 64)
    (vid, slot), = [(v, s) for v, s in g.slots() if g.meta(v).identity.label == SLOT]
    assert g.type_of(vid).shape == (cfg["num_hidden_layers"] * 6,) and slot.bound == 3


def test_pool_sizes_and_uses_it_cannot_serve_are_refused(tmp_path):
    from poot.errors import BindError, ConfigError

    folder, _, _ = make_folder(tmp_path, "qwen3-moe")     # 6 experts, 2 per token
    for rows in (1, 7):
        with pytest.raises(ConfigError, match="expert pool holds"):
            load(folder, rows)
    model = load(folder, 3)
    assert model.prefill_tokens == 1                      # 3 rows hold one token's experts
    with pytest.raises(BindError, match="at most 1 tokens.*decode steps of 2"):
        model.session("paged", batch=2)
    with pytest.raises(BindError, match="expert pool"):
        model.prefill_logits(IDS[:4])
    dense, _, _ = make_folder(tmp_path, "llama")
    with pytest.raises(ConfigError, match="mixture of experts"):
        load(dense, 2)
    windowed, _, _ = make_folder(tmp_path, "mixtral", sliding_window=8)
    with pytest.raises(ConfigError, match="sliding-window"):
        load(windowed, 2)


def test_an_undeclared_expert_map_role_is_refused(tmp_path):
    import poot.models.expert_pool as expert_pool
    from poot import plugin
    from poot.errors import IRError

    folder, _, _ = make_folder(tmp_path, "qwen3-moe")
    model = load(folder, 4)
    plugin.unregister(expert_pool)
    try:
        with pytest.raises(IRError, match="moe.expert_map.*not declared"):
            model.step_graph(1, 1, compiled=False)
    finally:
        plugin.register(expert_pool, "poot.expert-pool")
    model.step_graph(1, 1, compiled=False)


def test_poot_run_with_an_expert_pool_prints_the_same_text(tmp_path, capsys):
    from poot.cli import main
    from test_lora import tokenizer_sized_folder

    folder, _, _ = tokenizer_sized_folder(tmp_path, "mixtral")
    texts = []
    for extra in ([], ["--expert-pool", "2"]):
        assert main(["run", str(folder), "--prompt", "the cat sat", "--max-tokens", "6",
                     "--max-seq", "32", "--backend", "reference", "--quiet", *extra]) == 0
        captured = capsys.readouterr()
        texts.append(captured.out)
    assert texts[0] == texts[1]
    assert "expert pool:" in captured.err


def test_the_pager_evicts_the_least_recently_used_expert_the_step_does_not_need():
    """ExpertPager._page_in on a 3-row pool of 4 experts, writes recorded: a step's own
    experts are never evicted; the one used longest ago goes first."""
    from poot.models.expert_pool import ExpertPager, ExpertPool, pool_state
    from poot.models.llama import random_weights, tiny_config

    config = tiny_config(experts=4, experts_used=2, expert_ffn=8, layers=1)
    weights = random_weights(config, seed=2)
    pager = ExpertPager(ExpertPool(config, weights, 3))
    writes = []

    class Runtime:
        def write(self, buf, offset, array):
            writes.append((buf, offset // array.nbytes))

    class Executor:
        runtime = Runtime()

        class state:  # noqa: N801 - the executor's StateStore, as the pager reads it
            buffers = {pool_state(0, m): (m, "") for m in
                       ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}

    ex = Executor()
    assert pager._page_in(ex, 0, [2, 0])            # rows 0, 1
    assert pager._page_in(ex, 0, [1, 2])            # 1 -> row 2; 0 is now least recent
    assert not pager._page_in(ex, 0, [2, 1])        # resident: nothing written
    writes.clear()
    assert pager._page_in(ex, 0, [3, 1])            # evicts 0 (row 1), never 1
    assert sorted(writes) == [("ffn_down_exps", 1), ("ffn_gate_exps", 1), ("ffn_up_exps", 1)]
    assert dict(pager.resident[0]) == {2: 0, 1: 2, 3: 1}
    assert pager.map[0].tolist() == [0, 2, 0, 1]
    assert pager.counters["evicted"] == 1
