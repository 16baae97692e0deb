"""Phi-3 / Phi-4-mini (model_type phi3): fused q|k|v and gate|up weights, LongRoPE, partial
rotary; from random-weight HF folders in both transformers spellings of the config and from
GGUF files written with `gguf`'s own writer as llama.cpp's converter lays them out, against
the numpy forward of tests/reference_phi3.py (on POOT_FAMILY_BACKEND, reference by
default); greedy text equal across the backends present.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from reference_phi3 import forward
from test_gguf_families import close_gguf
from test_families import (BACKEND, IDS, check_logits, rel_err, skip_without,
                           write_tokenizer)

VOCAB, DIM, HEADS, FFN, LAYERS, ORIGINAL, CONTEXT = 300, 64, 4, 96, 2, 16, 64
HEAD_DIM = DIM // HEADS

CASES = {   # name -> (kv heads, partial rotary, LongRoPE, sliding window, tied)
    "phi3-longrope": (HEADS, 1.0, True, None, False),
    "phi4-mini": (2, 0.75, True, None, True),
    "phi3-4k-window": (HEADS, 1.0, False, 8, False),
}


def config(case: str, spelling: int = 4) -> dict:
    """The config.json transformers `spelling` (4 or 5) writes for the case."""
    kv, partial, long, window, tied = CASES[case]
    rot = int(HEAD_DIM * partial)
    rng = np.random.default_rng(len(case))
    rope = {"rope_type": "longrope",
            "short_factor": [float(x) for x in 1.0 + rng.random(rot // 2)],
            "long_factor": [float(x) for x in 1.0 + 8 * rng.random(rot // 2)]} if long else None
    cfg = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": DIM,
           "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "num_key_value_heads": kv, "intermediate_size": FFN, "rms_norm_eps": 1e-5,
           "vocab_size": VOCAB, "max_position_embeddings": CONTEXT,
           "tie_word_embeddings": tied, "hidden_act": "silu", "sliding_window": window,
           "attention_dropout": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
           "auto_map": {"AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"}}
    if case == "phi4-mini":   # its settings for remote code, at the values that change nothing
        cfg.update(full_attn_mod=1, interpolate_factor=1, lm_head_bias=False)
    common = {"rope_theta": 10000.0, "original_max_position_embeddings": ORIGINAL}
    if partial != 1.0:
        common["partial_rotary_factor"] = partial
    if spelling == 4:
        return {**cfg, **common, "rope_scaling": rope}
    # transformers 5: every RoPE setting inside rope_parameters
    return {**cfg, "rope_parameters": {**(rope or {"rope_type": "default"}), **common},
            "dtype": "float32"}


def random_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    kv = cfg["num_key_value_heads"]

    def mat(n, k, scale=None):
        return (rng.standard_normal((n, k)) * (scale or k ** -0.5)).astype(np.float32)

    def norm(d):
        return (1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(VOCAB, DIM, 1.0), "model.norm.weight": norm(DIM)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(VOCAB, DIM)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(DIM)
        w[p + "post_attention_layernorm.weight"] = norm(DIM)
        w[p + "self_attn.qkv_proj.weight"] = mat((HEADS + 2 * kv) * HEAD_DIM, DIM)
        w[p + "self_attn.o_proj.weight"] = mat(DIM, HEADS * HEAD_DIM)
        w[p + "mlp.gate_up_proj.weight"] = mat(2 * FFN, DIM)
        w[p + "mlp.down_proj.weight"] = mat(DIM, FFN)
    return w


def make_folder(tmp_path, case: str, spelling: int = 4, **extra):
    from poot_quant.safetensors_dir import write_folder

    cfg = {**config(case, spelling), **extra}
    folder = tmp_path / f"{case}-v{spelling}"
    tensors = random_tensors(cfg)
    write_folder(folder, tensors, cfg, 1, None)
    write_tokenizer(folder)
    return folder, cfg, tensors


@pytest.mark.parametrize("spelling", [4, 5])
@pytest.mark.parametrize("case", sorted(CASES))
def test_folder_matches_numpy_reference(tmp_path, case, spelling):
    """A context past the original one takes the long factors, one within it the short."""
    import poot

    folder, cfg, tensors = make_folder(tmp_path, case, spelling)
    for context in (32, ORIGINAL):
        model = poot.load(str(folder), backend=BACKEND, max_seq=context, prefill_tokens=6)
        if context == ORIGINAL:      # 20 positions do not fit: the first 16
            got = model.prefill_logits(IDS[:ORIGINAL])
            assert rel_err(got, forward(tensors, cfg, IDS[:ORIGINAL], context)) < 1e-4
        else:
            check_logits(model, forward(tensors, cfg, IDS, context))
    if CASES[case][2]:   # the two factor sets really differ in the logits
        assert rel_err(forward(tensors, cfg, IDS, 32), forward(tensors, cfg, IDS, 16)) > 1e-3


def test_both_spellings_read_alike(tmp_path):
    from poot.models.loader import open_model

    for case in CASES:
        configs = [open_model(str(make_folder(tmp_path, case, s)[0]))[1] for s in (4, 5)]
        assert configs[0] == configs[1], case
    c = configs[0]
    assert (c.arch, c.rot, c.head_dim, c.window, c.sliding) == \
        ("phi3", HEAD_DIM, HEAD_DIM, 8, (True,) * LAYERS)
    c = open_model(str(make_folder(tmp_path, "phi4-mini")[0]))[1]
    s = c.rope_scaling
    assert (c.rot, c.tied, c.kv_heads, s.kind, s.original_context, s.factor) == \
        (12, True, 2, "longrope", ORIGINAL, CONTEXT / ORIGINAL)
    assert len(s.short_factor) == len(s.long_factor) == 6


def test_fused_parts_read_one_by_one(tmp_path):
    """With the stacking off (as a tensor-parallel rank or a LoRA adapter reads them), q, k,
    v, gate and up are row ranges of the fused tensors: the same logits."""
    import poot

    folder, cfg, tensors = make_folder(tmp_path, "phi4-mini")
    model = poot.load(str(folder), backend=BACKEND, max_seq=32, prefill_tokens=6)
    model.stack_qkv = model.stack_ffn = False
    g = model.step_graph(4, compiled=False)
    labels = {g.meta(v).identity.label for v in g.consts()}
    assert "model.layers.0.self_attn.qkv_proj.weight[64:96]" in labels, labels
    assert "model.layers.1.mlp.gate_up_proj.weight[96:192]" in labels, labels
    assert rel_err(model.prefill_logits(IDS), forward(tensors, cfg, IDS, 32)) < 1e-4
    spec = model.weights.spec("blk.0.attn_k.weight")
    assert spec.type.shape == (2 * HEAD_DIM, DIM) and "qkv_proj" in spec.ref.tensor


def numpy_greedy(logits_of, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after the prompt from logits_of(ids) -> [T, vocab] (a numpy forward);
    more than two distinct ones, so that a wrong model cannot match them by chance."""
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(logits_of(prompt + out)[-1])))
    assert len(set(out)) > 2, out
    return out


def greedy_ids(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after the prompt through the session (chunked prefill, decode)."""
    session = model.session()
    session.open("g")
    try:
        out = [int(np.argmax(session.prefill("g", prompt)))]
        while len(out) < n:
            out.append(int(np.argmax(session.decode({"g": out[-1]})["g"])))
        return out
    finally:
        session.close("g")


@pytest.fixture(scope="module")
def phi4_greedy(tmp_path_factory):
    """(phi4-mini's folder, the numpy forward's 10 greedy tokens after IDS[:10], the
    reference backend's text of them: its tokens checked against the numpy forward's)."""
    import poot

    folder, cfg, tensors = make_folder(tmp_path_factory.mktemp("phi4"), "phi4-mini",
                                       tie_word_embeddings=False)
    want = numpy_greedy(lambda ids: forward(tensors, cfg, ids, 32), IDS[:10], 10)
    model = poot.load(str(folder), backend="reference", max_seq=32, prefill_tokens=6)
    assert greedy_ids(model, IDS[:10], 10) == want
    text = "".join(model.generate(IDS[:10], max_tokens=10))
    assert text
    return folder, want, text


@pytest.mark.parametrize("backend", ["cpu", "wgpu", "vulkan", "cuda"])
def test_greedy_text_is_equal_across_backends(phi4_greedy, backend):
    """The numpy forward's greedy tokens, and the reference backend's text of them, on cpu,
    GPU APIs (lavapipe here) and cuda."""
    import poot

    skip_without(backend)
    folder, want, text = phi4_greedy
    model = poot.load(str(folder), backend=backend, max_seq=32, prefill_tokens=6)
    assert greedy_ids(model, IDS[:10], 10) == want
    assert "".join(model.generate(IDS[:10], max_tokens=10)) == text


# -- GGUF as llama.cpp's converter writes phi3 -----------------------------------------------
def write_gguf(path, case: str):
    """The case's random model as a phi3 GGUF: Q8_0 matrices, attn_qkv, ffn_up holding
    gate|up, the LongRoPE factor tensors and attention factor. Returns (HF config, HF-named
    tensors as the file holds them)."""
    import gguf
    from gguf.quants import dequantize, quantize

    cfg = config(case)
    hf = random_tensors(cfg)
    kv, partial, long, window, tied = CASES[case]
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_context_length(CONTEXT)
    w.add_rope_scaling_orig_ctx_len(ORIGINAL)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(int(partial * DIM) // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(window or 0)
    if long:
        scale = CONTEXT / ORIGINAL
        w.add_rope_scaling_attn_factors(np.sqrt(1 + np.log(scale) / np.log(ORIGINAL)))
        for kind in ("long", "short"):
            w.add_tensor(f"rope_factors_{kind}.weight",
                         np.array(cfg["rope_scaling"][f"{kind}_factor"], np.float32))
    names = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
             "model.norm.weight": "output_norm.weight"}
    for i in range(LAYERS):
        for hf_name, g in (("input_layernorm", "attn_norm"),
                           ("post_attention_layernorm", "ffn_norm"),
                           ("self_attn.qkv_proj", "attn_qkv"), ("self_attn.o_proj", "attn_output"),
                           ("mlp.gate_up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")):
            names[f"model.layers.{i}.{hf_name}.weight"] = f"blk.{i}.{g}.weight"
    out = {}
    for name, array in hf.items():
        if array.ndim == 2:
            q = quantize(array, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(names[name], q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            array = dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(array.shape)
        else:
            w.add_tensor(names[name], array)
        out[name] = array
    close_gguf(w)
    return cfg, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_gguf_matches_numpy_reference(tmp_path, case):
    from poot.models.loader import open_model
    from poot.models.runner import Model
    from poot.plugin import select_backend

    path = tmp_path / f"{case}.gguf"
    cfg, hf = write_gguf(path, case)
    ckpt, c = open_model(str(path), max_seq=32)
    hf_config = open_model(str(make_folder(tmp_path, case)[0]), max_seq=32)[1]
    # the GGUF reads as the folder does (its attention factor computed by the converter)
    assert c.rope_scaling.kind == hf_config.rope_scaling.kind
    if c.rope_scaling.kind == "longrope":
        assert abs(c.rope_scaling.attention_factor - (1 + np.log(4) / np.log(16)) ** 0.5) < 1e-6
        assert c.rope_scaling.short_factor == pytest.approx(hf_config.rope_scaling.short_factor)
    assert (c.rot, c.tied, c.window, c.sliding) == \
        (hf_config.rot, hf_config.tied, hf_config.window, hf_config.sliding)
    b, dev = select_backend(BACKEND)
    model = Model(ckpt, c, None, b, dev, prefill_tokens=6)
    want = forward(hf, cfg, IDS, 32)
    check_logits(model, want)
    # the packed Q8_0 parts as row ranges of the fused tensors
    model = Model(ckpt, c, None, b, dev, prefill_tokens=6)
    model.stack_qkv = model.stack_ffn = False
    assert rel_err(model.prefill_logits(IDS), want) < 1e-4


@pytest.fixture(scope="module")
def gguf_greedy(tmp_path_factory):
    """(path, the numpy forward's 8 greedy tokens after IDS[:10]) of phi3-longrope's GGUF
    (its long factors: max_seq 32 is past the original 16)."""
    path = tmp_path_factory.mktemp("phi3-gguf") / "phi3-longrope.gguf"
    cfg, hf = write_gguf(path, "phi3-longrope")
    out = numpy_greedy(lambda ids: forward(hf, cfg, ids, 32), IDS[:10], 8)
    return path, out


@pytest.mark.parametrize("backend", ["cpu", "wgpu", "vulkan", "cuda"])
def test_gguf_greedy_tokens_on_backends(gguf_greedy, backend):
    """The Q8_0 attn_qkv and gate|up ffn_up (read as row ranges) with LongRoPE's factor
    tensors on cpu and GPU APIs (lavapipe here): the numpy forward's greedy tokens."""
    from poot.models.loader import open_model
    from poot.models.runner import Model
    from poot.plugin import select_backend

    skip_without(backend)
    b, dev = select_backend(backend)
    path, want = gguf_greedy
    ckpt, c = open_model(str(path), max_seq=32)
    assert greedy_ids(Model(ckpt, c, None, b, dev, prefill_tokens=6), IDS[:10], 8) == want


def test_poot_info_shows_what_was_read(tmp_path):
    folder, _, _ = make_folder(tmp_path, "phi4-mini", 5)
    out = subprocess.run([sys.executable, "-m", "poot", "info", str(folder)],
                         capture_output=True, text=True, check=True).stdout
    assert "architecture phi3: 2 layers, dim 64, heads 4 (kv 2), head dim 16" in out
    assert ("dims 12, scaling longrope x4, original context 16 (short factors within it, long "
            "beyond)") in out
    assert "tied head True" in out


@pytest.mark.parametrize("extra, message", [
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 6,
                       "long_factor": [1.0] * 8}}, "6 short and 8 long factors; 12 rotated"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 6,
                       "long_factor": [1.0] * 6, "beta_fast": 3}}, "'beta_fast' is not imp"),
    ({"lm_head_bias": True}, "lm_head_bias = True: poot implements lm_head_bias = false only"),
    ({"full_attn_mod": 2}, "full_attn_mod = 2: poot implements full_attn_mod = 1 only"),
    ({"frobnicate": 1}, "frobnicate = 1: a phi3 setting poot does not implement"),
    ({"attention_bias": True}, "attention_bias = True"),
])
def test_unimplemented_phi3_keys_are_refused_by_name(tmp_path, extra, message):
    from poot.errors import CheckpointError
    from poot.models.loader import open_model

    folder, _, _ = make_folder(tmp_path, "phi4-mini", **extra)
    with pytest.raises(CheckpointError, match=message):
        open_model(str(folder))


def test_partial_rotary_is_refused_outside_phi3(tmp_path):
    from poot.errors import CheckpointError
    from poot.models.loader import open_model
    from test_families import make_folder as family_folder

    folder, _, _ = family_folder(tmp_path, "llama", partial_rotary_factor=0.5)
    with pytest.raises(CheckpointError, match="partial_rotary_factor = 0.5: partial rotary"):
        open_model(str(folder))
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["partial_rotary_factor"] == 0.5
