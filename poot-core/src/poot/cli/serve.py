"""`poot serve MODEL`: the OpenAI API over HTTP, with continuous batching (poot.serve).

Every flag is checked, and the address bound once, before the model loads. While it runs,
the server keeps a record in <cache>/run for `poot ps` (poot.serve.records)."""
from __future__ import annotations

import sys


def add_parser(sub):
    from poot.cli import MODEL_HELP

    from poot.cli.run import add_precision_args

    p = sub.add_parser("serve", help="serve a model over the OpenAI HTTP API")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--backend", default=None,
                   help="backend name (default: the best available; `poot backends` marks it)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--name", default=None,
                   help="the model name clients ask for (default: MODEL as given)")
    p.add_argument("--max-batch", type=int, default=8,
                   help="sequences decoded together in one step")
    p.add_argument("--max-seq", type=int, default=1024,
                   help="positions per sequence (prompt + answer)")
    p.add_argument("--kv-pool", type=int, default=None, metavar="TOKENS",
                   help="KV pool size in token slots (default: max-batch x max-seq)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a batch row; more get 429")
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
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="recompute every prompt (by default requests share the KV blocks of a "
                        "common prompt prefix, kept until the pool needs them)")
    p.add_argument("--default-max-tokens", type=int, default=None, metavar="N",
                   help="the answer length of a request that names no max_tokens (default: "
                        "16 for /v1/completions, as OpenAI's, and 1024 for chat; never past "
                        "the end of the context)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="every /v1 route wants 'Authorization: Bearer KEY' and answers 401 "
                        "without it (default: $POOT_API_KEY; unset: no auth). /health, "
                        "/ready and /metrics stay open")
    p.add_argument("--shutdown-grace", type=float, default=20.0, metavar="SECONDS",
                   help="on SIGTERM stop accepting, let running requests finish for up to "
                        "SECONDS, cancel the rest, then exit 0 (default 20)")
    p.add_argument("--speculate", default=None, metavar="lookup|draft:MODEL|self:N",
                   help="speculative decoding: each sequence proposes tokens by prompt "
                        "lookup (those that followed the last match of its text's final "
                        "n-gram), by a draft model sharing the tokenizer (draft:MODEL, "
                        "loaded beside this one, every row drafted in the same batched "
                        "steps) or by this model's first N layers and head (self:N); one "
                        "step verifies every proposal of the batch (greedy text is "
                        "unchanged; a request may send \"speculate\": false)")
    p.add_argument("--draft-tokens", type=int, default=None, metavar="K",
                   help="the most tokens a sequence proposes per step (default 7; each "
                        "step picks fewer from its measured acceptance, none where "
                        "proposals fail)")
    p.add_argument("--allow-image-urls", action="store_true",
                   help="a vision model's chat requests may give images as http(s) URLs, "
                        "which the server fetches (by default only base64 data URLs)")
    p.add_argument("--mmproj", default=None, metavar="FILE",
                   help="the vision projector GGUF of a GGUF language model (llama.cpp's "
                        "mmproj: Gemma 3, Idefics3 / SmolVLM, Qwen2-VL or Qwen2.5-VL): chat "
                        "requests take images")
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_precision_args(p)


def check(args) -> list:
    """Every flag, before anything loads; the parsed --lora adapters."""
    from pathlib import Path

    from poot.cli import checks, images
    from poot.errors import RequestError
    from poot.models.lora import parse_named
    from poot.models.speculate import check_draft_tokens
    from poot.serve.engine import check_speculate

    for flag in ("--max-batch", "--max-seq", "--kv-pool", "--prefill-chunk",
                 "--prefill-batch", "--expert-pool", "--default-max-tokens"):
        checks.count(flag, getattr(args, flag[2:].replace("-", "_")))
    checks.count("--max-queue", args.max_queue, lo=0)
    checks.precision(args)
    if not 0 <= args.shutdown_grace <= 3600:
        raise RequestError(f"--shutdown-grace must be in 0..3600 seconds, got "
                           f"{args.shutdown_grace}")
    if not 0 <= args.port <= 65535:
        raise RequestError(f"--port must be in 0..65535, got {args.port}")
    check_speculate(args.speculate)
    if args.draft_tokens is not None:
        check_draft_tokens(args.draft_tokens)
    images.check_mmproj(args.mmproj)
    adapters = [parse_named(x) for x in args.lora]
    for (_, path), spec in zip(adapters, args.lora, strict=True):
        if not Path(path).is_dir():
            raise RequestError(f"--lora {spec}: no such adapter folder")
    return adapters


def bind_check(host: str, port: int) -> None:
    """Refuse an address that cannot be bound now, before minutes of loading."""
    import errno
    import socket

    from poot.errors import RequestError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise RequestError(f"--host {host}: {exc}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            busy = exc.errno == errno.EADDRINUSE
            raise RequestError(f"cannot listen on {host}:{port}: {exc.strerror or exc}"
                               + (" (`poot ps` lists the poot servers running)" if busy
                                  else "")) from None


def how_speculating(engine) -> str:
    """The startup line's words for the server's proposer."""
    k = f"up to {engine.draft_tokens} tokens a step"
    d = engine.drafts
    if d is None:
        return f"by prompt lookup ({k})"
    n = d.model.config.layers
    return f"with the draft {d.stats()['draft_model']} ({n} layer{'s' * (n != 1)}, {k})"


def _graceful_exit(signum, frame):
    raise SystemExit(0)


def api_key(args) -> str | None:
    """--api-key, else $POOT_API_KEY; None (no auth) where neither is set or it is empty."""
    import os

    return args.api_key or os.environ.get("POOT_API_KEY") or None


def run(args) -> int:
    import signal
    import time
    from pathlib import Path

    from poot.optional import require

    uvicorn = require("uvicorn")
    from poot.cli.run import progress_lines
    from poot.models.runner import load
    from poot.serve.app import create_app
    from poot.serve.engine import Engine
    from poot.serve.records import Record

    adapters = check(args)
    bind_check(args.host, args.port)
    progress = progress_lines(args.quiet)
    t0 = time.perf_counter()
    model = load(args.model, args.backend, kv="paged", max_seq=args.max_seq,
                 prefill_tokens=args.prefill_chunk, progress=progress,
                 lora=adapters, expert_pool=args.expert_pool,
                 precision=args.precision, kv_dtype=args.kv_dtype)
    if args.mmproj is not None:     # before the engine, which plans for the tower it finds
        from poot.models.vision.mmproj import attach

        attach(model, args.mmproj)
    name = args.name or (Path(args.model).stem if Path(args.model).exists() else args.model)
    engine = Engine(model, name=name, max_batch=args.max_batch, pool_tokens=args.kv_pool,
                    max_queue=args.max_queue, prefill_batch=args.prefill_batch,
                    overlap=not args.no_overlap, default_max_tokens=args.default_max_tokens,
                    prefix_cache=not args.no_prefix_cache, speculate=args.speculate,
                    draft_tokens=args.draft_tokens, allow_image_urls=args.allow_image_urls)
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
          + (f"speculating {how_speculating(engine)}, " if engine.speculate else "")
          + ("taking images (one image request at a time), " if engine.images else "") +
          f"loaded in {time.perf_counter() - t0:.1f} s, at {url}; warming: "
          f"{s['plans_waiting']} plans to make (GET /ready answers 503 until they exist), "
          f"then {s['extra_plans_waiting']} extra ones in the background (the "
          f"{' and '.join(s['extra_plans'])} decode plans some requests need)",
          file=sys.stderr, flush=True)
    local = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    record = Record(model=name, file=str(model.checkpoint.path), backend=model.backend.name,
                    device=str(model.device), url=f"http://{local}:{args.port}/v1",
                    max_batch=args.max_batch)
    engine.start()
    record.write()
    # uvicorn shuts down gracefully on SIGTERM: it stops accepting, waits up to
    # --shutdown-grace for running requests (streams included), cancels those still running
    # (which cancels their sequences), then raises the signal again: with this handler that
    # ends in SystemExit(0), so the record and the engine are cleaned up below
    signal.signal(signal.SIGTERM, _graceful_exit)
    try:
        uvicorn.run(create_app(engine, api_key=api_key(args)), host=args.host, port=args.port,
                    log_level="warning" if args.quiet else "info",
                    access_log=args.access_log,
                    timeout_graceful_shutdown=args.shutdown_grace)
    finally:
        record.remove()
        engine.close()
    return 0
