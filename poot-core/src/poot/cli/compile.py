"""`poot compile`: run the pass pipeline on a model's decoder step (or the demo layer)
and show what each pass did; --explain adds why each candidate was or was not
rewritten, and the rewritten graph."""
from __future__ import annotations


def add_parser(sub):
    from poot.cli import MODEL_HELP

    p = sub.add_parser("compile", help="compile a decoder step for a target and explain the "
                       "rewrites (the composites found, and why each candidate was kept)")
    p.add_argument("model", nargs="?", help=MODEL_HELP)
    p.add_argument("--demo", action="store_true",
                   help="a one-layer Llama step with random weights (GQA, SwiGLU, RoPE)")
    p.add_argument("--explain", action="store_true",
                   help="every candidate with its verdict, then the rewritten graph")
    p.add_argument("--target", help="backend name (default: the best available)")
    p.add_argument("--without", nargs="+", default=[], metavar="OP",
                   help="compile as if the target lacked these op keys (e.g. Attention)")
    p.add_argument("--tokens", type=int, default=1, help="tokens per step (1: decode)")
    p.add_argument("--kv", choices=["dense", "paged"], default="dense")
    p.add_argument("--layers", type=int, help="use only the first N layers of the model")
    p.add_argument("--attention", choices=["auto", "never"], default="auto",
                   help="the attention rewrite policy")
    p.add_argument("--limit", type=int, default=None,
                   help="with --explain: at most N decisions per pass")
    p.add_argument("--validate", action="store_true",
                   help="check the oracle agrees before and after, on random inputs")


def source_step(args):
    """(Step, its const arrays (checkpoint weights, rope tables), a description)."""
    import dataclasses

    from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config

    batch = 2 if args.kv == "paged" else 1
    if args.demo or not args.model:
        config = tiny_config(layers=args.layers or 1)
        weights = random_weights(config)
        step = build_decoder(config, weights, tokens=args.tokens, kv=args.kv, batch=batch)
        return step, const_inputs(step, weights), "the demo Llama step (random weights)"
    from poot.models.loader import open_model
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(args.model, max_seq=256)
    if args.layers:
        config = dataclasses.replace(config, layers=min(args.layers, config.layers))
    weights = CheckpointWeights(ckpt)
    step = build_decoder(config, weights, tokens=args.tokens, kv=args.kv, batch=batch)
    return step, {**weights.arrays, **step.consts}, f"{ckpt.path.name}, {config.layers} layers"


def run(args) -> int:
    import poot
    from poot.compiler import LimitedBackend, Policy, resolve_target

    step, consts, what = source_step(args)
    target = resolve_target(args.target)
    if args.without:
        target = (LimitedBackend(target[0], args.without), target[1])
    compiled = poot.compile(step.graph, target, policy=Policy(attention=args.attention))
    g = compiled.graph
    print(f"# {what}: {step.mode} step, {len(step.graph.eqns())} primitive eqns -> "
          f"{len(g.eqns())} eqns for {compiled.backend.name} on {compiled.device}")
    if args.explain:
        print(compiled.report.explain(limit=args.limit))
    else:
        for p in compiled.report.passes:
            print(p.summary())
    if args.validate:
        from poot.compiler.validate import validate

        validate(step.graph, g, given=consts)
        print("validated: the oracle agrees before and after compile (the model's weights, "
              "random slots and state)")
    return 0
