"""`poot serve MODEL`: the OpenAI API over HTTP, with continuous batching (poot.serve)."""
from __future__ import annotations

import sys


def add_parser(sub):
    from poot.cli.run import add_precision_args

    p = sub.add_parser("serve", help="serve a model over the OpenAI HTTP API")
    p.add_argument("model", help="smollm2, a .gguf file or an HF folder")
    p.add_argument("--backend", default=None, help="backend name (default: best available)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", default=None,
                   help="the model name clients ask for (default: MODEL as given)")
    p.add_argument("--max-batch", type=int, default=8,
                   help="sequences decoded together in one step")
    p.add_argument("--max-seq", type=int, default=1024,
                   help="positions per sequence (prompt + answer)")
    p.add_argument("--kv-pool", type=int, default=None, metavar="TOKENS",
                   help="KV pool size in token slots (default: max-batch x max-seq)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a batch row; more get 503")
    p.add_argument("--prefill-chunk", type=int, default=32,
                   help="prompt tokens of a narrow prefill step, split among up to "
                        "chunk / 8 sequences (more sequences take 8 each)")
    p.add_argument("--prefill-batch", type=int, default=None,
                   help="the most sequences whose prompt chunks are fed together in one "
                        "turn (default: max-batch)")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="a PEFT LoRA adapter a request picks by naming NAME as its model "
                        "(repeatable; all stay resident)")
    p.add_argument("--expert-pool", type=int, default=None, metavar="N",
                   help="keep N experts per MoE layer on the device; every step's tokens "
                        "x experts per token must fit in N (max-batch, and prefill-batch "
                        "1: prompt chunks are cut to N // experts per token)")
    p.add_argument("--no-overlap", action="store_true",
                   help="wait for each greedy decode step before the next (by default the "
                        "next step is launched while the host streams the last one's tokens)")
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_precision_args(p)


def run(args) -> int:
    import time
    from pathlib import Path

    from poot.optional import require

    uvicorn = require("uvicorn")
    from poot.cli.run import progress_lines
    from poot.models.lora import parse_named
    from poot.models.runner import load
    from poot.serve.app import create_app
    from poot.serve.engine import Engine

    progress = progress_lines(args.quiet)
    t0 = time.perf_counter()
    model = load(args.model, args.backend, kv="paged", max_seq=args.max_seq,
                 prefill_tokens=args.prefill_chunk, progress=progress,
                 lora=[parse_named(x) for x in args.lora], expert_pool=args.expert_pool,
                 precision=args.precision, kv_dtype=args.kv_dtype)
    name = args.name or (Path(args.model).stem if Path(args.model).exists() else args.model)
    engine = Engine(model, name=name, max_batch=args.max_batch, pool_tokens=args.kv_pool,
                    max_queue=args.max_queue, prefill_batch=args.prefill_batch,
                    overlap=not args.no_overlap)
    engine.warm(progress)
    s = engine.stats()
    url = f"http://{args.host}:{args.port}/v1"
    # the startup line: tests and scripts wait for "serving"
    prefill = ", ".join(f"{b} x {t}" for b, t in zip(s["prefill_batches"], s["prefill_widths"]))
    print(f"[poot] serving {name} ({model.checkpoint.path.name}, {model.config.arch}, "
          f"{model.config.layers} layers) on {model.backend.name} ({model.device}): batch "
          f"{args.max_batch} (decode plans {s['decode_batches']}, prefill plans of "
          f"sequences x tokens {prefill}), KV pool {s['pool_slots']} "
          f"slots in {s['pool_blocks']} blocks, {s['max_seq']} positions per sequence, "
          f"ready in {time.perf_counter() - t0:.1f} s at {url}", file=sys.stderr, flush=True)
    engine.start()
    try:
        uvicorn.run(create_app(engine), host=args.host, port=args.port,
                    log_level="warning" if args.quiet else "info",
                    access_log=args.access_log)
    finally:
        engine.close()
    return 0
