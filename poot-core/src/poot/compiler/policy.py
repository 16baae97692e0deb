"""The fusion policy: which rewrites compile may do, beside what the target allows."""
from __future__ import annotations

from dataclasses import dataclass, field

from poot.errors import PootError


class PolicyError(PootError):
    """A Policy field holds a value compile does not know."""


@dataclass(frozen=True)
class Policy:
    """What compile is allowed to rewrite; the target's capability table decides the rest.

    attention: "auto" rewrites every supported attention chain, "never" keeps the
    primitives. The limits bound the attention rewrite by shape (None: no limit);
    a chain over a limit stays primitive and the report says why.
    disable: pass names to skip (e.g. {"epilogue"}); see poot.compiler.pipeline.PASSES.
    """

    attention: str = "auto"
    attention_max_keys: int | None = None
    attention_max_head_dim: int | None = 256
    disable: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self):
        if self.attention not in ("auto", "never"):
            raise PolicyError(f"policy.attention must be 'auto' or 'never', not "
                              f"{self.attention!r}")
        object.__setattr__(self, "disable", frozenset(self.disable))
