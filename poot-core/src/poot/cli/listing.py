"""`poot list`: the models in poot's cache, with their sizes (poot.cli.MODULES says why
the module is not called `list`)."""
from __future__ import annotations


def add_parser(sub):
    sub.add_parser("list", help="list the models in the cache (what `poot pull` fetched)")


def run(args) -> int:
    import time

    from poot.cli.doctor import human
    from poot.models.store import cached_models, models_dir

    models = cached_models()
    if not models:
        print(f"no models in {models_dir()}; `poot pull smollm2` fetches one")
        return 0
    rows = [("NAME", "FILE", "SIZE", "MODIFIED")] + [
        (m.name, m.path.name, human(m.bytes),
         time.strftime("%Y-%m-%d %H:%M", time.localtime(m.modified))) for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[3])
    print(f"in {models_dir()}")
    return 0
