"""Decode tokens/s of Gemma 3 270M beside SmolLM2-135M on one backend, in one run.

    python3 poot-core/benchmarks/family_decode.py [--backend cuda] [--tokens 64]

Each model is the real GGUF from poot's cache when it is there (`poot pull gemma3-270m`,
`poot pull smollm2`); otherwise a model of the file's exact shape and storage formats with
random weights (Gemma 3: 18 layers, Q5_0 q/k/gate/up, Q4_K attn_output, Q8_0 token table,
attn_v and ffn_down Q8_0/Q6_K on the nine layers the file has them, Q5_0/Q4_K on the rest;
SmolLM2: Q4_1 projections, Q8_0 token table), so the figure does not depend on moving the
253 MB file to the machine. Greedy decoding after a short prompt, dense KV; the first
generation (compile, plan, bind, CUDA graph capture) is not timed. Prints one line per
model and a ratio line.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

#: the layers whose attn_v / ffn_down the real Q4_K_M file keeps at Q8_0 / Q6_K
GEMMA3_HIGH = {0, 1, 4, 7, 10, 13, 15, 16, 17}
GEMMA3_META = {  # the real file's config, for a random-weight stand-in
    "general.architecture": "gemma3", "gemma3.context_length": 32768,
    "gemma3.embedding_length": 640, "gemma3.block_count": 18,
    "gemma3.feed_forward_length": 2048, "gemma3.attention.head_count": 4,
    "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 256,
    "gemma3.attention.value_length": 256, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
    "gemma3.rope.freq_base": 1e6, "gemma3.attention.sliding_window": 512,
    "gemma3.vocab_size": 262144,
}
SMOLLM2_META = {
    "general.architecture": "llama", "llama.context_length": 8192,
    "llama.embedding_length": 576, "llama.block_count": 30, "llama.feed_forward_length": 1536,
    "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3,
    "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 100000.0,
    "llama.vocab_size": 49152,
}


def gemma3_format(name: str) -> str:
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if name == "token_embd.weight":
        return "gguf:Q8_0"
    if name.endswith("attn_v.weight"):
        return "gguf:Q8_0" if layer in GEMMA3_HIGH else "gguf:Q5_0"
    if name.endswith("ffn_down.weight"):
        return "gguf:Q6_K" if layer in GEMMA3_HIGH else "gguf:Q4_K"
    if name.endswith("attn_output.weight"):
        return "gguf:Q4_K"
    return "gguf:Q5_0"


def smollm2_format(name: str) -> str:
    return "gguf:Q8_0" if name == "token_embd.weight" else "gguf:Q4_1"


def load(name: str, backend: str, max_seq: int, random: bool = False):
    """(Model, "real" | "random weights") for a known model name."""
    from dataclasses import replace

    import poot
    from poot.models import config as C
    from poot.models.hub import cached_model_path
    from poot.models.llama import random_weights
    from poot.models.runner import Model
    from poot.plugin import select_backend

    if cached_model_path(name).is_file() and not random:
        return poot.load(name, backend, max_seq=max_seq), "real"
    meta, fmt = (GEMMA3_META, gemma3_format) if name == "gemma3-270m" else \
        (SMOLLM2_META, smollm2_format)
    config = C.from_gguf(meta, {}, max_seq)
    config = replace(config, rope_layout="half")  # random rows: no pair reordering needed
    weights = random_weights(config, seed=0, packed_format=fmt)
    b, dev = select_backend(backend)
    return Model(None, config, None, b, dev, weights=weights), "random weights"


def decode_tps(model, tokens: int) -> float:
    session = model.session()
    prompt = [2, 651, 5279, 529, 7001, 563]  # in range for both vocabularies
    model.prepare(session, len(prompt))
    best = 0.0
    for _ in range(2):  # the first run records (CUDA graphs); time the second
        session.open("s")
        try:
            logits = session.prefill("s", prompt)
            t0 = time.perf_counter()
            for _ in range(tokens):
                logits = session.decode({"s": int(np.argmax(np.asarray(logits)))})["s"]
            best = max(best, tokens / (time.perf_counter() - t0))
        finally:
            session.close("s")
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--random", action="store_true",
                    help="random weights of the files' shapes even where the files are here")
    args = ap.parse_args()
    results = {}
    for name in ("gemma3-270m", "smollm2"):
        t0 = time.perf_counter()
        model, source = load(name, args.backend, max_seq=256, random=args.random)
        tps = decode_tps(model, args.tokens)
        results[name] = tps
        print(f"{name:12s} ({source}) on {model.backend.name} {model.device}: decode "
              f"{tps:.1f} tok/s over {args.tokens} tokens (setup and runs "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"gemma3-270m / smollm2 decode tok/s: "
          f"{results['gemma3-270m'] / results['smollm2']:.2f}")


if __name__ == "__main__":
    main()
