"""`poot conformance NAME`: run the backend conformance suite (pytest, in-process)."""
from __future__ import annotations

DEFAULT_SUPPORT = "docs/support/{name}.md"


def add_parser(sub):
    p = sub.add_parser("conformance", help="check an installed backend against the oracle "
                       "(pytest --pyargs poot.conformance --poot-backend NAME); arguments "
                       "after -- go to pytest")
    p.add_argument("backend", help="installed backend name (see `poot backends`)")
    p.add_argument("--support", nargs="?", const=DEFAULT_SUPPORT, default=None,
                   metavar="PATH", help="write the support matrix to PATH "
                   f"(default {DEFAULT_SUPPORT})")
    p.add_argument("--perf", action="store_true", help="print GB/s or FLOP/s per case")
    p.add_argument("--device", type=int, default=0, help="device index (default 0)")
    p.add_argument("--seed", type=int, default=None, help="seed of the case inputs")
    p.add_argument("-k", dest="keyword", default=None,
                   help="only cases whose id matches this pytest -k expression")
    p.set_defaults(pytest_args=[])  # what follows `--`: further pytest arguments


def pytest_argv(args) -> list[str]:
    # poot is imported before pytest starts, so pytest cannot rewrite its asserts (the
    # suite's messages are explicit): silence that one warning
    # -q unless the caller asks for verbose output (`poot conformance NAME -- -v`)
    verbose = any(a == "--verbose" or a.startswith("-v") for a in args.pytest_args)
    argv = ["--pyargs", "poot.conformance", "--poot-backend", args.backend,
            "--poot-device", str(args.device), *([] if verbose else ["-q"]),
            "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
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
    from poot.optional import require
    from poot.plugin import get_backend

    pytest = require("pytest")

    # an unknown name, or a plugin that failed to load: one clear line saying which and why
    get_backend(args.backend)
    return int(pytest.main(pytest_argv(args)))
