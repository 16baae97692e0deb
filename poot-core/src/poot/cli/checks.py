"""Checks of the model commands' flags, made before anything loads, each refusal naming
the flag as it is typed (`--top-p`, not the sampler's `top_p`)."""
from __future__ import annotations

import argparse
import math

from poot.errors import RequestError


class Defaults(argparse.HelpFormatter):
    """Help that ends each option's line with its default, where it has one worth saying
    (not None, False or an empty list) and the text does not give it already."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        default = action.default
        if default is None or default is argparse.SUPPRESS or isinstance(default, bool) or \
                default == [] or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def count(flag: str, value, lo: int = 1) -> None:
    """A whole number of at least `lo`."""
    if value is not None and value < lo:
        raise RequestError(f"{flag} must be a whole number of at least {lo}, got {value}")


def number(flag: str, value: float, lo: float, hi: float = math.inf,
           lo_open: bool = False) -> None:
    """A finite number in [lo, hi] ((lo, hi] when `lo_open`)."""
    if not (math.isfinite(value) and lo <= value <= hi) or (lo_open and value == lo):
        side = "(" if lo_open else "["
        top = f"{hi:g}]" if math.isfinite(hi) else "inf)"
        raise RequestError(f"{flag} must be a number in {side}{lo:g}, {top}, got {value:g}")


def sampling(args) -> None:
    """The sampler's flags of `poot run`, as poot.models.sampling.Sampler takes them, and
    its stop strings."""
    from poot.models.sampling import CANDIDATES

    number("--temperature", args.temperature, 0)
    number("--top-p", args.top_p, 0, 1, lo_open=True)
    number("--repetition-penalty", args.repetition_penalty, 0, lo_open=True)
    if not 0 <= args.top_k <= CANDIDATES:
        raise RequestError(f"--top-k must be a whole number in 0..{CANDIDATES} (0 = off; the "
                           f"sampler ranks at most {CANDIDATES} candidates), got {args.top_k}")
    if args.seed is not None and not 0 <= args.seed < 2 ** 64:
        raise RequestError(f"--seed must be a whole number in [0, 2^64), got {args.seed}")
    if "" in args.stop:
        raise RequestError("--stop must be a non-empty string (an empty one matches nowhere)")


def precision(args) -> None:
    """--precision and --kv-dtype among the known names (whether the backend runs them is
    poot.load's check, once the backend is picked)."""
    from poot.compiler.policy import PRECISIONS
    from poot.ops.kv import KV_DTYPES

    for flag, value, known in (("--precision", args.precision, PRECISIONS),
                               ("--kv-dtype", args.kv_dtype, KV_DTYPES)):
        if value is not None and value not in known:
            raise RequestError(f"{flag} must be one of {', '.join(known)}, got {value!r}")


def speculation(args) -> None:
    """--speculate and --draft-tokens: the mode's form, K's range, a draft that is a
    known name or an existing path, one rank."""
    from pathlib import Path

    from poot.models.hub import KNOWN_MODELS
    from poot.models.speculate import check_draft_tokens, parse

    if args.speculate is None:
        if args.draft_tokens is not None:
            raise RequestError("--draft-tokens sets how many tokens --speculate proposes; "
                               "give --speculate too")
        return
    spec = parse(args.speculate)
    if args.draft_tokens is not None:
        check_draft_tokens(args.draft_tokens)
    if spec.kind == "draft" and spec.arg not in KNOWN_MODELS:
        path = Path(spec.arg).expanduser()
        local = path.suffix.lower() == ".gguf" or spec.arg.startswith(("/", ".", "~"))
        if local and not path.exists():          # (ORG/NAME is a Hub repo: load resolves it)
            raise RequestError(f"--speculate draft:{spec.arg}: no such model file or folder")
    if getattr(args, "tp", 1) > 1:
        raise RequestError("--speculate runs on one rank; drop --tp")
