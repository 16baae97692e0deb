"""Qwen3, Qwen3-MoE / Qwen2-MoE and Mixtral (llama.cpp writes it as arch llama with experts,
q/k rows permuted into adjacent pairs) from GGUF files written here with `gguf`'s own writer
(Q8_0 matrices, GGUF's stacked expert tensors ffn_*_exps), against the numpy forward of
tests/reference_decoder.py on the same tensors dequantized by `gguf.quants`."""
from __future__ import annotations

import numpy as np
import pytest
from reference_decoder import forward
# BACKEND: POOT_FAMILY_BACKEND (scripts/h200_models.sh: cuda)
from test_families import BACKEND, skip_without

VOCAB, DIM, HEADS, KV, HEAD_DIM, FFN, EXPERTS = 128, 64, 4, 2, 32, 96, 4
CHUNK = 2  # the session's prefill chunk; 10 prompt tokens take five

CASES = {
    "llama": {"model_type": "mixtral", "num_local_experts": EXPERTS, "num_experts_per_tok": 2},
    "qwen3": {"model_type": "qwen3"},
    "qwen3moe": {"model_type": "qwen3_moe", "num_experts": EXPERTS, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 64, "norm_topk_prob": True},
    "qwen2moe": {"model_type": "qwen2_moe", "num_experts": EXPERTS, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 64, "shared_expert_intermediate_size": 96,
                 "norm_topk_prob": False},
}


def write_gguf(path, arch: str, seed: int = 0):
    """A 2-layer random model of `arch`: (HF config dict, HF-named f64 tensors as read back)."""
    import gguf
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(seed)
    cfg = {"hidden_size": DIM, "num_hidden_layers": 2, "num_attention_heads": HEADS,
           "num_key_value_heads": KV, "head_dim": HEAD_DIM, "rms_norm_eps": 1e-6,
           "rope_theta": 1e6, "vocab_size": VOCAB, "max_position_embeddings": 64,
           **CASES[arch]}
    moe = "num_experts" in cfg or "num_local_experts" in cfg
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(DIM)
    w.add_block_count(2)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    if moe:
        w.add_expert_count(EXPERTS)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(64)
    hf: dict[str, np.ndarray] = {}

    def add(name, hf_name, array, quantized=True, heads=0):
        """heads: the rows as llama.cpp's converter writes llama's q/k, each head's two
        halves interleaved into adjacent pairs (Q8_0 blocks lie within rows, so the values
        read back are the HF rows quantized)."""
        array = array.astype(np.float32)
        rows = pairs(array, heads) if heads else array
        if quantized:
            q = quantize(rows, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            array = dequantize(quantize(array, gguf.GGMLQuantizationType.Q8_0),
                               gguf.GGMLQuantizationType.Q8_0).reshape(array.shape)
        else:
            w.add_tensor(name, array)
        if array.ndim == 3:  # a stack of experts
            for e, part in enumerate(array):
                hf[hf_name.format(e)] = part
        else:
            hf[hf_name] = array

    def mat(*shape):
        return rng.standard_normal(shape) * shape[-1] ** -0.5

    def norm(d):
        return 1.0 + 0.2 * rng.standard_normal(d)

    add("token_embd.weight", "model.embed_tokens.weight", rng.standard_normal((VOCAB, DIM)))
    add("output.weight", "lm_head.weight", mat(VOCAB, DIM))
    add("output_norm.weight", "model.norm.weight", norm(DIM), False)
    q, kv = HEADS * HEAD_DIM, KV * HEAD_DIM
    for i in range(2):
        g, h = f"blk.{i}.", f"model.layers.{i}."
        add(g + "attn_norm.weight", h + "input_layernorm.weight", norm(DIM), False)
        add(g + "ffn_norm.weight", h + "post_attention_layernorm.weight", norm(DIM), False)
        for n, name, rows, heads in (("q", "q_proj", q, HEADS), ("k", "k_proj", kv, KV),
                                     ("v", "v_proj", kv, 0)):
            add(f"{g}attn_{n}.weight", f"{h}self_attn.{name}.weight", mat(rows, DIM),
                heads=heads if arch == "llama" else 0)
            if arch == "qwen2moe":
                add(f"{g}attn_{n}.bias", f"{h}self_attn.{name}.bias",
                    0.1 * rng.standard_normal(rows), False)
        add(g + "attn_output.weight", h + "self_attn.o_proj.weight", mat(DIM, q))
        if arch.startswith("qwen3"):
            add(g + "attn_q_norm.weight", h + "self_attn.q_norm.weight", norm(HEAD_DIM), False)
            add(g + "attn_k_norm.weight", h + "self_attn.k_norm.weight", norm(HEAD_DIM), False)
        if not moe:
            for n, rows, cols in (("gate", FFN, DIM), ("up", FFN, DIM), ("down", DIM, FFN)):
                add(f"{g}ffn_{n}.weight", f"{h}mlp.{n}_proj.weight", mat(rows, cols))
            continue
        mixtral = cfg["model_type"] == "mixtral"
        pre = h + ("block_sparse_moe." if mixtral else "mlp.")
        add(g + "ffn_gate_inp.weight", pre + "gate.weight", mat(EXPERTS, DIM) * 8, False)
        for n, hf_n, rows, cols in (("gate", "w1", 64, DIM), ("up", "w3", 64, DIM),
                                    ("down", "w2", DIM, 64)):
            add(f"{g}ffn_{n}_exps.weight",
                pre + "experts.{}." + (hf_n if mixtral else f"{n}_proj") + ".weight",
                mat(EXPERTS, rows, cols))
        if arch == "qwen2moe":
            for n, rows, cols in (("gate", 96, DIM), ("up", 96, DIM), ("down", DIM, 96)):
                add(f"{g}ffn_{n}_shexp.weight", f"{h}mlp.shared_expert.{n}_proj.weight",
                    mat(rows, cols))
            add(g + "ffn_gate_inp_shexp.weight", h + "mlp.shared_expert_gate.weight",
                mat(1, DIM), False)
    close_gguf(w)
    return cfg, hf


def pairs(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's order of llama's q/k rows: within each head, row i of the
    first half and row i of the second half side by side (RoPE on adjacent pairs)."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, 2, half, -1).swapaxes(1, 2).reshape(rows.shape)


def close_gguf(writer) -> None:
    """Write the GGUFWriter's header, key/values and tensors, and close the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch", sorted(CASES))
def test_gguf_family_matches_numpy_reference(tmp_path, arch):
    check(tmp_path, arch, BACKEND)


#: every arch on cpu and cuda (where a CUDA device is) and on wgpu (lavapipe here): Qwen3-MoE's
#: and Mixtral's Q8_0 expert stacks as indexed packed contractions, Mixtral's q/k rows in
#: pairs, Qwen2-MoE's shared expert (the later archs reuse the earlier ones' shaders).
ON_BACKEND = [(a, b) for a in sorted(CASES) for b in ("cpu", "cuda")] + [
    (a, "wgpu") for a in ("qwen3moe", "llama", "qwen3", "qwen2moe")]


@pytest.mark.parametrize("arch, backend", ON_BACKEND)
def test_gguf_family_on_backend(tmp_path, arch, backend):
    skip_without(backend)
    check(tmp_path, arch, backend)


def check(tmp_path, arch: str, backend: str) -> None:
    from poot.models.loader import open_model
    from poot.models.runner import Model
    from poot.plugin import select_backend

    cfg, hf = write_gguf(tmp_path / f"{arch}.gguf", arch)
    ckpt, config = open_model(str(tmp_path / f"{arch}.gguf"), max_seq=32)
    assert config.arch == arch
    assert config.rope_layout == ("pairs" if arch == "llama" else "half")
    moe = config.experts > 0
    if moe:
        assert (config.experts, config.experts_used, config.expert_ffn) == (EXPERTS, 2, 64)
        assert config.norm_topk == (arch != "qwen2moe")
        assert config.shared_ffn == (96 if arch == "qwen2moe" else 0)
        assert ckpt.tensors["blk.0.ffn_up_exps.weight"].packed.format == "gguf:Q8_0"
    b, dev = select_backend(backend)
    model = Model(ckpt, config, None, b, dev, prefill_tokens=CHUNK)
    if moe:  # experts read through the packed indexed contraction
        ops = {type(e.op).__name__ for e in model.step_graph(1).eqns()}
        assert "IndexedPackedContraction" in ops, ops
    ids = [int(i) for i in np.random.default_rng(1).integers(0, VOCAB, 11)]
    want = forward(hf, cfg, ids)
    # one step as wide as the session's chunks, so one prefill width is compiled: lavapipe
    # takes seconds per new shader, and a GEMV's shader grows with its rows
    got = model.prefill_logits(ids[:CHUNK])
    assert np.abs(got - want[:CHUNK]).max() / np.abs(want[:CHUNK]).max() < 1e-4
    session = model.session()
    session.open(0)
    try:
        logits = session.prefill(0, ids[:10])
        assert np.abs(logits - want[9]).max() / np.abs(want[9]).max() < 1e-4
        logits = session.decode({0: ids[10]})[0]
        assert np.abs(logits - want[10]).max() / np.abs(want[10]).max() < 1e-4
    finally:
        session.close(0)
