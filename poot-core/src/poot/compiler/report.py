"""What each pass did, and why each candidate was or was not rewritten."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Decision:
    """One candidate a pass looked at: where, what it would become, and the verdict."""

    candidate: str          # what the pass looked for: "Rope", "Attention", "Fused", ...
    at: str                 # the value it is rooted at, e.g. "%42"
    rewritten: bool
    reason: str

    def __str__(self) -> str:
        verdict = "rewritten" if self.rewritten else "kept"
        return f"{self.candidate} at {self.at}: {verdict} ({self.reason})"


@dataclass
class PassRecord:
    """One pass: eqn counts before and after, time taken, and its decisions."""

    name: str
    eqns_before: int = 0
    eqns_after: int = 0
    seconds: float = 0.0
    decisions: list[Decision] = field(default_factory=list)
    skipped: str | None = None

    def rewrote(self, candidate: str, at, reason: str) -> None:
        self.decisions.append(Decision(candidate, repr(at), True, reason))

    def kept(self, candidate: str, at, reason: str) -> None:
        self.decisions.append(Decision(candidate, repr(at), False, reason))

    @property
    def rewrites(self) -> int:
        return sum(d.rewritten for d in self.decisions)

    def summary(self) -> str:
        if self.skipped:
            return f"{self.name}: skipped ({self.skipped})"
        return (f"{self.name}: {self.eqns_before} -> {self.eqns_after} eqns, "
                f"{self.rewrites} rewritten, {len(self.decisions) - self.rewrites} kept, "
                f"{self.seconds * 1e3:.1f} ms")


@dataclass
class CompileReport:
    """The passes in order; `explain()` is what `poot compile --explain` prints."""

    target: str
    passes: list[PassRecord] = field(default_factory=list)
    graph: object = None    # the rewritten Graph, printed by explain()

    def record(self, name: str) -> PassRecord:
        rec = PassRecord(name)
        self.passes.append(rec)
        return rec

    def __getitem__(self, name: str) -> PassRecord:
        for p in self.passes:
            if p.name == name:
                return p
        raise KeyError(f"no pass named {name!r}; passes: {[p.name for p in self.passes]}")

    def decisions(self, candidate: str | None = None) -> list[Decision]:
        return [d for p in self.passes for d in p.decisions
                if candidate is None or d.candidate == candidate]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.passes)

    def explain(self, graph: bool = True, limit: int | None = None) -> str:
        """Every pass's summary and decisions (the first `limit` per pass), then the graph."""
        lines = [f"compile for {self.target}: {self.seconds * 1e3:.1f} ms"]
        for p in self.passes:
            lines.append(p.summary())
            shown = p.decisions if limit is None else p.decisions[:limit]
            lines += [f"  {d}" for d in shown]
            if len(shown) < len(p.decisions):
                rest = Counter(d.rewritten for d in p.decisions[len(shown):])
                lines.append(f"  ... {rest[True]} more rewritten, {rest[False]} more kept")
        if graph and self.graph is not None:
            lines += ["", "rewritten graph:", str(self.graph)]
        return "\n".join(lines)
