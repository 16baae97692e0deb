"""The HF-folder path (config.json + safetensors + tokenizer.json) end to end, on real weights.

The folders are derived from the SmolLM2 GGUF: its first two layers, embeddings and final
norm are dequantized with `gguf.quants.dequantize` (not poot's code), llama.cpp's q/k row
permutation is undone to get HF's rotate-half row order, and the tensors are written with HF
names through the `safetensors` package. poot then runs the folder (config mapping, HF -> GGUF
name mapping, rotate-half RoPE, tied embeddings) and must give the logits of the GGUF
checkpoint itself cut to two layers (its adjacent-pair rows and RoPE). Quantized folders
(GPTQ, AWQ, FP8) must run packed and equal a folder of their own dequantized weights.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from poot_quant.safetensors_dir import write_folder as save_folder
from test_families import skip_without

LAYERS = 2
PROMPT = "The capital of France is"
TOKENS = 12
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64

#: GGUF name (per layer where it has "{}") -> HF name
HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
    "intermediate_size": 1536, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True,
    "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}


def gguf_rows_to_hf(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: GGUF row 2i of a head is HF row i, 2i+1 is i + d/2."""
    n, k = w.shape
    d = n // heads
    return w.reshape(heads, d // 2, 2, k).swapaxes(1, 2).reshape(n, k)


def hf_rows_to_gguf(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter permutation (as tests/test_reference_llama.py states it)."""
    n, k = w.shape
    d = n // heads
    return w.reshape(heads, 2, d // 2, k).swapaxes(1, 2).reshape(n, k)


def test_row_permutations_are_inverse():
    w = np.arange(4 * 6 * 3, dtype=np.float32).reshape(4 * 6, 3)
    hf = gguf_rows_to_hf(w, 4)
    assert np.array_equal(hf_rows_to_gguf(hf, 4), w)
    # HF row i of head h was GGUF row 2i; HF row i + d/2 was GGUF row 2i + 1
    assert np.array_equal(hf[6 + 1], w[6 + 2]) and np.array_equal(hf[6 + 3 + 1], w[6 + 3])


def real_hf_weights(gguf_path: Path) -> dict[str, np.ndarray]:
    """The first LAYERS layers, embeddings and final norm of the GGUF as f32 HF tensors."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    names = {}
    for g, hf in HF_NAMES.items():
        for i in (range(LAYERS) if "{}" in g else [None]):
            names[g.format(i)] = hf.format(i)
    out = {}
    for t in GGUFReader(str(gguf_path), "r").tensors:
        if t.name not in names:
            continue
        w = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
        if t.name.endswith("attn_q.weight"):
            w = gguf_rows_to_hf(w, HEADS)
        elif t.name.endswith("attn_k.weight"):
            w = gguf_rows_to_hf(w, KV_HEADS)
        out[names[t.name]] = np.ascontiguousarray(w)
    missing = set(names.values()) - set(out)
    assert not missing, f"the GGUF lacks {missing}"
    assert "output.weight" not in {t.name for t in GGUFReader(str(gguf_path), "r").tensors}
    return out


def write_folder(folder: Path, tensors: dict[str, np.ndarray], tokenizer_dir: Path,
                 config: dict | None = None, extra: dict[str, dict] | None = None,
                 shards: int = 1) -> Path:
    """An HF folder: model.safetensors (or shards and their index), config.json, and the
    tokenizer files of tokenizer_dir."""
    save_folder(folder, tensors, config or CONFIG, shards, extra)
    for f in tokenizer_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, smollm2_gguf, hf_byte_level) -> Path:
    """tokenizer.json exported from the GGUF's tokenizer, with a tokenizer_config.json."""
    from poot.models.gguf_meta import read_gguf_metadata
    from poot.models.tokenizer import Tokenizer

    meta = read_gguf_metadata(smollm2_gguf)
    tok = Tokenizer.from_gguf_metadata(meta)
    d = tmp_path_factory.mktemp("tokenizer")
    hf_byte_level(meta).save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": tok.bos_token, "eos_token": tok.eos_token, "add_bos_token": False,
        "chat_template": meta["tokenizer.chat_template"]}))
    return d


@pytest.fixture(scope="module")
def hf_weights(smollm2_gguf) -> dict[str, np.ndarray]:
    return real_hf_weights(smollm2_gguf)


@pytest.fixture(scope="module")
def f32_folder(tmp_path_factory, hf_weights, tokenizer_dir) -> Path:
    return write_folder(tmp_path_factory.mktemp("hf") / "smollm2-2l-f32", hf_weights,
                        tokenizer_dir)


@pytest.fixture(scope="module")
def gguf_two_layers(smollm2_gguf):
    """The GGUF checkpoint itself (Q4_1, adjacent-pair q/k rows) cut to its first LAYERS."""
    from poot.models.loader import open_model
    from poot.models.runner import Model
    from poot.models.tokenizer import Tokenizer
    from poot.plugin import select_backend

    ckpt, config = open_model(str(smollm2_gguf))
    assert config.rope_layout == "pairs" and config.layers == 30
    config = replace(config, layers=LAYERS, max_seq=64)
    b, dev = select_backend("reference")
    return Model(ckpt, config, Tokenizer.from_gguf_metadata(ckpt.metadata), b, dev)


@pytest.fixture(scope="module")
def f32_model(f32_folder):
    import poot

    return poot.load(str(f32_folder), backend="reference", max_seq=64)


@pytest.fixture(scope="module")
def f32_logits(f32_model):
    return f32_model.prefill_logits(f32_model.tokenize(PROMPT))


@pytest.fixture(scope="module")
def f32_text(f32_model) -> list[str]:
    """The folder's greedy pieces on the reference backend (the tests' reference text)."""
    pieces = list(f32_model.generate(f32_model.tokenize(PROMPT), max_tokens=TOKENS))
    assert f32_model.stats.generated_tokens == TOKENS and "".join(pieces).strip()
    return pieces


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# -- 1. real weights in an f32 folder ------------------------------------------------------
def test_f32_folder_config_and_tokenizer(f32_model, gguf_two_layers):
    c, g = f32_model.config, gguf_two_layers.config
    assert f32_model.checkpoint.kind == "safetensors"
    assert c.rope_layout == "half" and c.tied and not c.qkv_bias
    # everything but the row layout (and the layer cut) is the GGUF's own metadata
    assert replace(c, rope_layout="pairs", rope_dim=c.rot) == \
        replace(g, norm_eps=c.norm_eps, rope_dim=g.rot)
    assert abs(c.norm_eps - g.norm_eps) < 1e-12
    ids = f32_model.tokenize(PROMPT)
    assert ids == gguf_two_layers.tokenize(PROMPT) and len(ids) == 5
    assert f32_model.tokenizer.decode(ids) == PROMPT
    assert f32_model.tokenizer.bos_id == 1 and 2 in f32_model.tokenizer.stop_ids
    assert f32_model.tokenizer.chat_template == gguf_two_layers.tokenizer.chat_template


def test_f32_folder_logits_equal_the_gguf_cut_to_two_layers(f32_model, f32_logits,
                                                            gguf_two_layers):
    ids = f32_model.tokenize(PROMPT)
    want = gguf_two_layers.prefill_logits(ids)
    assert f32_logits.shape == want.shape == (len(ids), 49152)
    assert f32_logits.dtype == np.float32 and np.isfinite(f32_logits).all()
    assert rel_err(f32_logits, want) < 1e-4
    # the folder has no lm_head: the head is the tied embedding
    assert "lm_head.weight" not in f32_model.checkpoint.tensors and f32_model.config.tied


def test_f32_folder_generates_what_the_gguf_generates(f32_model, f32_text, gguf_two_layers):
    """Prefill then decode through the session (dense KV): greedy tokens are the GGUF's."""
    want = list(gguf_two_layers.generate(f32_model.tokenize(PROMPT), max_tokens=TOKENS))
    assert gguf_two_layers.stats.generated_tokens == TOKENS
    assert f32_text == want, (f32_text, want)


@pytest.mark.parametrize("backend", ["cpu", "vulkan", "cuda"])
def test_f32_folder_generates_the_reference_text_on(f32_folder, f32_model, f32_text, backend):
    """The real weights' folder on each backend: the reference backend's greedy text, token
    for token. On vulkan (lavapipe in CI) the prompt runs in chunks of 4, the second
    padded: lavapipe's LLVM is slow over the first compile of the default 32-row chunk's
    GEMVs at this width (each thread's 32 dot products reduced one after another through
    workgroup barriers), where a 4-row chunk's compile in seconds."""
    import poot

    skip_without(backend)
    chunk = {"prefill_tokens": 4} if backend == "vulkan" else {}
    model = poot.load(str(f32_folder), backend=backend, max_seq=64, **chunk)
    ids = f32_model.tokenize(PROMPT)
    assert list(model.generate(ids, max_tokens=TOKENS)) == f32_text
    assert model.stats.generated_tokens == TOKENS


def test_transformers5_rope_parameters(f32_model):
    """transformers 5 writes rope_theta inside rope_parameters, not at the top level."""
    from poot.models.config import from_hf

    cfg = {k: v for k, v in CONFIG.items() if k != "rope_theta"}
    cfg["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
    got = from_hf(cfg, f32_model.checkpoint.tensors, max_seq=64)
    assert got == f32_model.config and got.rope_base == 100000.0


@pytest.mark.parametrize("v4, v5", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}},
     {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 1024,
                          "rope_theta": 100000.0}}),
    ({"model_type": "mistral", "sliding_window": 32},
     {"model_type": "mistral", "sliding_window": 32,
      "layer_types": ["sliding_attention"] * LAYERS,
      "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}),
])
def test_transformers5_spelling_reads_as_4x(f32_model, v4, v5):
    """The same model as transformers 4.x and 5.x write its config.json (5.x: no top-level
    rope_theta, dtype for torch_dtype, layer_types spelled out)."""
    from poot.models.config import from_hf

    tensors = f32_model.checkpoint.tensors
    five = {k: v for k, v in CONFIG.items() if k not in ("rope_theta", "torch_dtype")}
    got = from_hf({**five, "dtype": "float32", **v5}, tensors, max_seq=64)
    assert got == from_hf({**CONFIG, **v4}, tensors, max_seq=64)


def test_sliding_window_is_read_per_layer(f32_model):
    """Mistral's sliding window applies to every layer (the cache keeps its capacity; the
    layers' rings hold the window); Qwen2 configs name a window but switch it off."""
    from poot.models.config import from_hf

    tensors = f32_model.checkpoint.tensors
    mistral = {**CONFIG, "model_type": "mistral", "sliding_window": 32}
    got = from_hf(mistral, tensors, max_seq=64)
    assert (got.max_seq, got.window, got.sliding, got.ring) == (64, 32, (True,) * LAYERS, 32)
    assert from_hf(mistral, tensors, max_seq=16).ring == 16
    assert from_hf({**mistral, "sliding_window": None}, tensors, max_seq=64).window is None
    assert from_hf({**mistral, "use_sliding_window": False}, tensors, max_seq=64).sliding == ()


def test_f32_folder_needs_the_half_layout(f32_model, f32_logits):
    """Run on the rows of the wrong layout, the folder's logits differ: the check above sees
    the RoPE layout and the q/k rows."""
    wrong = type(f32_model)(f32_model.checkpoint, replace(f32_model.config, rope_layout="pairs"),
                            f32_model.tokenizer, f32_model.backend, f32_model.device)
    ids = f32_model.tokenize(PROMPT)
    assert rel_err(wrong.prefill_logits(ids), f32_logits) > 1e-2


def hf_forward(w: dict[str, np.ndarray], cfg: dict, ids) -> np.ndarray:
    """HF's Llama / Qwen2 forward pass in float64 numpy, on HF names and rows: rotate-half RoPE
    on pairs (i, i + d/2), q/k/v biases where present, tied head without lm_head."""
    from reference_llama import causal_gqa_attention, rms_norm, silu

    w = {n: a.astype(np.float64) for n, a in w.items()}
    t, eps, base = len(ids), cfg["rms_norm_eps"], cfg["rope_theta"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg["hidden_size"] // heads
    angle = np.arange(t)[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]
    cos = np.concatenate([np.cos(angle)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(angle)] * 2, -1)[:, None, :]

    def rope(x):
        return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * sin

    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)

        def proj(name, n, h=h, p=p):
            y = h @ w[f"{p}self_attn.{name}.weight"].T + w.get(f"{p}self_attn.{name}.bias", 0)
            return y.reshape(t, n, d)

        q, k, v = rope(proj("q_proj", heads)), rope(proj("k_proj", kv)), proj("v_proj", kv)
        x = x + causal_gqa_attention(q, k, v).reshape(t, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def test_f32_folder_equals_an_independent_hf_forward(f32_model, f32_logits, hf_weights):
    want = hf_forward(hf_weights, CONFIG, f32_model.tokenize(PROMPT))
    assert rel_err(f32_logits, want) < 1e-4


def test_qwen2_folder_with_qkv_biases(tmp_path, hf_weights, tokenizer_dir, f32_model,
                                      f32_logits):
    """Qwen2: q/k/v biases (bf16, as Qwen2 checkpoints store them) and an untied lm_head."""
    import poot

    rng = np.random.default_rng(0)
    tensors = dict(hf_weights)
    for i in range(LAYERS):
        for name, n in (("q_proj", HEADS), ("k_proj", KV_HEADS), ("v_proj", KV_HEADS)):
            bias = 0.5 * rng.standard_normal(n * HEAD_DIM)
            tensors[f"model.layers.{i}.self_attn.{name}.bias"] = bias.astype(ml_dtypes.bfloat16)
    head = hf_weights["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = head + 0.01 * rng.standard_normal(head.shape).astype(np.float32)
    cfg = {**CONFIG, "model_type": "qwen2", "tie_word_embeddings": False,
           "architectures": ["Qwen2ForCausalLM"]}
    folder = write_folder(tmp_path / "qwen2", tensors, tokenizer_dir, cfg)
    model = poot.load(str(folder), backend="reference", max_seq=64)
    assert model.config.qkv_bias and not model.config.tied and model.config.arch == "qwen2"
    ids = model.tokenize(PROMPT)
    logits = model.prefill_logits(ids)
    want = hf_forward({n: np.asarray(a, np.float32) for n, a in tensors.items()}, cfg, ids)
    assert rel_err(logits, want) < 1e-4
    assert rel_err(logits, f32_logits) > 1e-2  # the biases and the head did change the result


# -- 2. the same folder in bf16 ----------------------------------------------------------
@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory, hf_weights, tokenizer_dir) -> Path:
    tensors = {n: a.astype(ml_dtypes.bfloat16) for n, a in hf_weights.items()}
    return write_folder(tmp_path_factory.mktemp("hf") / "smollm2-2l-bf16", tensors,
                        tokenizer_dir, {**CONFIG, "torch_dtype": "bfloat16"}, shards=2)


def test_bf16_folder_logits_and_generation(bf16_folder, f32_logits, f32_model):
    import poot
    from poot.dtypes import DType

    model = poot.load(str(bf16_folder), backend="reference", max_seq=64)
    ckpt = model.checkpoint
    assert len({t.ref.checkpoint for t in ckpt.tensors.values()}) == 2  # both shards
    assert {ckpt.tensors[n].dtype for n in ckpt.tensors} == {DType.BF16}
    ids = model.tokenize(PROMPT)
    logits = model.prefill_logits(ids)
    err = rel_err(logits, f32_logits)
    print(f"bf16 folder vs f32 folder: max |diff| / max |logit| = {err:.2e}")
    assert 0 < err < 2e-2, err
    # exactly the model of the bf16-rounded weights: bf16 is widened, not approximated
    rounded = {n: np.asarray(t.array(), np.float32) for n, t in ckpt.tensors.items()}
    assert rel_err(logits, hf_forward(rounded, CONFIG, ids)) < 1e-4
    # the top tokens agree where the f32 model is not close to a tie
    top = np.argsort(f32_logits, axis=-1)[:, -2:]
    gap = np.take_along_axis(f32_logits, top[:, 1:], -1) - np.take_along_axis(
        f32_logits, top[:, :1], -1)
    clear = gap[:, 0] > 0.5
    assert (logits.argmax(-1)[clear] == f32_logits.argmax(-1)[clear]).all()
    text = "".join(model.generate(PROMPT, max_tokens=8))
    assert model.stats.generated_tokens == 8 and text.strip(), text


# -- 3. quantized folders through the whole model ------------------------------------------
GPTQ_CONFIG = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True,
               "true_sequential": True, "damp_percent": 0.01, "static_groups": False}
QUANTIZED = {
    # name: (format, quantize attrs, tensor suffixes, quantization_config, extra files)
    "gptq": ("gptq:int4", {"group_size": 128, "sym": True},
             ("qweight", "qzeros", "scales"),
             {**GPTQ_CONFIG, "quant_method": "gptq", "checkpoint_format": "gptq"},
             {"quantize_config.json": GPTQ_CONFIG}),
    # AutoGPTQ's own layout: quantize_config.json only (no quant_method), act-order g_idx
    "gptq-autogptq": ("gptq:int4", {"group_size": 128, "sym": True, "act_order": True},
                      ("qweight", "qzeros", "scales", "g_idx"), None,
                      {"quantize_config.json": {**GPTQ_CONFIG, "desc_act": True}}),
    "awq": ("awq:int4", {"group_size": 128}, ("qweight", "qzeros", "scales"),
            {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
             "version": "gemm"},
            {"quant_config.json": {"zero_point": True, "q_group_size": 128, "w_bit": 4,
                                   "version": "GEMM"}}),
    # AutoAWQ's own layout: quant_config.json only
    "awq-autoawq": ("awq:int4", {"group_size": 64}, ("qweight", "qzeros", "scales"), None,
                    {"quant_config.json": {"zero_point": True, "q_group_size": 64, "w_bit": 4,
                                           "version": "GEMM"}}),
    "fp8-tensor": ("fp8:e4m3", {"scale": "tensor"}, ("weight", "weight_scale"),
                   {"quant_method": "fp8", "activation_scheme": "dynamic"}, {}),
    "fp8-block": ("fp8:e4m3", {"scale": "block", "block": (128, 128)},
                  ("weight", "weight_scale_inv"),
                  {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                   "weight_block_size": [128, 128]}, {}),
}


def quantized_tensors(hf_weights, kind: str) -> dict[str, np.ndarray]:
    """The HF tensors with every projection quantized by poot_quant's own quantizer, as the
    checkpoint tools store them; the rest in the precision such checkpoints keep it."""
    import poot_quant

    name, attrs, suffixes, _, _ = QUANTIZED[kind]
    fmt = poot_quant.get(name)
    rest = np.float16 if name.startswith(("gptq", "awq")) else ml_dtypes.bfloat16
    out = {}
    for hf, w in hf_weights.items():
        if not hf.endswith(tuple(f"{p}.weight" for p in PROJECTIONS)):
            out[hf] = w.astype(rest)
            continue
        prefix = hf[:-len(".weight")]
        sources = fmt.quantize(w, **attrs)
        for suffix, src in zip(suffixes, sources, strict=True):
            out[f"{prefix}.{suffix}"] = src
        if len(suffixes) == 3 and name.startswith("gptq"):
            # GPTQ stores the (here trivial) group of every input row
            out[f"{prefix}.g_idx"] = (np.arange(w.shape[1]) // 128).astype(np.int32)
        if kind == "fp8-tensor":  # a 0-d scale, and the static input scale beside it
            out[f"{prefix}.weight_scale"] = out[f"{prefix}.weight_scale"].reshape(())
            out[f"{prefix}.input_scale"] = np.float32(0.02).reshape(())
    return out


@pytest.fixture(scope="module", params=list(QUANTIZED))
def quantized_pair(request, tmp_path_factory, hf_weights, tokenizer_dir):
    """(quantized folder, f32 folder of the quantized folder's own dequantized tensors)."""
    import poot_quant

    kind = request.param
    name, attrs, _, qconfig, extra = QUANTIZED[kind]
    base = tmp_path_factory.mktemp(kind)
    folder = write_folder(base / f"smollm2-2l-{kind}", quantized_tensors(hf_weights, kind),
                          tokenizer_dir,
                          {**CONFIG, "quantization_config": qconfig} if qconfig else CONFIG,
                          extra)
    with poot_quant.open_checkpoint(folder) as ckpt:
        packed = {n: t.packed.format for n, t in ckpt.tensors.items() if t.is_packed}
        assert len(packed) == LAYERS * len(PROJECTIONS) and set(packed.values()) == {name}
        found = ckpt.tensors["model.layers.0.self_attn.q_proj.weight"].packed.attr_dict
        assert attrs.items() <= found.items(), found
        dense = {n: t.dequantize() for n, t in ckpt.tensors.items() if n.startswith("model.")}
    plain = write_folder(base / f"smollm2-2l-{kind}-dequantized", dense, tokenizer_dir)
    return kind, folder, plain


def test_quantized_folder_runs_packed(quantized_pair, hf_weights):
    from collections import Counter

    import poot

    kind, folder, plain = quantized_pair
    model = poot.load(str(folder), backend="reference", max_seq=64)
    ids = model.tokenize(PROMPT)
    logits = model.prefill_logits(ids)
    want = poot.load(str(plain), backend="reference", max_seq=64).prefill_logits(ids)
    assert np.isfinite(logits).all() and rel_err(logits, want) < 1e-4
    # the quantized weights are close to the real ones, but not equal (the check above is
    # between the packed and the dequantized path, not between two copies of one array)
    q = model.checkpoint.tensors["model.layers.1.mlp.down_proj.weight"].dequantize()
    real = hf_weights["model.layers.1.mlp.down_proj.weight"]
    assert 0 < rel_err(q, real) < 0.2
    ops = Counter(e.op.name for e in poot.compile(model.step_graph(1, compiled=False),
                                                  "reference").graph.eqns())
    # per layer q/k/v, o, gate/up and down (gate and up with the FFN's norm inside); the
    # tied head is the dense embedding, the final norm inside it
    assert ops["PackedContraction"] == LAYERS * 3 and ops["NormedDenseContraction"] == 1, \
        dict(ops)
    assert ops["NormedPackedContraction"] == LAYERS, dict(ops)
    assert "PackedDequant" not in ops and "MatMul" not in ops, dict(ops)


# -- 4. errors a user can cause: one clear line naming the folder and what is missing ---------
def _poot(*args):
    return subprocess.run([sys.executable, "-m", "poot", *args], capture_output=True, text=True,
                          timeout=120)


def _broken_folders(base: Path, hf_weights, tokenizer_dir):
    """(folder, what the error must name) for each way a folder can be broken."""
    few = {n: a for n, a in hf_weights.items() if not n.startswith("model.embed_tokens")}
    few["model.embed_tokens.weight"] = hf_weights["model.embed_tokens.weight"][:512]
    cfg = {**CONFIG, "vocab_size": 512}
    cases = []
    folder = write_folder(base / "gpt-neox", few, tokenizer_dir, {**cfg, "model_type": "gpt_neox"})
    cases.append((folder, "unsupported architecture 'gpt_neox'"))
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size"):
        bad = {k: v for k, v in cfg.items() if k != key}
        folder = write_folder(base / f"no-{key}", few, tokenizer_dir, bad)
        cases.append((folder, f"config.json lacks '{key}'"))
    missing = "model.layers.1.self_attn.k_proj.weight"
    folder = write_folder(base / "no-k-proj",
                          {n: a for n, a in few.items() if n != missing}, tokenizer_dir, cfg)
    cases.append((folder, f"lack tensor '{missing}'"))
    folder = write_folder(base / "untied-no-head", few, tokenizer_dir,
                          {**cfg, "tie_word_embeddings": False})
    cases.append((folder, "lack tensor 'lm_head.weight'"))
    # compressed-tensors' pack-quantized int4 (no loader groups it): refused, not run as ints
    packed = "model.layers.0.mlp.up_proj"
    ct = {n: a for n, a in few.items() if n != packed + ".weight"}
    ct.update({packed + ".weight_packed": np.zeros((1536, 576 // 8), np.int32),
               packed + ".weight_scale": np.ones((1536, 576 // 32), np.float16),
               packed + ".weight_shape": np.array([1536, 576], np.int32)})
    folder = write_folder(base / "compressed-tensors", ct, tokenizer_dir, {
        **cfg, "quantization_config": {"quant_method": "compressed-tensors",
                                       "format": "pack-quantized"}})
    cases.append((folder, f"tensor '{packed}.weight_packed' is i32[1536, 72], packed in a "
                          "layout poot does not read (quant_method 'compressed-tensors')"))
    return cases


@pytest.fixture(scope="module")
def broken_folders(tmp_path_factory, hf_weights, tokenizer_dir):
    return _broken_folders(tmp_path_factory.mktemp("broken"), hf_weights, tokenizer_dir)


def test_broken_folders_are_refused_by_load(broken_folders):
    import poot
    from poot.errors import CheckpointError

    for folder, message in broken_folders:
        with pytest.raises(CheckpointError) as exc:
            poot.load(str(folder), backend="reference", max_seq=16)
        text = str(exc.value)
        assert message in text and str(folder) in text and "\n" not in text, text


@pytest.mark.slow
def test_broken_folders_are_one_line_from_poot_info(broken_folders):
    for folder, message in broken_folders:
        r = _poot("info", str(folder))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith("poot: error:") and message in lines[0], r.stderr
        assert str(folder) in lines[0], r.stderr


def test_poot_info_on_a_good_folder(f32_folder):
    r = _poot("info", str(f32_folder))
    assert r.returncode == 0, r.stderr
    assert "safetensors" in r.stdout and "2 layers, dim 576, heads 9 (kv 3)" in r.stdout
    assert "rows half" in r.stdout and "tied head True" in r.stdout


def test_folder_without_tokenizer_json_is_refused_by_load(tmp_path, hf_weights, tokenizer_dir):
    import poot
    from poot.errors import CheckpointError

    folder = write_folder(tmp_path / "no-tokenizer", hf_weights, tokenizer_dir)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="has no tokenizer.json") as exc:
        poot.load(str(folder), backend="reference", max_seq=16)
    assert str(folder) in str(exc.value)


def test_poot_run_on_a_folder(f32_folder, f32_model, gguf_two_layers):
    r = _poot("run", str(f32_folder), "--prompt", PROMPT, "--max-tokens", "6",
              "--backend", "reference")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    want = "".join(gguf_two_layers.generate(f32_model.tokenize(PROMPT), max_tokens=6))
    assert r.stdout.startswith(PROMPT + want), (r.stdout, want)
    assert "decode 6 tokens" in r.stderr or "decode: 6 tokens" in r.stderr, r.stderr
