"""Running servers: each `poot serve` keeps a small record in <cache>/run/<pid>.json while it
runs (removed on exit), which `poot ps` lists. A record whose process is gone (killed
before it could remove it) is stale and pruned on reading: its pid no longer runs, or runs
a process that started at another time (the pid was reused)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def run_dir() -> Path:
    from poot.paths import cache_dir

    return cache_dir() / "run"


def _started(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, started: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass                     # another user's process: it runs
    return started is None or _started(pid) in (None, started)


class Record:
    """This process's record: written by `write`, removed by `remove` (at exit too)."""

    def __init__(self, **fields):
        self.path = run_dir() / f"{os.getpid()}.json"
        self.fields = {"pid": os.getpid(), "started": time.time(),
                       "process_started": _started(os.getpid()), **fields}

    def write(self) -> None:
        import atexit

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.fields))
        os.replace(tmp, self.path)
        atexit.register(self.remove)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def running() -> list[dict]:
    """The records of the servers running now, oldest first; stale ones are deleted."""
    root = run_dir()
    out = []
    for p in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            rec = json.loads(p.read_text())
            pid = int(rec["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            p.unlink(missing_ok=True)            # unreadable: not a record of ours
            continue
        if not _alive(pid, rec.get("process_started")):
            p.unlink(missing_ok=True)
            continue
        out.append(rec)
    return sorted(out, key=lambda r: r.get("started", 0))
