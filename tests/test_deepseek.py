"""DeepSeek-V3 / V2 (model_type deepseek_v3, deepseek_v2): multi-head latent attention with
the latent cache and absorbed up-projections, YaRN with mscale, a first dense layer, then
shared plus routed experts under V3's group-limited sigmoid router (or V2's softmax one);
from random-weight HF folders in both transformers spellings of the config, against the
numpy forward of tests/reference_deepseek.py (which up-projects per head, unabsorbed);
greedy tokens equal on reference and cpu.
"""
from __future__ import annotations

import numpy as np
import pytest
from reference_deepseek import forward
from test_families import BACKEND, IDS, check_logits, rel_err, write_tokenizer
from test_phi3 import greedy_ids

VOCAB, DIM, HEADS, LAYERS, FFN = 300, 64, 4, 3, 96
Q_RANK, KV_RANK, NOPE, ROPE, V_DIM = 20, 24, 16, 8, 12
EXPERTS, GROUPS, TOP_GROUPS, TOP, MOE_FFN, SHARED = 8, 4, 2, 3, 16, 2
ORIGINAL, FACTOR = 16, 4.0


def config(spelling: int = 4, q_rank: int | None = Q_RANK, version: int = 3) -> dict:
    """The config.json transformers `spelling` (4 or 5) writes."""
    cfg = {"architectures": [f"DeepseekV{version}ForCausalLM"],
           "model_type": f"deepseek_v{version}", "hidden_size": DIM,
           "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "num_key_value_heads": HEADS, "intermediate_size": FFN,
           "moe_intermediate_size": MOE_FFN, "vocab_size": VOCAB,
           "max_position_embeddings": int(ORIGINAL * FACTOR), "rms_norm_eps": 1e-6,
           "q_lora_rank": q_rank, "kv_lora_rank": KV_RANK, "qk_nope_head_dim": NOPE,
           "qk_rope_head_dim": ROPE, "v_head_dim": V_DIM, "head_dim": ROPE,
           "n_routed_experts": EXPERTS, "n_shared_experts": SHARED,
           "num_experts_per_tok": TOP, "n_group": GROUPS, "topk_group": TOP_GROUPS,
           "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
           "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
           "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
           "bos_token_id": 1, "eos_token_id": 2, "pretraining_tp": 1}
    if version == 3:
        cfg.update({"norm_topk_prob": True, "rope_interleave": True})
        rope = {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings":
                ORIGINAL, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.9,
                "mscale_all_dim": 0.7}
    else:
        cfg.update({"topk_method": "group_limited_greedy", "norm_topk_prob": False})
        rope = {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings":
                ORIGINAL, "beta_fast": 32.0, "beta_slow": 1.0}
    if spelling == 4:
        return {**cfg, "rope_theta": 10000.0, "rope_scaling": rope, "torch_dtype": "float32"}
    return {**cfg, "rope_parameters": {**rope, "rope_theta": 10000.0}, "dtype": "float32"}


def random_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def mat(*shape, scale=None):
        return (rng.standard_normal(shape) * (scale or shape[-1] ** -0.5)).astype(np.float32)

    def norm(d):
        return (1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32)

    def mlp(p, f):
        w[p + "gate_proj.weight"], w[p + "up_proj.weight"] = mat(f, DIM), mat(f, DIM)
        w[p + "down_proj.weight"] = mat(DIM, f)

    w = {"model.embed_tokens.weight": mat(VOCAB, DIM, scale=1.0),
         "model.norm.weight": norm(DIM), "lm_head.weight": mat(VOCAB, DIM)}
    for i in range(LAYERS):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        w[p + "input_layernorm.weight"] = norm(DIM)
        w[p + "post_attention_layernorm.weight"] = norm(DIM)
        if cfg["q_lora_rank"]:
            w[a + "q_a_proj.weight"] = mat(Q_RANK, DIM)
            w[a + "q_a_layernorm.weight"] = norm(Q_RANK)
            w[a + "q_b_proj.weight"] = mat(HEADS * (NOPE + ROPE), Q_RANK)
        else:
            w[a + "q_proj.weight"] = mat(HEADS * (NOPE + ROPE), DIM)
        w[a + "kv_a_proj_with_mqa.weight"] = mat(KV_RANK + ROPE, DIM)
        w[a + "kv_a_layernorm.weight"] = norm(KV_RANK)
        w[a + "kv_b_proj.weight"] = mat(HEADS * (NOPE + V_DIM), KV_RANK)
        w[a + "o_proj.weight"] = mat(DIM, HEADS * V_DIM)
        if i < cfg["first_k_dense_replace"]:
            mlp(p + "mlp.", FFN)
            continue
        w[p + "mlp.gate.weight"] = mat(EXPERTS, DIM, scale=1.0)
        if cfg["model_type"] == "deepseek_v3":
            w[p + "mlp.gate.e_score_correction_bias"] = mat(EXPERTS, scale=0.1)
        for j in range(EXPERTS):
            mlp(f"{p}mlp.experts.{j}.", MOE_FFN)
        mlp(p + "mlp.shared_experts.", MOE_FFN * SHARED)
    return w


def make_folder(tmp_path, spelling: int = 4, q_rank: int | None = Q_RANK, version: int = 3,
                **extra):
    from poot_quant.safetensors_dir import write_folder

    cfg = {**config(spelling, q_rank, version), **extra}
    tensors = random_tensors(cfg)
    folder = tmp_path / f"deepseek-v{version}-t{spelling}-q{q_rank}"
    write_folder(folder, tensors, cfg, 1, None)
    write_tokenizer(folder)
    return folder, cfg, tensors


KEYS = [(4, Q_RANK, 3), (5, Q_RANK, 3), (4, None, 3), (5, None, 2)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(folder, config, tensors, numpy logits of IDS) per (spelling, q_lora_rank, version)."""
    out = {}
    for key in KEYS:
        folder, cfg, tensors = make_folder(tmp_path_factory.mktemp("deepseek"), *key)
        out[key] = folder, cfg, tensors, forward(tensors, cfg, IDS)
    return out


@pytest.mark.parametrize("key", KEYS, ids=["v3", "v3-t5", "v3-no-q-lora", "v2-t5"])
def test_folder_matches_numpy_reference(folders, key):
    """One step of a 20-token prompt, then the session: chunked prefill and decode."""
    import poot

    folder, cfg, tensors, want = folders[key]
    model = poot.load(str(folder), backend=BACKEND, max_seq=32, prefill_tokens=6)
    check_logits(model, want)


def test_the_cache_holds_the_latent(folders):
    """Each layer's one State is the latent and the RoPE key per position, not per-head
    keys and values."""
    import poot

    model = poot.load(str(folders[KEYS[0]][0]), backend=BACKEND, max_seq=32, prefill_tokens=6)
    g = model.step_graph(1)
    states = {g.meta(v).identity.label: g.type_of(v).shape for v, _ in g.state()}
    assert states == {f"blk.{i}.kv_latent": (1, 32, KV_RANK + ROPE) for i in range(LAYERS)}


def test_each_trait_changes_the_logits(folders):
    """The choice bias, the groups, the scaling factor, mscale and the interleaved RoPE each
    change the reference's logits, so the comparisons above test them."""
    folder, cfg, tensors, want = folders[KEYS[0]]
    ids = IDS[:12]
    want = want[:12]
    flat = {**tensors}
    for name in [n for n in flat if n.endswith("e_score_correction_bias")]:
        flat[name] = np.zeros_like(flat[name])
    rope = {**cfg["rope_scaling"], "mscale_all_dim": 1.0}
    for other in (forward(flat, cfg, ids), forward(tensors, {**cfg, "topk_group": GROUPS}, ids),
                  forward(tensors, {**cfg, "routed_scaling_factor": 1.0}, ids),
                  forward(tensors, {**cfg, "rope_scaling": rope}, ids)):
        assert rel_err(other, want) > 1e-3


def test_config_in_both_spellings(folders):
    from poot.models.deepseek import Mla, Routing
    from poot.models.loader import open_model

    c4, c5 = (open_model(str(folders[s, Q_RANK, 3][0]))[1] for s in (4, 5))
    assert c4 == c5
    assert c4.mla == Mla(Q_RANK, KV_RANK, NOPE, ROPE, V_DIM)
    assert c4.routing == Routing("sigmoid", GROUPS, TOP_GROUPS, "top2", 2.5, True)
    assert (c4.head_dim, c4.rot, c4.experts, c4.experts_used, c4.expert_ffn, c4.shared_ffn,
            c4.dense_layers, c4.norm_topk) == (NOPE + ROPE, ROPE, EXPERTS, TOP, MOE_FFN,
                                               MOE_FFN * SHARED, 1, True)
    v2 = open_model(str(folders[5, None, 2][0]))[1]
    assert v2.routing == Routing("softmax", GROUPS, TOP_GROUPS, "max", 2.5, False)
    assert v2.mla.q_rank == 0 and not v2.norm_topk


@pytest.fixture(scope="module")
def greedy(folders) -> list[int]:
    """The numpy forward's 8 greedy tokens after IDS[:10]."""
    folder, cfg, tensors, want = folders[KEYS[0]]
    out: list[int] = []
    for _ in range(8):
        out.append(int(np.argmax(forward(tensors, cfg, IDS[:10] + out)[-1])))
    assert len(set(out)) > 2, out
    return out


def session_logits(model, ids, prefill: int) -> np.ndarray:
    """The session's logits of ids[prefill - 1] (after prefilling ids[:prefill]), then of
    each later id, decoded one at a time."""
    session = model.session()
    session.open("s")
    try:
        out = [session.prefill("s", ids[:prefill])]
        out += [session.decode({"s": i})["s"] for i in ids[prefill:]]
        return np.stack(out)
    finally:
        session.close("s")


def test_cpu_logits_and_greedy_tokens(folders, greedy):
    """cpu's logits against the numpy forward through the session (chunked prefill, then
    decode), and the numpy forward's greedy tokens on reference and cpu. (The session's two
    step shapes only: each new shape costs cpu a compile.)"""
    import poot

    folder, cfg, tensors, want = folders[KEYS[0]]
    models = {b: poot.load(str(folder), backend=b, max_seq=32, prefill_tokens=6)
              for b in ("reference", "cpu")}
    assert rel_err(session_logits(models["cpu"], IDS, 15), want[14:]) < 1e-4
    for backend, model in models.items():
        assert greedy_ids(model, IDS[:10], 8) == greedy, backend


@pytest.mark.parametrize("kv_dtype, tolerance", [("f16", 2e-3), ("q8_0", 3e-2)])
def test_latent_cache_in_16_and_8_bits(folders, kv_dtype, tolerance):
    """The latent rows stored as f16 or q8_0 (24 + 8 values: one q8_0 block)."""
    import poot

    folder, cfg, tensors, want = folders[KEYS[0]]
    model = poot.load(str(folder), backend=BACKEND, max_seq=32, prefill_tokens=6,
                      kv_dtype=kv_dtype)
    err = rel_err(session_logits(model, IDS, 15), want[14:])
    assert 1e-6 < err < tolerance, err


def test_paged_batch(folders):
    """The paged pool of latent rows (as poot serve runs): two sequences of different
    lengths prefilled, then decoding side by side in one batch."""
    import poot

    folder, cfg, tensors, want = folders[KEYS[0]]
    other_ids = IDS[::-1][:17]
    other = forward(tensors, cfg, other_ids)
    model = poot.load(str(folder), backend=BACKEND, kv="paged", max_seq=32, prefill_tokens=6)
    session = model.session("paged", batch=2)
    prompts = {0: IDS[:16], 1: other_ids[:14]}
    for seq, ids in prompts.items():
        session.open(seq)
        session.prefill(seq, ids)
    got = {0: [], 1: []}
    for step in range(3):
        out = session.decode({0: IDS[16 + step], 1: other_ids[14 + step]})
        for seq in got:
            got[seq].append(out[seq])
    for seq in got:
        session.close(seq)
    assert rel_err(np.stack(got[0]), want[16:19]) < 1e-4
    assert rel_err(np.stack(got[1]), other[14:17]) < 1e-4


@pytest.mark.parametrize("extra, message", [
    ({"frobnicate": 1}, "frobnicate = 1: a deepseek_v3 setting poot does not implement"),
    ({"attention_bias": True}, "attention_bias = True: q/k/v/o biases are implemented for "),
    ({"rope_interleave": False}, "rope_interleave = False"),
    ({"topk_method": "greedy"}, "topk_method = 'greedy': poot runs deepseek_v3 with noaux_tc"),
    ({"scoring_func": "softmax"}, "scoring_func = 'softmax'"),
    ({"moe_layer_freq": 2}, "moe_layer_freq = 2"),
    ({"head_dim": 24}, "head_dim = 24: contradicts the MLA sizes"),
    ({"num_key_value_heads": 2}, "num_key_value_heads = 2: MLA has one key per head"),
])
def test_unimplemented_or_bad_keys_are_refused_by_name(tmp_path, extra, message):
    from poot.errors import PootError
    from poot.models.loader import open_model

    folder, _, _ = make_folder(tmp_path, **extra)
    with pytest.raises(PootError, match=message):
        open_model(str(folder))


def test_v2_settings_transformers_and_deepseek_disagree_on_are_refused(tmp_path):
    from poot.errors import CheckpointError
    from poot.models.loader import open_model

    folder, _, _ = make_folder(tmp_path, 4, None, 2, norm_topk_prob=True)
    with pytest.raises(CheckpointError, match="norm_topk_prob = True: DeepSeek's V2 code"):
        open_model(str(folder))


def test_deepseek_keys_belong_to_deepseek(tmp_path):
    from poot.errors import CheckpointError
    from poot.models.loader import open_model
    from test_families import make_folder as family_folder

    folder, _, _ = family_folder(tmp_path, "llama", kv_lora_rank=32)
    with pytest.raises(CheckpointError, match="kv_lora_rank = 32: a DeepSeek setting"):
        open_model(str(folder))


def test_info_shows_what_was_read(folders, capsys):
    from poot.cli import main

    assert main(["info", str(folders[KEYS[0]][0])]) == 0
    out = capsys.readouterr().out
    assert (f"latent       MLA: cache of {KV_RANK} latent + {ROPE} RoPE values per position "
            f"(absorbed up-projections); heads nope {NOPE} + rope {ROPE}, v {V_DIM}; q through "
            f"a rank-{Q_RANK} latent") in out
    assert (f"experts      {EXPERTS} of hidden size {MOE_FFN}, top {TOP} per token by sigmoid "
            f"scores with a choice bias, {TOP_GROUPS} of {GROUPS} groups kept, weights "
            f"renormalized, times 2.5; shared experts {MOE_FFN * SHARED} (no gate); first 1 "
            f"layers dense") in out
    assert "scaling yarn x4, original context 16" in out


@pytest.mark.parametrize("backend", ["wgpu", "vulkan"])
def test_greedy_tokens_on_gpu_apis(folders, greedy, backend):
    """The latent attention (keys and values of different widths, one KV head), the
    group-limited router and YaRN tables on GPU APIs (lavapipe here)."""
    import poot
    from poot.errors import PootError
    from poot.plugin import select_backend

    try:
        select_backend(backend)
    except PootError as exc:
        pytest.skip(f"no {backend} device: {exc}")
    model = poot.load(str(folders[KEYS[0]][0]), backend=backend, max_seq=32,
                      prefill_tokens=6)
    assert greedy_ids(model, IDS[:10], 8) == greedy


def test_steps_fuse_the_latent_attention(folders):
    """compile forms one Attention per layer from the latent chain (one KV head, keys
    kv_rank + rope wide, values kv_rank), on reference and cpu, dense and paged."""
    import poot

    for backend in ("reference", "cpu"):
        model = poot.load(str(folders[KEYS[0]][0]), backend=backend, max_seq=32,
                          prefill_tokens=6)
        for kv, batch in (("dense", 1), ("paged", 2)):
            names = [e.op.name for e in model.step_graph(1, batch, kv).eqns()]
            assert names.count("Attention") == LAYERS, (backend, kv)


def test_multi_token_prediction_layers_are_not_read(tmp_path, folders):
    """DeepSeek-V3 checkpoints append num_nextn_predict_layers MTP layers after the
    decoder; they load, and change nothing."""
    import poot
    from poot_quant.safetensors_dir import write_folder

    folder, cfg, tensors, want = folders[KEYS[0]]
    last = f"model.layers.{LAYERS - 1}."
    mtp = {n.replace(last, f"model.layers.{LAYERS}."): a for n, a in tensors.items()
           if n.startswith(last)}
    mtp[f"model.layers.{LAYERS}.eh_proj.weight"] = np.zeros((DIM, 2 * DIM), np.float32)
    mtp[f"model.layers.{LAYERS}.enorm.weight"] = np.ones(DIM, np.float32)
    out = tmp_path / "mtp"
    write_folder(out, {**tensors, **mtp}, {**cfg, "num_nextn_predict_layers": 1}, 1, None)
    write_tokenizer(out)
    model = poot.load(str(out), backend=BACKEND, max_seq=32, prefill_tokens=6)
    assert model.config.layers == LAYERS
    assert rel_err(model.prefill_logits(IDS[:8]), want[:8]) < 1e-4


def test_v2_greedy_routing(tmp_path):
    """deepseek_v2's topk_method greedy: softmax top-k over all experts, no groups."""
    import poot
    from poot.models.deepseek import Routing

    folder, cfg, tensors = make_folder(tmp_path, 4, Q_RANK, 2, topk_method="greedy")
    model = poot.load(str(folder), backend=BACKEND, max_seq=32, prefill_tokens=6)
    assert model.config.routing == Routing("softmax", 1, 1, "max", 2.5, False)
    want = forward(tensors, cfg, IDS[:8])
    assert rel_err(model.prefill_logits(IDS[:8]), want) < 1e-4
    assert rel_err(forward(tensors, {**cfg, "topk_method": "group_limited_greedy"}, IDS[:8]),
                   want) > 1e-3
