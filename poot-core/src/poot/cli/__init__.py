"""The `poot` command. One module per subcommand, each with `add_parser` and `run`.

Every error a user can cause (a PootError) ends as one clear line on stderr
and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand modules, in help order (poot.cli.<name>)
COMMANDS = ["run", "serve", "perplexity", "pull", "list", "ps", "rm", "info", "graph",
            "compile", "plan", "backends", "conformance", "doctor"]


#: the model argument's help, the same for every command that opens one
MODEL_HELP = ("smollm2, gemma3-270m, a Hugging Face Hub repo (ORG/NAME[:QUANT]), a .gguf "
              "file or an HF folder")

#: subcommands whose module has another name: a submodule called `list` would become the
#: package attribute `list`, hiding the builtin in this module
MODULES = {"list": "listing"}


def _load(name: str):
    return importlib.import_module(f"poot.cli.{MODULES.get(name, name)}")


class _Version(argparse.Action):
    """--version, reading the installed packages only when asked."""

    def __call__(self, parser, namespace, values, option_string=None):
        from poot.versions import core_version, installed

        packages = ", ".join(f"{name} {v}" for name, v in installed().items())
        print(f"poot {core_version()} ({packages or 'no package metadata'})")
        parser.exit()


class _SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: its help gives every option's default (poot.cli.checks)."""

    def __init__(self, **kwargs):
        from poot.cli.checks import Defaults

        kwargs.setdefault("formatter_class", Defaults)
        super().__init__(**kwargs)


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """The parser and each subcommand's handler; with `only`, that subcommand's alone (its
    module imported, the others' not: a run holds no other command's code)."""
    parser = argparse.ArgumentParser(prog="poot", description="poot: one Graph IR, many GPU "
                                     "backends. Run a model, inspect graphs and plans, list "
                                     "backends, check a backend against the oracle.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="show poot's version and every installed poot package's, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                parser_class=_SubcommandParser)
    handlers = {}
    for name in [only] if only in COMMANDS else COMMANDS:
        mod = _load(name)
        mod.add_parser(sub)
        handlers[name] = mod.run
    return parser, handlers


def main(argv: list[str] | None = None) -> int:
    from poot.errors import PootError

    argv = sys.argv[1:] if argv is None else list(argv)
    parser, handlers = build_parser(argv[0] if argv else None)
    # everything after "--" goes to a command's `pytest_args` untouched (argparse would
    # refuse it after an option: `poot conformance NAME -k CASE -- -v`)
    tail = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(tail) - 1] if "--" in argv else argv)
    if "--" in argv:
        if not hasattr(args, "pytest_args"):
            parser.error(f"`poot {args.command}` takes no arguments after --")
        args.pytest_args = list(args.pytest_args) + tail
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(handlers[args.command](args) or 0)
    except PootError as exc:
        print(f"poot: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("poot: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
