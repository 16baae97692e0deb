"""`poot pull NAME`: fetch a known model into poot's cache."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("pull", help="download a known model (smollm2, gemma3-270m) into the cache")
    p.add_argument("name", help="model name: smollm2 or gemma3-270m")


def run(args) -> int:
    from poot.models.hub import pull

    print(pull(args.name))
    return 0
