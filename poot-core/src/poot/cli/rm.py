"""`poot rm MODEL`: delete a model from poot's cache."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("rm", help="delete a model from the cache (`poot list` names them)")
    p.add_argument("model", nargs="+", help="a name `poot list` shows (smollm2, a file name)")


def run(args) -> int:
    from poot.cli.doctor import human
    from poot.models.store import find, remove

    names = list(dict.fromkeys(args.model))
    for name in names:      # every name is checked before any is deleted
        find(name)
    for name in names:
        m = remove(name)
        print(f"deleted {m.name} ({m.path}, {human(m.bytes)})")
    return 0
