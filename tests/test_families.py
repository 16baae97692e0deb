"""Each decoder family from a random-weight HF folder built here (a few layers, small dims, a
tiny byte-level tokenizer), against the numpy forward of tests/reference_decoder.py.

Sliding-window families run prompts longer than their window: in one prefill step, through
the session's chunked prefill (short chunks, the last one padded) and decode over the ring
cache, and over a paged cache.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from reference_decoder import forward

#: the backend the families run on (scripts/h200_models.sh sets cuda)
BACKEND = os.environ.get("POOT_FAMILY_BACKEND", "reference")
VOCAB, DIM, HEADS, KV, HEAD_DIM, FFN = 300, 64, 4, 2, 16, 96

BASE = {"hidden_size": DIM, "num_hidden_layers": 3, "num_attention_heads": HEADS,
        "num_key_value_heads": KV, "head_dim": HEAD_DIM, "intermediate_size": FFN,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": VOCAB,
        "max_position_embeddings": 64, "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2}

FAMILIES = {
    "llama": {"model_type": "llama", "hidden_act": "silu"},
    "llama3-rope": {"model_type": "llama", "hidden_act": "silu", "rope_theta": 500000.0,
                    "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 16}},
    "linear-rope": {"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}},
    "qwen2-yarn": {"model_type": "qwen2", "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
    "qwen3": {"model_type": "qwen3", "tie_word_embeddings": True},
    "mistral-window": {"model_type": "mistral", "sliding_window": 8},
    "gemma3": {"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh",
               "sliding_window": 8, "rope_local_base_freq": 10000.0, "rope_theta": 1e6,
               "query_pre_attn_scalar": 24, "tie_word_embeddings": True,
               "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
               "final_logit_softcapping": None, "attn_logit_softcapping": None},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
                "router_aux_loss_coef": 0.02},
    "qwen2-moe": {"model_type": "qwen2_moe", "num_experts": 6, "num_experts_per_tok": 3,
                  "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
                  "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "qwen3-moe": {"model_type": "qwen3_moe", "num_experts": 6, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "norm_topk_prob": True},
}
WINDOWED = {"mistral-window", "gemma3"}


def random_tensors(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    kind = cfg["model_type"]

    def mat(n, k, scale=None):
        return (rng.standard_normal((n, k)) * (scale or k ** -0.5)).astype(np.float32)

    def norm(d):  # Gemma stores w of a (1 + w) norm
        return ((0.0 if kind == "gemma3_text" else 1.0)
                + 0.2 * rng.standard_normal(d)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(VOCAB, DIM, 1.0), "model.norm.weight": norm(DIM)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(VOCAB, DIM)
    q, kv = HEADS * HEAD_DIM, KV * HEAD_DIM
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(DIM)
        w[p + "post_attention_layernorm.weight"] = norm(DIM)
        for name, n, k in (("q_proj", q, DIM), ("k_proj", kv, DIM), ("v_proj", kv, DIM),
                           ("o_proj", DIM, q)):
            w[f"{p}self_attn.{name}.weight"] = mat(n, k)
        experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
        mixtral = kind == "mixtral"
        pre = p + ("block_sparse_moe." if mixtral else "mlp.")
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        ffn = cfg.get("moe_intermediate_size", FFN)
        for e in range(experts):
            for name, n, k in zip(names, (ffn, ffn, DIM), (DIM, DIM, ffn)):
                w[f"{pre}experts.{e}.{name}.weight"] = mat(n, k)
        if experts:
            w[pre + "gate.weight"] = mat(experts, DIM, 1.0)
        if cfg.get("shared_expert_intermediate_size"):
            sh = cfg["shared_expert_intermediate_size"]
            for name, n, k in (("gate_proj", sh, DIM), ("up_proj", sh, DIM),
                               ("down_proj", DIM, sh)):
                w[f"{pre}shared_expert.{name}.weight"] = mat(n, k)
            w[pre + "shared_expert_gate.weight"] = mat(1, DIM)
        for name, n, k in (() if experts else (("gate_proj", FFN, DIM), ("up_proj", FFN, DIM),
                                               ("down_proj", DIM, FFN))):
            w[f"{p}mlp.{name}.weight"] = mat(n, k)
        if kind in ("qwen2", "qwen2_moe"):
            for name, n in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                w[f"{p}self_attn.{name}.bias"] = (0.1 * rng.standard_normal(n)).astype(np.float32)
        if kind in ("qwen3", "qwen3_moe", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = norm(HEAD_DIM)
            w[p + "self_attn.k_norm.weight"] = norm(HEAD_DIM)
        if kind == "gemma3_text":
            w[p + "pre_feedforward_layernorm.weight"] = norm(DIM)
            w[p + "post_feedforward_layernorm.weight"] = norm(DIM)
    return w


def write_tokenizer(folder) -> None:
    """A byte-level BPE of the 256 byte symbols and two merges."""
    from poot.models.tokenizer import gpt2_unicode_to_byte
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    letters = sorted(gpt2_unicode_to_byte(), key=gpt2_unicode_to_byte().get)
    vocab = {c: i + 3 for i, c in enumerate(letters)}
    vocab.update({"<pad>": 0, "<s>": 1, "</s>": 2, "th": 259, "the": 260})
    tok = Tokenizer(models.BPE(vocab, [("t", "h"), ("th", "e")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False}))


def transformers5(cfg: dict) -> dict:
    """cfg (transformers 4.x spelling) as transformers 5 saves it: every RoPE setting in
    rope_parameters (per layer type for Gemma 3, whose rope_local_base_freq goes), experts
    counted by num_local_experts, Qwen2-MoE's q/k/v biases named by qkv_bias, layer_types
    spelled out, dtype for torch_dtype."""
    from reference_decoder import layer_windows

    gone = {"rope_theta", "rope_scaling", "rope_local_base_freq", "num_experts",
            "torch_dtype", "sliding_window_pattern"}
    out = {k: v for k, v in cfg.items() if k not in gone}
    rope = dict(cfg.get("rope_scaling") or {"rope_type": "default"})
    rope["rope_type"] = rope.pop("type", None) or rope["rope_type"]
    rope["rope_theta"] = cfg["rope_theta"]
    if cfg["model_type"] == "gemma3_text":
        rope = {"full_attention": rope, "sliding_attention": {
            "rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}}
    out.update(rope_parameters=rope, dtype=cfg["torch_dtype"], layer_types=[
        "full_attention" if w is None else "sliding_attention" for w in layer_windows(cfg)])
    if "num_experts" in cfg:
        out["num_local_experts"] = cfg["num_experts"]
    if cfg["model_type"] == "qwen2_moe":
        out["qkv_bias"] = True
    return out


def make_folder(tmp_path, family: str, spelling: int = 4, **extra):
    """A random-weight HF folder of the family, its config.json in transformers `spelling`
    (4 or 5); returns (folder, the 4.x config, tensors)."""
    from poot_quant.safetensors_dir import write_folder

    cfg = {**BASE, **FAMILIES[family], **extra}
    folder = tmp_path / f"{family}-v{spelling}"
    tensors = random_tensors(cfg, seed=len(family))
    write_folder(folder, tensors, transformers5(cfg) if spelling == 5 else cfg, 1, None)
    write_tokenizer(folder)
    return folder, cfg, tensors


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


IDS = [int(i) for i in np.random.default_rng(3).integers(3, VOCAB, 20)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_numpy_reference(tmp_path, family):
    check_family(tmp_path, family, BACKEND)


#: each row of docs/models.md's table (plain llama is llama3-rope without its scaling) on
#: cpu, on cuda where a CUDA device is (scripts/h200_families.sh), and on one GPU API: both
#: APIs run shaders of their own, but lavapipe compiles each new one slowly, so a row takes
#: the API that adds the fewest to CI
ON_GPU_API = {"gemma3": "wgpu", "qwen2-yarn": "wgpu", "qwen2-moe": "wgpu",
              "linear-rope": "vulkan", "llama3-rope": "vulkan", "mistral-window": "vulkan",
              "mixtral": "vulkan", "qwen3": "vulkan", "qwen3-moe": "vulkan"}


@pytest.mark.parametrize("family, backend", [
    (f, b) for f, api in sorted(ON_GPU_API.items()) for b in ("cpu", api, "cuda")])
def test_family_on_backend(tmp_path, family, backend):
    """The same on cpu, a GPU API (lavapipe here) and cuda: q/k norms, GeGLU, rings, RoPE
    tables and the routers."""
    skip_without(backend)
    check_family(tmp_path, family, backend)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_transformers5_config_reads_as_4x(tmp_path, family):
    """Each family's config.json as transformers 5 writes it reads as its 4.x spelling."""
    from poot.models.loader import open_model

    v4, v5 = (open_model(str(make_folder(tmp_path, family, s)[0]))[1] for s in (4, 5))
    assert v5 == v4
    assert "rope_theta" not in transformers5({**BASE, **FAMILIES[family]})


@pytest.mark.parametrize("family", ["qwen2-moe", "qwen3-moe", "gemma3", "llama3-rope"])
def test_transformers5_folder_matches_numpy_reference(tmp_path, family):
    """The folders issue 52 found refused (Qwen2-MoE and Qwen3-MoE saved by transformers 5),
    and Gemma 3's per-layer-type rope_parameters, run."""
    check_family(tmp_path, family, BACKEND, spelling=5)


def skip_without(backend: str) -> None:
    """Skips the test where this machine has no device of the backend."""
    from poot.errors import PootError
    from poot.plugin import select_backend

    try:
        select_backend(backend)
    except PootError as exc:
        pytest.skip(f"no {backend} device: {exc}")


def check_family(tmp_path, family: str, backend: str, spelling: int = 4) -> None:
    """One step of a 20-token prompt, then the session: chunked prefill and decode."""
    import poot

    folder, cfg, tensors = make_folder(tmp_path, family, spelling)
    model = poot.load(str(folder), backend=backend, max_seq=32, prefill_tokens=6)
    check_logits(model, forward(tensors, cfg, IDS))


def check_logits(model, want) -> None:
    """The logits of IDS in one step, then through the session: chunks of the model's
    prefill_tokens (the last one padded), then decode steps."""
    assert rel_err(model.prefill_logits(IDS), want) < 1e-4
    session = model.session()
    session.open("s")
    try:
        assert rel_err(session.prefill("s", IDS[:15]), want[14]) < 1e-4
        for i in range(15, 20):
            got = session.decode({"s": IDS[i]})["s"]
            assert rel_err(got, want[i]) < 1e-4, i
    finally:
        session.close("s")


@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_sliding_layers_keep_a_window_sized_ring_and_run_paged(tmp_path, family):
    import poot

    folder, cfg, tensors = make_folder(tmp_path, family)
    model = poot.load(str(folder), backend=BACKEND, max_seq=32, prefill_tokens=6)
    c = model.config
    assert c.window == 8 and c.ring == 8 and any(c.sliding)
    g = model.step_graph(1, compiled=False)
    states = {g.meta(v).identity.label: g.type_of(v).shape for v, _ in g.state()}
    for i in range(c.layers):
        if c.is_sliding(i):
            assert states[f"blk.{i}.k_ring"] == (8, KV, HEAD_DIM)
            assert f"blk.{i}.k_cache" not in states
        else:
            assert states[f"blk.{i}.k_cache"] == (KV, 32, HEAD_DIM)
    # without the window the logits differ: the window is really applied
    want = forward(tensors, cfg, IDS)
    assert rel_err(forward(tensors, {**cfg, "sliding_window": None}, IDS), want) > 1e-3
    paged = poot.load(str(folder), backend=BACKEND, kv="paged", max_seq=32,
                      prefill_tokens=6)
    session = paged.session("paged", batch=1)
    session.open(0)
    try:
        assert rel_err(session.prefill(0, IDS[:19]), want[18]) < 1e-4
        assert rel_err(session.decode({0: IDS[19]})[0], want[19]) < 1e-4
    finally:
        session.close(0)


@pytest.mark.parametrize("extra, message", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping = 50.0: not implemented"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "mscale": 0.7}}, "'mscale'"),
    ({"frobnicate": 3}, "frobnicate = 3: a gemma3_text setting poot does not implement"),
    ({"layer_types": ["sliding_attention"]}, "layer_types = .* must list"),
    ({"hidden_activation": "gelu"}, "hidden_activation = 'gelu'"),
    ({"num_experts": 4}, "num_experts = 4: experts in a gemma3_text model"),
    ({"num_local_experts": 4}, "num_local_experts = 4: experts in a gemma3_text model"),
    ({"qkv_bias": True}, "qkv_bias = True: q/k/v biases are implemented for qwen2 and"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
     "rope_parameters.sliding_attention rope_type 'linear': poot never scales"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0, "mscale": 1}}},
     "rope_parameters.full_attention key 'mscale'"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5: partial rotary is imp"),
])
def test_unimplemented_config_keys_are_refused_by_name(tmp_path, extra, message):
    from poot.errors import CheckpointError
    from poot.models.loader import open_model

    folder, _, _ = make_folder(tmp_path, "gemma3", **extra)
    with pytest.raises(CheckpointError, match=message):
        open_model(str(folder))


@pytest.mark.parametrize("extra, message", [
    ({"num_local_experts": 5}, "num_experts = 6: contradicts num_local_experts = 5"),
    ({"qkv_bias": False}, "qkv_bias = False: q/k/v biases are implemented"),
])
def test_transformers5_moe_keys_are_checked(tmp_path, extra, message):
    from poot.errors import CheckpointError
    from poot.models.loader import open_model

    folder, _, _ = make_folder(tmp_path, "qwen2-moe", **extra)
    with pytest.raises(CheckpointError, match=message):
        open_model(str(folder))


def test_info_shows_windows_and_rope_scaling(tmp_path, capsys):
    from poot.cli import main

    folder, _, _ = make_folder(tmp_path, "gemma3")
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "architecture gemma3" in out and "gelu_tanh FFN; q/k norm True" in out
    assert "sliding window 8 on 2 of 3 layers, RoPE base 10000; global layers [2]" in out
    folder, _, _ = make_folder(tmp_path, "llama3-rope")
    assert main(["info", str(folder)]) == 0
    assert "scaling llama3 x8, original context 16" in capsys.readouterr().out
    folder, _, _ = make_folder(tmp_path, "qwen2-moe")
    assert main(["info", str(folder)]) == 0
    assert ("experts      6 of hidden size 32, top 3 per token (softmax over all), shared "
            "expert 48 under a sigmoid gate") in capsys.readouterr().out
