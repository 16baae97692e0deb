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
from test_families import (BACKEND, IDS, check_logits, rel_err, skip_without,
                           write_tokenizer)
from test_moe_stacked_experts import stacked_experts
from test_phi3 import greedy_ids, numpy_greedy

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
    return numpy_greedy(lambda ids: forward(tensors, cfg, ids), IDS[:10], 8)


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


@pytest.mark.parametrize("backend", ["wgpu", "vulkan", "cuda"])
def test_greedy_tokens_on_gpu_apis(folders, greedy, backend):
    """The latent attention (keys and values of different widths, one KV head), the
    group-limited router and YaRN tables on GPU APIs (lavapipe here)."""
    import poot

    skip_without(backend)
    model = poot.load(str(folders[KEYS[0]][0]), backend=backend, max_seq=32,
                      prefill_tokens=6)
    assert greedy_ids(model, IDS[:10], 8) == greedy


@pytest.mark.parametrize("backend", ["cpu", "wgpu", "vulkan", "cuda"])
def test_v2_greedy_tokens_on_backends(folders, backend):
    """V2's softmax router, group-limited by each group's best score, with q through q_proj,
    on cpu and GPU APIs (lavapipe here): the numpy forward's greedy tokens."""
    import poot

    skip_without(backend)
    folder, cfg, tensors, _ = folders[KEYS[3]]
    want = numpy_greedy(lambda ids: forward(tensors, cfg, ids), IDS[:10], 8)
    model = poot.load(str(folder), backend=backend, max_seq=32, prefill_tokens=6)
    assert greedy_ids(model, IDS[:10], 8) == want


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


# -- GGUF as llama.cpp's converter writes DeepSeek (architecture deepseek2) -------------------
def write_gguf(path, cfg: dict, tensors: dict, *, split: bool = True, quantize: bool = False,
               fuse_gate_up: bool = False, drop: tuple[str, ...] = (),
               meta: dict | None = None, change: dict | None = None) -> dict:
    """The HF model `cfg`/`tensors` as llama.cpp's converter lays out a deepseek2 file:
    experts stacked [E, N, K], the choice bias as exp_probs_b.bias, kv_b split per head into
    attn_k_b [H, kv_rank, nope] (transposed) and attn_v_b [H, v, kv_rank] with one KV head
    and the latent's key/value lengths (`split`), or whole as older converters left it;
    RoPE pairs as stored; YaRN's mscale_all_dim as 0.1 x it. With `quantize`, every matrix
    whose rows are whole Q8_0 blocks is Q8_0. `fuse_gate_up`: gate and up experts as one
    ffn_gate_up_exps [E, 2I, H] (llama.cpp's --fuse-gate-up-exps). `drop`: metadata keys
    (after "deepseek2.") left out, `meta`: their values replaced; `change`: tensors
    replaced by name. Returns the HF-named tensors as the file decodes them."""
    import gguf
    from gguf.quants import dequantize, quantize as quantize_q8
    from test_gguf_families import close_gguf

    q8 = gguf.GGMLQuantizationType.Q8_0
    w = gguf.GGUFWriter(str(path), "deepseek2")
    a = "deepseek2."
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    v3 = cfg["model_type"] == "deepseek_v3"
    keys = {"context_length": (w.add_uint32, cfg["max_position_embeddings"]),
            "embedding_length": (w.add_uint32, DIM), "block_count": (w.add_uint32, LAYERS),
            "feed_forward_length": (w.add_uint32, FFN),
            "attention.head_count": (w.add_uint32, HEADS),
            "attention.head_count_kv": (w.add_uint32, 1 if split else HEADS),
            "attention.layer_norm_rms_epsilon": (w.add_float32, cfg["rms_norm_eps"]),
            "rope.freq_base": (w.add_float32, rs.get("rope_theta", cfg.get("rope_theta"))),
            "leading_dense_block_count": (w.add_uint32, cfg["first_k_dense_replace"]),
            "vocab_size": (w.add_uint32, VOCAB),
            "attention.kv_lora_rank": (w.add_uint32, KV_RANK),
            "attention.key_length": (w.add_uint32, KV_RANK + ROPE if split else NOPE + ROPE),
            "attention.value_length": (w.add_uint32, KV_RANK if split else V_DIM),
            "expert_feed_forward_length": (w.add_uint32, MOE_FFN),
            "expert_count": (w.add_uint32, EXPERTS),
            "expert_shared_count": (w.add_uint32, SHARED),
            "expert_weights_scale": (w.add_float32, cfg["routed_scaling_factor"]),
            "expert_used_count": (w.add_uint32, TOP),
            "rope.dimension_count": (w.add_uint32, ROPE)}
    if cfg["q_lora_rank"]:
        keys["attention.q_lora_rank"] = (w.add_uint32, cfg["q_lora_rank"])
    if split:
        keys["attention.key_length_mla"] = (w.add_uint32, NOPE + ROPE)
        keys["attention.value_length_mla"] = (w.add_uint32, V_DIM)
    if v3:
        keys["expert_gating_func"] = (w.add_uint32, int(gguf.ExpertGatingFuncType.SIGMOID))
    if v3 and cfg.get("norm_topk_prob"):
        keys["expert_weights_norm"] = (w.add_bool, True)
    if cfg.get("topk_method", "noaux_tc") != "greedy":
        keys["expert_group_count"] = (w.add_uint32, cfg["n_group"])
        keys["expert_group_used_count"] = (w.add_uint32, cfg["topk_group"])
    if rs.get("rope_type") == "yarn":
        keys["rope.scaling.type"] = (w.add_string, "yarn")
        keys["rope.scaling.factor"] = (w.add_float32, rs["factor"])
        keys["rope.scaling.original_context_length"] = (
            w.add_uint32, rs["original_max_position_embeddings"])
        keys["rope.scaling.yarn_log_multiplier"] = (w.add_float32, 0.1 * rs["mscale_all_dim"])
    for name, (add, value) in keys.items():
        if name not in drop:
            add(a + name, (meta or {}).get(name, value))
    out = {n: np.asarray(t, np.float32) for n, t in tensors.items()}

    def add(name, array, hf=None):
        """Writes the GGUF tensor; returns the values the file decodes to."""
        array = np.ascontiguousarray((change or {}).get(name, array), np.float32)
        if quantize and array.ndim > 1 and array.shape[-1] % 32 == 0:
            q = quantize_q8(array, q8)
            w.add_tensor(name, q, raw_dtype=q8)
            array = dequantize(q, q8).reshape(array.shape)
        else:
            w.add_tensor(name, array)
        if hf is not None:
            out[hf] = array
        return array

    add("token_embd.weight", out["model.embed_tokens.weight"], "model.embed_tokens.weight")
    add("output_norm.weight", out["model.norm.weight"], "model.norm.weight")
    add("output.weight", out["lm_head.weight"], "lm_head.weight")
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm",
                 "self_attn.q_b_proj": "attn_q_b", "self_attn.q_proj": "attn_q",
                 "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
                 "self_attn.kv_a_layernorm": "attn_kv_a_norm", "self_attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
                 **{f"mlp.shared_experts.{x}_proj": f"ffn_{x}_shexp"
                    for x in ("gate", "up", "down")}}
        for hf, g in names.items():
            if p + hf + ".weight" in out:
                add(b + g + ".weight", out[p + hf + ".weight"], p + hf + ".weight")
        if p + "mlp.gate.e_score_correction_bias" in out:
            add(b + "exp_probs_b.bias", out[p + "mlp.gate.e_score_correction_bias"],
                p + "mlp.gate.e_score_correction_bias")
        kv_b = out[p + "self_attn.kv_b_proj.weight"]
        if split:
            per_head = kv_b.reshape(HEADS, NOPE + V_DIM, KV_RANK)
            k_b = add(b + "attn_k_b.weight", np.swapaxes(per_head[:, :NOPE], 1, 2))
            v_b = add(b + "attn_v_b.weight", per_head[:, NOPE:])
            if k_b.shape == (HEADS, KV_RANK, NOPE):    # (a hostile file's may not be)
                out[p + "self_attn.kv_b_proj.weight"] = np.concatenate(
                    [np.swapaxes(k_b, 1, 2), v_b], 1).reshape(kv_b.shape)
        else:
            add(b + "attn_kv_b.weight", kv_b, p + "self_attn.kv_b_proj.weight")
        if i < cfg["first_k_dense_replace"]:
            continue
        stacks = {x: np.stack([out[f"{p}mlp.experts.{j}.{x}_proj.weight"]
                               for j in range(EXPERTS)]) for x in ("gate", "up", "down")}
        if fuse_gate_up:
            both = add(f"{b}ffn_gate_up_exps.weight",
                       np.concatenate([stacks["gate"], stacks["up"]], 1))
            decoded = {"gate": both[:, :MOE_FFN], "up": both[:, MOE_FFN:],
                       "down": add(f"{b}ffn_down_exps.weight", stacks["down"])}
        else:
            decoded = {x: add(f"{b}ffn_{x}_exps.weight", stack) for x, stack in stacks.items()}
        for x, stack in decoded.items():
            for j in range(EXPERTS):
                out[f"{p}mlp.experts.{j}.{x}_proj.weight"] = stack[j]
    close_gguf(w)
    return out


def gguf_config(version: int = 3, q_rank: int | None = Q_RANK) -> dict:
    """A config a deepseek2 GGUF can say all of: mscale equal to mscale_all_dim (as in
    DeepSeek's own checkpoints: llama.cpp's reading assumes it), V2 without YaRN."""
    cfg = config(4, q_rank, version)
    if version == 3:
        cfg["rope_scaling"] = {**cfg["rope_scaling"], "mscale": 0.7, "mscale_all_dim": 0.7}
    else:
        cfg["rope_scaling"] = None
    return cfg


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """(path, HF config, tensors as decoded, numpy logits of IDS) per layout."""
    out = {}
    for key, (version, q_rank, split, quantize, fuse) in {
            "v3-split-q8_0": (3, Q_RANK, True, True, False),
            "v3-fused-gate-up-q8_0": (3, Q_RANK, True, True, True),
            "v2-legacy-f32": (2, None, False, False, False)}.items():
        cfg = gguf_config(version, q_rank)
        path = tmp_path_factory.mktemp("deepseek-gguf") / f"{key}.gguf"
        tensors = write_gguf(path, cfg, random_tensors(cfg), split=split, quantize=quantize,
                             fuse_gate_up=fuse)
        out[key] = path, cfg, tensors, forward(tensors, cfg, IDS)
    return out


def gguf_model(path, backend: str):
    from poot.models.loader import open_model
    from poot.models.runner import Model
    from poot.plugin import select_backend

    ckpt, c = open_model(str(path), max_seq=32)
    b, dev = select_backend(backend)
    return Model(ckpt, c, None, b, dev, prefill_tokens=6)


@pytest.mark.parametrize("key", ["v3-split-q8_0", "v3-fused-gate-up-q8_0", "v2-legacy-f32"])
def test_gguf_matches_numpy_reference(gguf_files, key):
    """llama.cpp's layouts (kv_b split with one KV head, and whole; gate and up experts
    apart, and fused) give the numpy forward's logits of the tensors as the file decodes
    them: one step, then prefill and decode."""
    path, cfg, tensors, want = gguf_files[key]
    model = gguf_model(path, BACKEND)
    assert model.config.mla.split_kv_b == key.startswith("v3")
    assert rel_err(model.prefill_logits(IDS[:12]), want[:12]) < 1e-4
    assert rel_err(session_logits(model, IDS[:14], 11), want[10:14]) < 1e-4


def test_gguf_config_reads_as_the_folder(tmp_path, gguf_files):
    """The file's metadata gives the folder's config (the file says mscale through
    mscale_all_dim, and its arch): MLA sizes, router, groups, scaling, dense layers."""
    from dataclasses import replace

    from poot.models.loader import open_model
    from poot_quant.safetensors_dir import write_folder

    path, cfg, tensors, want = gguf_files["v3-split-q8_0"]
    folder = tmp_path / "hf"
    write_folder(folder, tensors, cfg, 1, None)
    write_tokenizer(folder)
    hf = open_model(str(folder), max_seq=32)[1]
    ckpt, c = open_model(str(path), max_seq=32)
    assert ckpt.tensors["blk.1.ffn_up_exps.weight"].packed.format == "gguf:Q8_0"
    assert c.mla == replace(hf.mla, split_kv_b=True)
    assert abs(c.attn_scale - hf.attn_scale) < 1e-6 and abs(c.norm_eps - hf.norm_eps) < 1e-9
    assert c == replace(hf, arch="deepseek2", mla=c.mla, attn_scale=c.attn_scale,
                        norm_eps=c.norm_eps, rope_base=c.rope_base)


def test_gguf_on_cpu(gguf_files):
    """The Q8_0 file with kv_b split on cpu."""
    path, cfg, tensors, want = gguf_files["v3-split-q8_0"]
    assert rel_err(gguf_model(path, "cpu").prefill_logits(IDS[:12]), want[:12]) < 1e-4


@pytest.fixture(scope="module")
def gguf_greedy(gguf_files) -> list[int]:
    """The numpy forward's 8 greedy tokens after IDS[:10], of the Q8_0 file with kv_b split
    (as it decodes)."""
    path, cfg, tensors, want = gguf_files["v3-split-q8_0"]
    return numpy_greedy(lambda ids: forward(tensors, cfg, ids), IDS[:10], 8)


@pytest.mark.parametrize("backend", ["wgpu", "vulkan", "cuda"])
def test_gguf_greedy_tokens_on_gpu_apis(gguf_files, gguf_greedy, backend):
    """The deepseek2 file's absorbed layout (attn_k_b / attn_v_b as Q8_0 packed stacks, the
    experts' Q8_0 stacks) on GPU APIs (lavapipe here): the numpy forward's greedy tokens."""
    skip_without(backend)
    model = gguf_model(gguf_files["v3-split-q8_0"][0], backend)
    assert greedy_ids(model, IDS[:10], 8) == gguf_greedy


@pytest.mark.parametrize("drop, meta, change, message", [
    (("attention.kv_lora_rank",), None, None, "lacks 'deepseek2.attention.kv_lora_rank'"),
    (("rope.scaling.yarn_log_multiplier",), None, None,
     "lacks 'deepseek2.rope.scaling.yarn_log_multiplier': deepseek2 YaRN scaling needs it"),
    ((), {"attention.head_count_kv": HEADS}, None,
     rf"deepseek2.attention.head_count_kv = {HEADS} contradicts MLA's latent cache"),
    ((), {"expert_gating_func": 3}, None,
     "deepseek2.expert_gating_func = 3 is neither softmax"),
    ((), None, {"blk.2.attn_k_b.weight": np.zeros((HEADS, NOPE, KV_RANK))},
     rf"tensor 'blk.2.attn_k_b.weight' is \[{HEADS}, {NOPE}, {KV_RANK}\], but the deepseek2 "
     rf"metadata implies \[{HEADS}, {KV_RANK}, {NOPE}\]"),
])
def test_hostile_gguf_is_refused_naming_file_and_key(tmp_path, drop, meta, change, message):
    from poot.errors import ConfigError
    from poot.models.loader import open_model

    cfg = gguf_config()
    path = tmp_path / "hostile.gguf"
    write_gguf(path, cfg, random_tensors(cfg), drop=drop, meta=meta, change=change)
    with pytest.raises(ConfigError, match=message) as err:
        open_model(str(path), max_seq=32)
    assert str(path) in str(err.value)


def test_gguf_missing_tensor_is_refused_by_name(tmp_path):
    from poot.errors import ConfigError
    from poot.models.loader import open_model

    cfg = gguf_config()
    tensors = random_tensors(cfg)
    del tensors["model.layers.2.mlp.gate.e_score_correction_bias"]
    path = tmp_path / "no-bias.gguf"
    write_gguf(path, cfg, tensors)
    with pytest.raises(ConfigError, match=r"lacks tensor .blk.2.exp_probs_b.bias."):
        open_model(str(path), max_seq=32)


# -- transformers 5's stacked experts ----------------------------------------------------------
@pytest.fixture(scope="module")
def stacked(tmp_path_factory, folders):
    """(folder with the experts stacked, the numpy forward's logits of IDS, its 8 greedy
    tokens after IDS[:10]) of the 5.x-spelled V3 folder's weights."""
    from poot_quant.safetensors_dir import write_folder

    folder, cfg, tensors, want = folders[5, Q_RANK, 3]
    out = tmp_path_factory.mktemp("deepseek-stacked") / "stacked"
    write_folder(out, stacked_experts(tensors), cfg, 1, None)
    write_tokenizer(out)
    greedy = numpy_greedy(lambda ids: forward(tensors, cfg, ids), IDS[:10], 8)
    return out, want, greedy


def test_transformers_5_stacked_experts(stacked):
    """A folder holding the experts stacked as transformers 5 does gives the per-expert
    folder's logits (and the numpy forward's)."""
    import poot

    out, want, _ = stacked
    model = poot.load(str(out), backend=BACKEND, max_seq=32, prefill_tokens=6)
    assert rel_err(model.prefill_logits(IDS[:12]), want[:12]) < 1e-4
    assert rel_err(session_logits(model, IDS[:14], 11), want[10:14]) < 1e-4


@pytest.mark.parametrize("backend", ["cpu", "wgpu", "vulkan", "cuda"])
def test_stacked_experts_greedy_tokens_on_backends(stacked, backend):
    """The stacked experts (served as GGUF's expert stacks, gate|up split by rows) on cpu
    and GPU APIs (lavapipe here): the numpy forward's greedy tokens."""
    import poot

    skip_without(backend)
    out, _, greedy = stacked
    model = poot.load(str(out), backend=backend, max_seq=32, prefill_tokens=6)
    assert greedy_ids(model, IDS[:10], 8) == greedy


def test_stacked_experts_of_the_wrong_shape_are_refused(tmp_path, folders):
    from poot.errors import ConfigError
    from poot.models.loader import open_model
    from poot_quant.safetensors_dir import write_folder

    folder, cfg, tensors, want = folders[5, Q_RANK, 3]
    stacked = stacked_experts(tensors)
    name = "model.layers.2.mlp.experts.gate_up_proj"
    stacked[name] = np.ascontiguousarray(np.swapaxes(stacked[name], 1, 2))
    out = tmp_path / "transposed"
    write_folder(out, stacked, cfg, 1, None)
    write_tokenizer(out)
    with pytest.raises(ConfigError, match=rf"tensor '{name}' is \[{EXPERTS}, {DIM}, "
                                          rf"{2 * MOE_FFN}\], but the config implies"):
        open_model(str(out))
