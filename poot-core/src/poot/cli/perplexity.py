"""`poot perplexity MODEL --text FILE`: perplexity over a text in windows and, against a
second configuration of the same model, the KL divergence of the next-token distributions
and the top-1 agreement (poot.models.perplexity; llama.cpp's `llama-perplexity` method)."""
from __future__ import annotations

import json
import sys
from typing import NamedTuple

from poot.cli.run import add_precision_args


def add_parser(sub):
    from poot.cli import MODEL_HELP

    p = sub.add_parser("perplexity", help="perplexity over a text, and the KL divergence "
                       "from a second configuration (precision, KV dtype or backend)")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--text", required=True, metavar="FILE", help="a UTF-8 text file")
    p.add_argument("--backend", default=None, help="backend name (default: best available)")
    add_precision_args(p)
    p.add_argument("--against", default=None, metavar="exact|fast",
                   help="compare against the same model at this precision (with its default "
                        "KV dtype unless --against-kv-dtype says)")
    p.add_argument("--against-kv-dtype", default=None, metavar="f32|f16|q8_0",
                   help="compare against the same model with this KV dtype")
    p.add_argument("--against-backend", default=None, metavar="NAME",
                   help="compare against the same model on this backend")
    p.add_argument("--window", type=int, default=512,
                   help="tokens a window (each from an empty cache; its second half is "
                        "scored)")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="score only the text's first N tokens (default: all)")
    p.add_argument("--chunk", type=int, default=None,
                   help="tokens a step runs at once, each with its logits (default: the "
                        "window, up to a cap that bounds the logits held at once)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args) -> int:
    import time
    from pathlib import Path

    from poot.cli import checks
    from poot.cli.run import progress_lines
    from poot.errors import RequestError
    from poot.models.perplexity import evaluate
    from poot.models.runner import load

    checks.count("--window", args.window, lo=4)
    checks.count("--chunk", args.chunk)
    checks.count("--max-tokens", args.max_tokens)
    checks.precision(args)
    try:
        text = Path(args.text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RequestError(f"--text {args.text}: cannot read it as UTF-8 text ({exc})",
                           param="text") from None
    progress = progress_lines(args.quiet)
    t0 = time.perf_counter()
    tested = Config(args.backend, args.precision, args.kv_dtype)
    against = (args.against, args.against_kv_dtype, args.against_backend)
    base = None if against == (None, None, None) else Config(
        args.against_backend or args.backend, args.against or args.precision,
        args.against_kv_dtype if args.against_kv_dtype or args.against else args.kv_dtype)

    def open_config(c: Config):
        return load(args.model, c.backend, max_seq=args.window, progress=progress,
                    precision=c.precision, kv_dtype=c.kv_dtype)

    model = open_config(tested)
    base_model = open_config(base) if base is not None else None
    ids = model.tokenize(text, add_special=False)[: args.max_tokens]
    names = [describe(m) for m in (model, base_model) if m is not None]
    progress(f"{Path(args.text).name}: {len(ids)} tokens, {len(ids) // args.window} windows "
             f"of {args.window}; {' against '.join(names)}")

    def each_window(done: int, total: int) -> None:
        progress(f"window {done}/{total} ({time.perf_counter() - t0:.1f} s)")

    summary = evaluate(model, ids, args.window, base=base_model, chunk=args.chunk,
                       progress=each_window)
    if args.json:
        print(json.dumps({"model": args.model, "text": args.text, "window": args.window,
                          "tokens": len(ids), "tested": names[0],
                          "base": names[1] if base_model else None, **summary.as_dict()}))
    else:
        print(f"{names[0]}" + (f" against {names[1]}" if base_model else ""))
        for line in summary.lines():
            print(line)
    sys.stdout.flush()
    return 0


class Config(NamedTuple):
    """One configuration of the model: backend (None: the best), precision, KV dtype
    (None: the precision's)."""

    backend: str | None
    precision: str
    kv_dtype: str | None


def describe(model) -> str:
    """A loaded configuration in words: `cpu, fast, KV f16`."""
    return f"{model.backend.name}, {model.precision}, KV {model.kv_dtype}"
