"""SmolLM2-135M (Q4_1 GGUF) greedy decode tokens/s: wgpu (lavapipe here) next to the
reference backend, in one run, with the same prompt; prints both and whether the tokens match.

    python poot-backend-wgpu/benchmarks/smollm2_decode.py [--tokens 16] [--model smollm2]

Needs the GGUF (`poot pull smollm2`). Decode steps run one token each with a dense KV
cache; tokens/s counts the greedy steps after the prompt.
"""
from __future__ import annotations

import argparse
import platform

from poot_wgpu.smollm2 import greedy, open_decoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--backends", default="reference,wgpu")
    args = ap.parse_args()

    from poot.models.hub import resolve_model
    from poot.models.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(resolve_model(args.model))
    prompt = tok.encode(args.prompt)
    step, weights = open_decoder(args.model, max_seq=len(prompt) + args.tokens + 1)
    print(f"model {args.model}: {len(prompt)} prompt tokens, {args.tokens} new; "
          f"{platform.processor() or platform.machine()}")
    runs = [greedy(step, weights, b, prompt, args.tokens) for b in args.backends.split(",")]
    for r in runs:
        print(f"{r.backend:>10}: {r.tokens_per_second:7.2f} tok/s decode "
              f"({1000 * r.decode_seconds / len(r.tokens):.1f} ms/token, {r.dispatches} "
              f"dispatches/step), prompt {r.prompt_seconds:.2f} s, setup {r.setup_seconds:.1f} s"
              f" | {tok.decode(r.tokens)!r}")
    same = all(r.tokens == runs[0].tokens for r in runs)
    print(f"tokens identical across backends: {same}")
    if len(runs) > 1 and runs[0].tokens_per_second:
        base = runs[0]
        for r in runs[1:]:
            print(f"{r.backend} / {base.backend}: "
                  f"{r.tokens_per_second / base.tokens_per_second:.2f}x")


if __name__ == "__main__":
    main()
