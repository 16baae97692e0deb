"""`poot graph`: print the IR of one decoder layer, before and after compile."""
from __future__ import annotations


def add_parser(sub):
    from poot.cli import MODEL_HELP

    p = sub.add_parser("graph", help="print the IR of one layer of a model, before and after "
                       "compile (or the spec's decode attention layer with --demo)")
    p.add_argument("model", nargs="?", help=MODEL_HELP)
    p.add_argument("--demo", action="store_true",
                   help="the spec's decode-step attention layer, as primitive eqns")
    p.add_argument("--tokens", type=int, default=1, help="tokens per step (1: decode)")
    p.add_argument("--no-compile", action="store_true", help="print only the traced IR")


def run(args) -> int:
    import dataclasses

    if args.demo or not args.model:
        from poot.models.examples import decode_attention_layer

        g = decode_attention_layer()
        source = "the spec's decode-step attention layer"
    else:
        from poot.models.llama import build_decoder
        from poot.models.loader import open_model
        from poot.models.weights import CheckpointWeights

        ckpt, config = open_model(args.model, max_seq=256)
        one = dataclasses.replace(config, layers=1)
        g = build_decoder(one, CheckpointWeights(ckpt), tokens=args.tokens).graph
        source = f"one layer of {ckpt.path.name} ({'decode' if args.tokens == 1 else 'prefill'})"
    print(f"# {source}: {len(g.eqns())} primitive eqns")
    print(g)
    if not args.no_compile:
        import poot

        compiled = poot.compile(g)
        print(f"\n# after compile on {compiled.backend.name}: {len(compiled.graph.eqns())} eqns")
        print(compiled.graph)
    return 0
