"""gpt-oss (model_type gpt_oss): attention sinks, alternating sliding-window and full layers,
q/k/v/o biases, YaRN, a biased top-k router and experts with a clamped SwiGLU, stored dense
(bf16, as transformers saves random weights) or MXFP4 (as the released checkpoints are);
from random-weight HF folders in both transformers spellings of the config, against the
numpy forward of tests/reference_gpt_oss.py; greedy tokens equal on reference and cpu.
"""
from __future__ import annotations

import json
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from reference_gpt_oss import forward
from test_families import (BACKEND, IDS, check_logits, rel_err, skip_without,
                           write_tokenizer)
from test_phi3 import greedy_ids, numpy_greedy

VOCAB, DIM, HEADS, KV, HEAD_DIM, LAYERS = 300, 64, 4, 2, 16, 3
EXPERTS, TOP, FFN, WINDOW, ORIGINAL, FACTOR = 4, 2, 32, 8, 16, 4.0


def config(spelling: int = 4) -> dict:
    """The config.json transformers `spelling` (4 or 5) writes."""
    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
           "hidden_size": DIM, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "num_key_value_heads": KV, "head_dim": HEAD_DIM, "intermediate_size": FFN,
           "num_local_experts": EXPERTS, "num_experts_per_tok": TOP, "vocab_size": VOCAB,
           "max_position_embeddings": int(ORIGINAL * FACTOR), "rms_norm_eps": 1e-5,
           "sliding_window": WINDOW, "tie_word_embeddings": False, "hidden_act": "silu",
           "attention_bias": True, "attention_dropout": 0.0, "initializer_range": 0.02,
           "router_aux_loss_coef": 0.9, "output_router_logits": False, "use_cache": True,
           "swiglu_limit": 7.0, "layer_types": ["sliding_attention", "full_attention",
                                                "sliding_attention"],
           "eos_token_id": 2, "pad_token_id": 0,
           # OpenAI's own names, which the released config.json files hold too
           "experts_per_token": TOP, "initial_context_length": ORIGINAL}
    rope = {"rope_type": "yarn", "factor": FACTOR, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": ORIGINAL}
    if spelling == 4:
        return {**cfg, "rope_theta": 150000.0, "rope_scaling": rope, "torch_dtype": "bfloat16"}
    return {**cfg, "rope_parameters": {**rope, "rope_theta": 150000.0}, "dtype": "bfloat16"}


def random_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named tensors; the expert stacks in bf16 (gate_up scaled so the clamp bites)."""
    rng = np.random.default_rng(seed)

    def mat(*shape, scale=None):
        return (rng.standard_normal(shape) * (scale or shape[-1] ** -0.5)).astype(np.float32)

    def norm(d):
        return (1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(VOCAB, DIM, scale=1.0),
         "model.norm.weight": norm(DIM), "lm_head.weight": mat(VOCAB, DIM)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(DIM)
        w[p + "post_attention_layernorm.weight"] = norm(DIM)
        for name, n in (("q", HEADS), ("k", KV), ("v", KV)):
            w[p + f"self_attn.{name}_proj.weight"] = mat(n * HEAD_DIM, DIM)
            w[p + f"self_attn.{name}_proj.bias"] = mat(n * HEAD_DIM, scale=0.3)
        w[p + "self_attn.o_proj.weight"] = mat(DIM, HEADS * HEAD_DIM)
        w[p + "self_attn.o_proj.bias"] = mat(DIM, scale=0.3)
        w[p + "self_attn.sinks"] = mat(HEADS, scale=2.0)
        w[p + "mlp.router.weight"] = mat(EXPERTS, DIM)
        w[p + "mlp.router.bias"] = mat(EXPERTS, scale=0.5)
        w[p + "mlp.experts.gate_up_proj"] = mat(EXPERTS, DIM, 2 * FFN, scale=4 / DIM ** 0.5
                                                ).astype(ml_dtypes.bfloat16)
        w[p + "mlp.experts.gate_up_proj_bias"] = mat(EXPERTS, 2 * FFN, scale=0.3)
        w[p + "mlp.experts.down_proj"] = mat(EXPERTS, FFN, DIM).astype(ml_dtypes.bfloat16)
        w[p + "mlp.experts.down_proj_bias"] = mat(EXPERTS, DIM, scale=0.3)
    return w


def mxfp4(tensors: dict) -> tuple[dict, dict]:
    """The tensors with MXFP4 expert stacks as the released checkpoints store them (X_blocks
    [E, N, K/32, 16], X_scales [E, N, K/32] over the [E, N, K] transpose), and the dense
    tensors they decode to (for the reference)."""
    import poot_quant

    fmt = poot_quant.get("mxfp4")
    stored, decoded = dict(tensors), dict(tensors)
    for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
        nk = np.swapaxes(np.asarray(tensors[name], np.float32), 1, 2)    # [E, N, K]
        e, n, k = nk.shape
        blocks, scales = fmt.quantize(nk.reshape(e * n, k))
        del stored[name]
        stored[name + "_blocks"] = blocks.reshape(e, n, k // 32, 16)
        stored[name + "_scales"] = scales.view(np.uint8).reshape(e, n, k // 32)
        dense = fmt.dequantize([blocks, scales], (e * n, k)).reshape(e, n, k)
        decoded[name] = np.swapaxes(dense, 1, 2)
    return stored, decoded


HARMONY = """{%- for m in messages -%}
<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>\
{{ m.content }}<|end|>
{%- endfor -%}
{%- if add_generation_prompt %}<|start|>assistant{% endif -%}"""
#: harmony's control tokens, after the test tokenizer's 261 ids
CONTROL = {"<|start|>": 261, "<|message|>": 262, "<|end|>": 263, "<|channel|>": 264,
           "<|return|>": 265, "<|call|>": 266}


def make_folder(tmp_path, spelling: int = 4, experts: str = "bf16", **extra):
    from poot_quant.safetensors_dir import write_folder

    cfg = {**config(spelling), **extra}
    tensors = random_tensors()
    stored, reference = mxfp4(tensors) if experts == "mxfp4" else (tensors, tensors)
    folder = tmp_path / f"gpt-oss-v{spelling}-{experts}"
    write_folder(folder, stored, cfg, 1, None)
    write_tokenizer(folder)
    add_harmony(folder)
    return folder, cfg, reference


def add_harmony(folder) -> None:
    """Harmony's control tokens in the tokenizer and its turn format as the folder's
    chat_template.jinja (the file gpt-oss releases ship it in)."""
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False,
                            "rstrip": False, "normalized": False, "special": True}
                           for t, i in CONTROL.items()]
    tok["model"]["vocab"].update(CONTROL)
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "chat_template.jinja").write_text(HARMONY)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(folder, config, reference tensors, numpy logits of IDS) per (spelling, experts)."""
    out = {}
    for key in ((4, "bf16"), (5, "bf16"), (4, "mxfp4")):
        folder, cfg, tensors = make_folder(tmp_path_factory.mktemp("gpt-oss"), *key)
        out[key] = folder, cfg, tensors, forward(tensors, cfg, IDS)
    return out


@pytest.mark.parametrize("key", [(4, "bf16"), (5, "bf16"), (4, "mxfp4")])
def test_folder_matches_numpy_reference(folders, key):
    """One step of a 20-token prompt, then the session: chunked prefill and decode (past the
    window of 8, so the sliding layers' rings wrap)."""
    import poot

    folder, cfg, tensors, want = folders[key]
    model = poot.load(str(folder), backend=BACKEND, max_seq=32, prefill_tokens=6)
    check_logits(model, want)


def test_each_trait_changes_the_logits(folders):
    """The sinks, the window and the clamp each change the reference's logits, so the
    comparisons above test them."""
    folder, cfg, tensors, want = folders[4, "bf16"]
    ids = IDS[:12]
    want = want[:12]
    for other in (forward(tensors, cfg, ids, sinks=False),
                  forward(tensors, {**cfg, "sliding_window": 64}, ids),
                  forward(tensors, cfg, ids, limit=1e9)):
        assert rel_err(other, want) > 1e-3


def test_config_in_both_spellings(folders):
    from poot.models.loader import open_model

    c4, c5 = (open_model(str(folders[s, "bf16"][0]))[1] for s in (4, 5))
    assert c4 == c5
    assert (c4.arch, c4.attn_sinks, c4.out_bias, c4.qkv_bias, c4.window, c4.sliding) == \
        ("gpt_oss", True, True, True, WINDOW, (True, False, True))
    assert (c4.experts, c4.experts_used, c4.expert_ffn, c4.swiglu_limit, c4.norm_topk) == \
        (EXPERTS, TOP, FFN, 7.0, True)
    s = c4.rope_scaling
    assert (s.kind, s.factor, s.original_context, s.truncate) == ("yarn", FACTOR, ORIGINAL,
                                                                  False)


def test_info_shows_what_was_read(folders, capsys):
    from poot.cli import main

    assert main(["info", str(folders[4, "mxfp4"][0])]) == 0
    out = capsys.readouterr().out
    assert ("experts      4 of hidden size 32, top 2 per token (renormalized); biases, SwiGLU "
            "clamped at 7 (alpha 1.702)") in out
    assert "sinks        a learned logit per head in each softmax; o bias True" in out
    assert "scaling yarn x4, original context 16" in out and "global layers [1]" in out
    assert "mxfp4                6 tensors" in out


def test_paged_session(folders):
    """The paged KV, two sequences decoding in one batch (each head's sink on the batched
    attention path)."""
    import poot

    folder, cfg, tensors, want = folders[4, "bf16"]
    other = forward(tensors, cfg, IDS[::-1])
    model = poot.load(str(folder), backend=BACKEND, kv="paged", max_seq=32, prefill_tokens=6)
    session = model.session("paged", batch=2)
    for seq, ids in ((0, IDS), (1, IDS[::-1])):
        session.open(seq)
        session.prefill(seq, ids[:17])
    got = {0: [], 1: []}
    for i in range(17, 20):
        out = session.decode({0: IDS[i], 1: IDS[::-1][i]})
        for seq in got:
            got[seq].append(out[seq])
    for seq in got:
        session.close(seq)
    assert rel_err(np.stack(got[0]), want[17:]) < 1e-4
    assert rel_err(np.stack(got[1]), other[17:]) < 1e-4


@pytest.fixture(scope="module")
def greedy(folders) -> list[int]:
    """The numpy forward's 8 greedy tokens after IDS[:10]."""
    folder, cfg, tensors, want = folders[4, "bf16"]
    return numpy_greedy(lambda ids: forward(tensors, cfg, ids), IDS[:10], 8)


def test_steps_fuse_the_sinks(folders):
    """compile forms SinkAttention from the sink chain, one per layer, on reference and cpu."""
    import poot

    for backend in ("reference", "cpu"):
        model = poot.load(str(folders[4, "bf16"][0]), backend=backend, max_seq=32,
                          prefill_tokens=6)
        names = [e.op.name for e in model.step_graph(1).eqns()]
        assert names.count("SinkAttention") == LAYERS and "Attention" not in names, backend


def test_cpu_logits_and_greedy_tokens(folders, greedy):
    """cpu's logits against the numpy forward through the session (chunked prefill, then
    decode past the window), and the numpy forward's greedy tokens on reference and cpu.
    (The session's two step shapes only: each new shape costs cpu a compile.)"""
    import poot

    folder, cfg, tensors, want = folders[4, "bf16"]
    cpu = poot.load(str(folder), backend="cpu", max_seq=32, prefill_tokens=6)
    session = cpu.session()
    session.open("s")
    try:
        assert rel_err(session.prefill("s", IDS[:15]), want[14]) < 1e-4
        for i in range(15, 20):
            assert rel_err(session.decode({"s": IDS[i]})["s"], want[i]) < 1e-4, i
    finally:
        session.close("s")
    for backend in ("reference", "cpu"):
        model = cpu if backend == "cpu" else poot.load(str(folder), backend=backend,
                                                       max_seq=32, prefill_tokens=6)
        assert greedy_ids(model, IDS[:10], 8) == greedy, backend


@pytest.mark.parametrize("backend", ["wgpu", "vulkan", "cuda"])
def test_greedy_tokens_on_gpu_apis(folders, greedy, backend):
    """SinkAttention's kernels, YaRN tables and the clamped experts on GPU APIs (lavapipe
    here)."""
    import poot

    skip_without(backend)
    model = poot.load(str(folders[4, "bf16"][0]), backend=backend, max_seq=32,
                      prefill_tokens=6)
    assert greedy_ids(model, IDS[:10], 8) == greedy


@pytest.mark.parametrize("backend", ["cpu", "wgpu", "vulkan", "cuda"])
def test_mxfp4_folder_greedy_tokens_on_backends(folders, backend):
    """The folder's MXFP4 experts (`*_blocks`, `*_scales`) on cpu and GPU APIs (lavapipe
    here): the numpy forward's greedy tokens of the values they decode to."""
    import poot

    skip_without(backend)
    folder, cfg, tensors, _ = folders[4, "mxfp4"]
    want = numpy_greedy(lambda ids: forward(tensors, cfg, ids), IDS[:10], 8)
    model = poot.load(str(folder), backend=backend, max_seq=32, prefill_tokens=6)
    assert greedy_ids(model, IDS[:10], 8) == want


@pytest.mark.parametrize("tokens", [1, 6])
def test_mxfp4_folder_steps_compile_for_cuda(folders, tokens):
    """Without a GPU: the MXFP4 folder's decode and prefill steps planned for a compile-only
    sm_90a device, the experts' IndexedPackedContraction decoding E8M0 scales and E2M1
    codes through the shared lowering, every kernel an NVRTC CUBIN."""
    import poot
    from poot.conformance.compile_only import model_step_graph
    from poot.plan import plan

    backend = pytest.importorskip("poot_cuda.backend").CudaBackend()
    device = backend.compile_only_device("sm_90a")
    traced, _ = model_step_graph(folders[4, "mxfp4"][0], backend, device, tokens,
                                 prefill_tokens=6)
    p = plan(poot.compile(traced, (backend, device)), (backend, device))
    experts = [s for s in p.steps if "IndexedPackedContraction{weight=mxfp4" in str(s.eqn.op)]
    assert len(experts) == 2 * LAYERS, [str(s.eqn.op) for s in p.steps]
    kernels = [ck for s in p.steps for ck in s.lowering.program.kernels]
    assert kernels and all(ck.binary[:4] == b"\x7fELF" for ck in kernels)


def test_harmony_chat_from_the_folder(folders):
    """The folder's chat_template.jinja renders harmony turns; its control tokens are ids of
    their own, the same spelling inside a message stays text."""
    from poot.models.chat import chat_ids
    from poot.models.tokenizer import Tokenizer

    tok = Tokenizer.from_hf_folder(folders[4, "bf16"][0])
    assert tok.chat_template == HARMONY
    ids = chat_ids(tok, [{"role": "user", "content": "the <|end|>"}])
    start, message, end = CONTROL["<|start|>"], CONTROL["<|message|>"], CONTROL["<|end|>"]
    assert [i for i in ids if i in CONTROL.values()] == [start, message, end, start]
    assert ids[ids.index(message) + 1:ids.index(end)] == tok.encode_text("the <|end|>")
    assert tok.decode(ids, skip_special=False) == \
        "<|start|>user<|message|>the <|end|><|end|><|start|>assistant"
    # a message's <|end|> (the analysis before the final answer) does not end generation
    stops = set(tok.stop_ids) & set(CONTROL.values())
    assert stops == {CONTROL["<|return|>"], CONTROL["<|call|>"]}, stops


@pytest.mark.parametrize("extra, message", [
    ({"swiglu_alpha": "x"}, "swiglu_alpha"),
    ({"frobnicate": 1}, "frobnicate = 1: a gpt_oss setting poot does not implement"),
    ({"layer_types": ["sliding_attention"]}, "layer_types = .* must list"),
    ({"experts_per_token": 3}, "experts_per_token = 3: contradicts num_experts_per_tok = 2"),
])
def test_unimplemented_or_bad_keys_are_refused_by_name(tmp_path, extra, message):
    from poot.errors import PootError
    from poot.models.loader import open_model

    folder, _, _ = make_folder(tmp_path, **extra)
    with pytest.raises(PootError, match=message):
        open_model(str(folder))


def test_clamped_swiglu_keys_belong_to_gpt_oss(tmp_path):
    from poot.errors import CheckpointError
    from poot.models.loader import open_model
    from test_families import make_folder as family_folder

    folder, _, _ = family_folder(tmp_path, "llama", swiglu_limit=7.0)
    with pytest.raises(CheckpointError, match="swiglu_limit = 7.0: a gpt_oss setting"):
        open_model(str(folder))


# -- GGUF as llama.cpp's converter writes gpt-oss ---------------------------------------------
def write_gguf(path) -> tuple[dict, dict]:
    """The random model as a gpt-oss GGUF: gate and up experts apart (the interleaved rows
    split), every expert stack MXFP4 [E, N, K], the FFN's norm as post_attention_norm, the
    sinks as attn_sinks.weight. Returns (HF config, HF-named tensors as the file decodes)."""
    import gguf
    from gguf.quants import dequantize, quantize
    from test_gguf_families import close_gguf

    mx = gguf.GGMLQuantizationType.MXFP4
    cfg, hf = config(), random_tensors()
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_context_length(int(ORIGINAL * FACTOR))
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(150000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(FACTOR)
    w.add_rope_scaling_orig_ctx_len(ORIGINAL)
    w.add_sliding_window(WINDOW)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP)
    w.add_expert_feed_forward_length(FFN)
    out = {n: np.asarray(a, np.float32) for n, a in hf.items()}

    def experts(name, nk):       # [E, N, K] as MXFP4; returns what the file decodes to
        q = quantize(np.ascontiguousarray(nk), mx)
        w.add_tensor(name, q, raw_dtype=mx)
        return dequantize(q, mx).reshape(nk.shape)

    names = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
             "model.norm.weight": "output_norm.weight"}
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        names.update({p + "input_layernorm.weight": b + "attn_norm.weight",
                      p + "post_attention_layernorm.weight": b + "post_attention_norm.weight",
                      p + "self_attn.sinks": b + "attn_sinks.weight",
                      p + "mlp.router.weight": b + "ffn_gate_inp.weight",
                      p + "mlp.router.bias": b + "ffn_gate_inp.bias",
                      p + "mlp.experts.down_proj_bias": b + "ffn_down_exps.bias"})
        for x, g in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_output")):
            for kind in ("weight", "bias"):
                names[f"{p}self_attn.{x}_proj.{kind}"] = f"{b}{g}.{kind}"
        gu = np.swapaxes(out[p + "mlp.experts.gate_up_proj"], 1, 2)         # [E, 2I, H]
        gate, up = experts(b + "ffn_gate_exps.weight", gu[:, 0::2]), \
            experts(b + "ffn_up_exps.weight", gu[:, 1::2])
        decoded = np.empty_like(gu)
        decoded[:, 0::2], decoded[:, 1::2] = gate, up
        out[p + "mlp.experts.gate_up_proj"] = np.swapaxes(decoded, 1, 2)
        bias = out[p + "mlp.experts.gate_up_proj_bias"]
        w.add_tensor(b + "ffn_gate_exps.bias", np.ascontiguousarray(bias[:, 0::2]))
        w.add_tensor(b + "ffn_up_exps.bias", np.ascontiguousarray(bias[:, 1::2]))
        down = experts(b + "ffn_down_exps.weight",
                       np.swapaxes(out[p + "mlp.experts.down_proj"], 1, 2))  # [E, H, I]
        out[p + "mlp.experts.down_proj"] = np.swapaxes(down, 1, 2)
    for name, g in names.items():
        w.add_tensor(g, out[name])
    close_gguf(w)
    return cfg, out


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """(path, HF config, tensors as the file decodes them, the numpy forward's 8 greedy
    tokens after IDS[:10])."""
    path = tmp_path_factory.mktemp("gpt-oss-gguf") / "gpt-oss.gguf"
    cfg, tensors = write_gguf(path)
    out = numpy_greedy(lambda ids: forward(tensors, cfg, ids), IDS[:10], 8)
    return path, cfg, tensors, out


def gguf_model(path, backend: str):
    from poot.models.loader import open_model
    from poot.models.runner import Model
    from poot.plugin import select_backend

    ckpt, c = open_model(str(path), max_seq=32)
    b, dev = select_backend(backend)
    return Model(ckpt, c, None, b, dev, prefill_tokens=6)


def test_gguf_matches_numpy_reference(tmp_path, gguf_file):
    """llama.cpp's layout reads as the folder does and gives the numpy forward's logits."""
    from poot.models.loader import open_model

    path, cfg, tensors, _ = gguf_file
    c = open_model(str(path), max_seq=32)[1]
    hf = open_model(str(make_folder(tmp_path, 5)[0]), max_seq=32)[1]
    assert c.rot == hf.rot and abs(c.norm_eps - hf.norm_eps) < 1e-9   # f32 in the file
    assert c == replace(hf, arch="gpt-oss", rope_dim=c.rope_dim, norm_eps=c.norm_eps)
    check_logits(gguf_model(path, BACKEND), forward(tensors, cfg, IDS))


@pytest.mark.parametrize("backend", ["cpu", "wgpu", "vulkan", "cuda"])
def test_gguf_greedy_tokens_on_backends(gguf_file, backend):
    """The file's MXFP4 expert stacks, gate and up apart, and its sinks on cpu and GPU APIs
    (lavapipe here): the numpy forward's greedy tokens."""
    skip_without(backend)
    assert greedy_ids(gguf_model(gguf_file[0], backend), IDS[:10], 8) == gguf_file[3]
