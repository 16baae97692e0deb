"""`poot run MODEL --prompt TEXT`: stream a generation, then tokens/s for prefill and decode."""
from __future__ import annotations

import sys


def add_parser(sub):
    p = sub.add_parser("run", help="generate text from a model (smollm2, a .gguf, an HF folder)")
    p.add_argument("model", help="smollm2, a .gguf file or an HF folder")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--backend", default=None, help="backend name (default: best available)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None,
                   help="the sampler's seed (same seed and settings: same text on every "
                        "backend)")
    p.add_argument("--host-sampling", action="store_true",
                   help="read the logits back and sample on the host (default: decode steps "
                        "sample in the graph and read back only the token id)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--kv", choices=("dense", "paged"), default="dense")
    p.add_argument("--max-seq", type=int, default=1024, help="KV capacity in positions")
    p.add_argument("--lora", default=None, metavar="PATH",
                   help="generate through this PEFT LoRA adapter (a folder with "
                        "adapter_config.json and adapter_model.safetensors)")
    p.add_argument("--expert-pool", type=int, default=None, metavar="N",
                   help="keep N experts per MoE layer on the device, paging the rest in "
                        "as routing asks (default: every expert resident)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (one per GPU)")


def progress_lines(quiet: bool):
    """The progress callback of the model commands: one `[poot] ...` line on stderr."""
    def progress(msg: str) -> None:
        if not quiet:
            print(f"[poot] {msg}", file=sys.stderr, flush=True)
    return progress


def run(args, rank: int = 0, group=None) -> int:
    """`rank` and `group`: this call is one rank of a `--tp` run (poot.parallel.launch)."""
    import time

    from poot.models.runner import at_least_one, load

    at_least_one("--max-tokens", args.max_tokens)
    at_least_one("--max-seq", args.max_seq)
    at_least_one("--tp", args.tp)
    if args.tp > 1 and group is None:
        from poot.parallel.launch import launch

        if args.temperature > 0 and args.seed is None:  # every rank samples the same token
            import random

            args.seed = random.randrange(1 << 31)
        return launch(args.tp, args.backend, run, args)
    progress = progress_lines(args.quiet or rank > 0)
    t0 = time.perf_counter()
    lora = [("lora", args.lora)] if args.lora else []
    model = load(args.model, args.backend, kv=args.kv, max_seq=args.max_seq,
                 progress=progress, lora=lora, expert_pool=args.expert_pool)
    if group is not None:
        from poot.parallel.model import TensorParallel

        TensorParallel(model, group, rank)
    progress(f"loaded {model.checkpoint.path.name} ({model.config.arch}, "
             f"{model.config.layers} layers) for {model.backend.name} on {model.device} "
             f"in {time.perf_counter() - t0:.1f} s")
    from poot.models.sampling import Sampler

    model.device_sampling = model.device_sampling and not args.host_sampling
    mode = model.sample_mode([Sampler(args.temperature, args.top_k, args.top_p,
                                      args.repetition_penalty, args.seed)])
    model.prepare(model.session(), prompt_tokens=2, sample=mode)  # plan before streaming
    pieces = model.generate(args.prompt, max_tokens=args.max_tokens, chat=args.chat,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            repetition_penalty=args.repetition_penalty, seed=args.seed,
                            stop=args.stop, adapter="lora" if args.lora else None)
    if rank:  # the other ranks step in lockstep with rank 0 and print nothing
        for _ in pieces:
            pass
        return 0
    if not args.chat:
        sys.stdout.write(args.prompt)
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()  # the text ends before the stats line on a shared terminal
    s = model.stats
    print(f"[poot] prefill: {s.prompt_tokens} tokens, {s.prefill_tps:.1f} tok/s; "
          f"decode: {s.generated_tokens} tokens, {s.decode_tps:.1f} tok/s "
          f"({model.backend.name})", file=sys.stderr)
    pager = model.session().stepper
    if pager is not None:
        print(f"[poot] expert pool: {pager.counters}", file=sys.stderr)
    return 0
