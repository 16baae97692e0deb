"""`poot pull NAME`: fetch a known model into poot's cache."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("pull", help="download a known model (smollm2) into the cache")
    p.add_argument("name", help="model name, e.g. smollm2")


def run(args) -> int:
    from poot.models.hub import pull

    print(pull(args.name))
    return 0
