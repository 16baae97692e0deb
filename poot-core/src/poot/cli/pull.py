"""`poot pull NAME`: fetch a known model into poot's cache, or a Hub repo into the Hub's."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("pull", help="download a model: smollm2, gemma3-270m, or a Hugging Face "
                       "Hub repo ORG/NAME[:QUANT] (hf.co/ORG/NAME too)")
    p.add_argument("name", help="smollm2, gemma3-270m, or ORG/NAME[:QUANT] (a GGUF repo's "
                   "quantization, e.g. :Q4_K_M; default the best of Q4_K_M, Q4_0, Q8_0)")
    p.add_argument("--revision", default=None,
                   help="a Hub repo's branch, tag or commit (default: main)")


def run(args) -> int:
    from poot.models.hub import pull

    print(pull(args.name, revision=args.revision))
    return 0
