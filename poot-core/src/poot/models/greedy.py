"""Greedy decoding of a GGUF Llama (SmolLM2 by default) on one backend, timed.

Shared by backends' benchmarks (poot-backend-wgpu/benchmarks/smollm2_decode.py) and
whole-model tests: one decode graph (one token per step, dense KV cache), compiled and
planned for the named backend, fed the prompt one token at a time, then its own greedy
choices.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass
class Decoded:
    backend: str
    tokens: list[int]          # the generated tokens (after the prompt)
    prompt_seconds: float
    decode_seconds: float      # generating `tokens`, one step each
    setup_seconds: float       # compile, plan, weight upload
    dispatches: int

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.decode_seconds if self.decode_seconds else 0.0


def open_decoder(model: str = "smollm2", max_seq: int = 64, sample: str | None = None):
    """(decode step, weights) for a model name or GGUF path; `sample="argmax"`: the step
    returns its argmax token id (read back: 4 bytes) instead of the logits."""
    from poot.models.llama import build_decoder
    from poot.models.loader import open_model
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(model, max_seq=max_seq, pull_missing=False)
    weights = CheckpointWeights(ckpt, config)
    return build_decoder(config, weights, sample=sample), weights


#: SmolLM2-135M's shape (from its GGUF), for random-weight runs where the file is absent
SMOLLM2_SHAPE = dict(vocab=49152, dim=576, layers=30, heads=9, kv_heads=3, head_dim=64,
                     ffn=1536, norm_eps=1e-5, rope_base=100000.0, tied=True)


def random_decoder(max_seq: int = 64, packed_format: str = "gguf:Q4_1", seed: int = 0,
                   sample: str | None = None):
    """(decode step, weights) of SmolLM2's shape with random weights packed in a format
    (`sample` as open_decoder's)."""
    from poot.models.llama import LlamaConfig, build_decoder, random_weights

    config = LlamaConfig(**SMOLLM2_SHAPE, max_seq=max_seq)
    weights = random_weights(config, seed=seed, packed_format=packed_format)
    return build_decoder(config, weights, sample=sample), weights


def greedy(step, weights, backend: str, prompt: list[int], new_tokens: int) -> Decoded:
    """Run the prompt and `new_tokens` greedy steps of `step` on `backend` (a step built
    with sample="argmax" picks each token itself; otherwise the host takes the argmax of
    the logits it reads back)."""
    import poot
    from poot.models.llama import const_inputs
    from poot.plan import plan
    from poot.runtime.executor import Executor

    t0 = time.perf_counter()
    planned = plan(poot.compile(step.graph, backend))
    ex = Executor(planned, const_inputs(step, weights))
    setup = time.perf_counter() - t0

    def run(pos: int, token: int) -> int:
        slots = {"tokens": np.array([token], np.int32), "pos": np.array([pos], np.int32)}
        out = ex.step(slots).result
        return int(out[-1]) if step.sample == "argmax" else int(np.argmax(out[-1]))

    t0 = time.perf_counter()
    for pos, token in enumerate(prompt):
        nxt = run(pos, token)
    prompt_s = time.perf_counter() - t0
    out = [nxt]
    t0 = time.perf_counter()
    for pos in range(len(prompt), len(prompt) + new_tokens - 1):
        out.append(run(pos, out[-1]))
    decode_s = time.perf_counter() - t0
    # the first token came from the prompt's last step; time the steps that made the rest
    return Decoded(backend, out, prompt_s, decode_s * new_tokens / max(new_tokens - 1, 1),
                   setup, planned.dispatches)
