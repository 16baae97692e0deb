"""What a session found, per case: the terminal summary, the perf table, the support file."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass
class Row:
    case: object
    declared: bool
    ok: bool
    seconds: float = 0.0


class Report:
    def __init__(self, target):
        self.target = target
        self.rows: dict[str, Row] = {}

    def record(self, case, declared: bool, ok: bool, seconds: float = 0.0) -> None:
        self.rows[case.id] = Row(case, declared, ok, seconds)

    def by_key(self) -> dict[str, list[int]]:
        """op key -> [declared passed, declared failed, refused as declared, wrongly run]."""
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for r in self.rows.values():
            out[r.case.key][(0 if r.declared else 2) + (0 if r.ok else 1)] += 1
        return dict(sorted(out.items()))

    def summary_lines(self) -> list[str]:
        k = self.by_key()
        tot = [sum(v[i] for v in k.values()) for i in range(4)]
        lines = [f"declared cases: {tot[0]} matched the oracle, {tot[1]} failed; "
                 f"undeclared cases: {tot[2]} refused with a typed error, {tot[3]} not refused"]
        bad = [key for key, v in k.items() if v[1] or v[3]]
        if bad:
            lines.append(f"op keys with failures: {', '.join(bad)}")
        return lines

    def perf_lines(self) -> list[str]:
        lines = [f"{'case':60} {'us/step':>10} {'GB/s':>8} {'GFLOP/s':>8}"]
        for r in self.rows.values():
            if not (r.declared and r.ok and r.seconds > 0):
                continue
            c, s = r.case, r.seconds
            flops = f"{c.flops / s / 1e9:8.3f}" if c.flops else f"{'-':>8}"
            lines.append(f"{c.id[:60]:60} {s * 1e6:10.1f} {c.bytes_moved / s / 1e9:8.3f} {flops}")
        return lines

    def support_markdown(self) -> str:
        md = self.target.table.to_markdown()
        lines = ["", "## Conformance results", "",
                 f"`pytest --pyargs poot.conformance --poot-backend {self.target.backend.name}` "
                 f"(seed {self.target.seed}): per op key, declared cases that matched the "
                 "oracle and undeclared cases refused with a typed error.", "",
                 "| op | declared: passed | declared: failed | refused | not refused |",
                 "|---|---|---|---|---|"]
        lines += [f"| {key} | {v[0]} | {v[1]} | {v[2]} | {v[3]} |"
                  for key, v in self.by_key().items()]
        return md + "\n".join(lines) + "\n"

    def write_support(self, path: str) -> None:
        from pathlib import Path

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.support_markdown())


__all__ = ["Report", "Row"]
