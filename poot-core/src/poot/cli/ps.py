"""`poot ps`: the poot servers running on this machine (poot.serve.records), each with its
model, address, backend, uptime and whether it is ready (its /ready)."""
from __future__ import annotations


def add_parser(sub):
    sub.add_parser("ps", help="list the running poot servers (`poot serve`) on this machine")


def readiness(url: str) -> str:
    """'ready', 'warming' or 'not answering', from the server's /ready."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/ready", timeout=2) as r:
            return json.load(r).get("status", "ready")
    except urllib.error.HTTPError as exc:
        try:
            return json.load(exc).get("status", f"HTTP {exc.code}")
        except ValueError:
            return f"HTTP {exc.code}"
    except (OSError, ValueError):
        return "not answering"


def _uptime(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def run(args) -> int:
    import time

    from poot.serve.records import run_dir, running

    records = running()
    if not records:
        print(f"no poot server is running (records in {run_dir()})")
        return 0
    rows = [("PID", "MODEL", "URL", "BACKEND", "UP", "STATUS")]
    for r in records:
        rows.append((str(r["pid"]), str(r.get("model", "?")), str(r.get("url", "?")),
                     str(r.get("backend", "?")), _uptime(time.time() - r.get("started", 0)),
                     readiness(str(r.get("url", "")).removesuffix("/v1"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    return 0
