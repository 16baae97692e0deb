"""Whether backends that run the same `fast` graph say the same greedy text on the real
SmolLM2 (Q4_1 GGUF), and where they part, why.

`--trace`: each backend's greedy tokens after "The capital of France is"; then each backend
teacher-forced along the first backend's tokens, its logits at every step against the
first's (NMSE, largest difference, the top two and their gap). `--split`: one backend's
last prompt logits with the prompt fed in one prefill step against one token a step: the
same graph definition, only f32 summation order differs, so this is the distance the
level itself leaves between any two correct backends.

    python poot-backend-cpu/bench/fast_text_trace.py --trace [--backends reference,cpu,wgpu]
        [--precision fast] [--kv-dtype f16] [--tokens 8]
    python poot-backend-cpu/bench/fast_text_trace.py --split [--backends reference,cpu]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from smollm2_cpu import gguf_path  # noqa: E402

PROMPT = "The capital of France is"


def nmse(got, want) -> float:
    return float(np.sum((got - want) ** 2) / np.sum(want ** 2))


def steps(backend: str, args, forced=None, prefill_tokens: int = 32):
    """(greedy tokens, or `forced`; the logits [tokens, vocab] that chose each)."""
    import poot

    m = poot.load(gguf_path("smollm2"), backend, max_seq=64, precision=args.precision,
                  kv_dtype=args.kv_dtype, prefill_tokens=prefill_tokens)
    vocab = m.config.vocab
    s = m.session()
    s.open("a")
    logits = [np.asarray(s.prefill("a", m.prompt_ids(PROMPT)), np.float32).reshape(-1)[-vocab:]]
    toks = []
    for i in range(args.tokens):
        toks.append(int(np.argmax(logits[-1])) if forced is None else forced[i])
        if i + 1 < args.tokens:
            logits.append(np.asarray(s.decode({"a": toks[-1]})["a"],
                                     np.float32).reshape(-1)[:vocab])
    return toks, np.stack(logits), m.tokenizer


def trace(args) -> None:
    first, *rest = args.backends.split(",")
    ref_toks, ref, tok = steps(first, args)
    print(f"{first}: {tok.decode(ref_toks)!r} {ref_toks}")
    for b in rest:
        toks, _, _ = steps(b, args)
        print(f"{b}: {tok.decode(toks)!r} {toks}")
        _, got, _ = steps(b, args, forced=ref_toks)
        for i, (g, r) in enumerate(zip(got, ref, strict=True)):
            rt, gt = np.argsort(-r)[:2], np.argsort(-g)[:2]
            print(f"  step {i}: NMSE {nmse(g, r):.1e}, largest difference "
                  f"{np.max(np.abs(g - r)):.2f}; {first} top two {rt.tolist()} gap "
                  f"{r[rt[0]] - r[rt[1]]:.3f}, {b} {gt.tolist()} gap {g[gt[0]] - g[gt[1]]:.3f}")


def split(args) -> None:
    args.tokens = 1
    for b in args.backends.split(","):
        (_, whole, _), (_, single, _) = (steps(b, args, prefill_tokens=n) for n in (32, 1))
        print(f"{b} {args.precision} KV {args.kv_dtype or 'default'}: one prefill step against one token "
              f"a step: NMSE {nmse(single[0], whole[0]):.1e}, largest difference "
              f"{np.max(np.abs(single[0] - whole[0])):.2e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--split", action="store_true")
    ap.add_argument("--backends", default="reference,cpu")
    ap.add_argument("--precision", default="fast")
    ap.add_argument("--kv-dtype", default=None)
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    print(f"# load {os.getloadavg()[0]:.2f}")
    if args.trace:
        trace(args)
    if args.split:
        split(args)


if __name__ == "__main__":
    main()
