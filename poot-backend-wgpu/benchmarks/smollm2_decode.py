"""SmolLM2-135M (Q4_1 GGUF) greedy decode tokens/s: wgpu (lavapipe here) next to the
reference backend, in one run, with the same prompt; prints both and whether the tokens match.

    python poot-backend-wgpu/benchmarks/smollm2_decode.py [--tokens 16] [--model smollm2]
    python poot-backend-wgpu/benchmarks/smollm2_decode.py --random gguf:Q4_1   # no file

Needs the GGUF (`poot pull smollm2`) unless --random. Decode steps run one token each with
a dense KV cache; tokens/s counts the greedy steps after the prompt.
"""
from __future__ import annotations

import argparse
import platform

from poot.models.greedy import greedy, open_decoder, random_decoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--backends", default="reference,wgpu")
    ap.add_argument("--random", metavar="FORMAT", default=None,
                    help="random weights of SmolLM2's shape packed in FORMAT (e.g. gguf:Q4_1) "
                         "instead of the GGUF file; the prompt is then token ids 1..5")
    args = ap.parse_args()

    if args.random:
        tok = None
        prompt = [1, 2, 3, 4, 5]
        step, weights = random_decoder(len(prompt) + args.tokens + 1, args.random)
        name = f"random SmolLM2-shaped weights in {args.random}"
    else:
        from poot.models.hub import resolve_model
        from poot.models.tokenizer import Tokenizer

        tok = Tokenizer.from_gguf(resolve_model(args.model))
        prompt = tok.encode(args.prompt)
        step, weights = open_decoder(args.model, max_seq=len(prompt) + args.tokens + 1)
        name = args.model
    print(f"model {name}: {len(prompt)} prompt tokens, {args.tokens} new; "
          f"{platform.processor() or platform.machine()}")
    runs = [greedy(step, weights, b, prompt, args.tokens) for b in args.backends.split(",")]
    for r in runs:
        text = tok.decode(r.tokens) if tok else r.tokens
        print(f"{r.backend:>10}: {r.tokens_per_second:7.2f} tok/s decode "
              f"({1000 * r.decode_seconds / len(r.tokens):.1f} ms/token, {r.dispatches} "
              f"dispatches/step), prompt {r.prompt_seconds:.2f} s, setup {r.setup_seconds:.1f} s"
              f" | {text!r}")
    same = all(r.tokens == runs[0].tokens for r in runs)
    print(f"tokens identical across backends: {same}")
    base = runs[0]
    for r in runs[1:]:
        if base.tokens_per_second:
            print(f"{r.backend} / {base.backend}: "
                  f"{r.tokens_per_second / base.tokens_per_second:.2f}x")


if __name__ == "__main__":
    main()
