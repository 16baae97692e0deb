"""`poot conformance NAME`: run the backend conformance suite (pytest, in-process)."""
from __future__ import annotations

DEFAULT_SUPPORT = "docs/support/{name}.md"


def add_parser(sub):
    p = sub.add_parser("conformance", help="check an installed backend against the oracle "
                       "(pytest --pyargs poot.conformance --poot-backend NAME)")
    p.add_argument("backend", help="installed backend name (see `poot backends`)")
    p.add_argument("--support", nargs="?", const=DEFAULT_SUPPORT, default=None,
                   metavar="PATH", help="write the support matrix to PATH "
                   f"(default {DEFAULT_SUPPORT})")
    p.add_argument("--perf", action="store_true", help="print GB/s or FLOP/s per case")
    p.add_argument("--device", type=int, default=0, help="device index (default 0)")
    p.add_argument("--seed", type=int, default=None, help="seed of the case inputs")
    p.add_argument("-k", dest="keyword", default=None,
                   help="only cases whose id matches this pytest -k expression")
    p.add_argument("pytest_args", nargs="*", help="further pytest arguments (after --)")


def pytest_argv(args) -> list[str]:
    # poot is imported before pytest starts, so pytest cannot rewrite its asserts (the
    # suite's messages are explicit): silence that one warning
    argv = ["--pyargs", "poot.conformance", "--poot-backend", args.backend,
            "--poot-device", str(args.device), "-q", "-p", "no:cacheprovider",
            "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if args.support:
        argv += ["--poot-support", args.support.format(name=args.backend)]
    if args.perf:
        argv.append("--poot-perf")
    if args.seed is not None:
        argv += ["--poot-seed", str(args.seed)]
    if args.keyword:
        argv += ["-k", args.keyword]
    return argv + list(args.pytest_args)


def run(args) -> int:
    import pytest

    from poot.backend import get_backend

    get_backend(args.backend)  # an unknown name: one clear line listing the installed ones
    return int(pytest.main(pytest_argv(args)))
