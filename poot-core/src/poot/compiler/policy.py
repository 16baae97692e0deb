"""The fusion policy: which rewrites compile may do, beside what the target allows."""
from __future__ import annotations

from dataclasses import dataclass, field

from poot.capability import every_op_key
from poot.errors import PootError


class PolicyError(PootError):
    """A Policy field holds a value compile does not know."""


class PrecisionError(PolicyError):
    """A precision level or KV dtype is unknown, or the target cannot run it
    (poot.compiler.precision)."""


#: the precision levels (docs/ir.md section 15), the default first
PRECISIONS = ("exact", "fast")


@dataclass(frozen=True)
class Policy:
    """What compile is allowed to rewrite; the target's capability table decides the rest.

    attention: "auto" rewrites every supported attention chain, "never" keeps the
    primitives. The limits bound the attention rewrite by shape (None: no limit);
    a chain over a limit stays primitive and the report says why.
    disable: pass names to skip (e.g. {"epilogue"}); see poot.compiler.pipeline.PASSES.
    fuse: op keys of composites the target declares without electing them
    (`CapabilityTable.unelected`) that compile forms anyway, e.g.
    {"NormedPackedContraction"} to run a fused kernel a software device keeps apart.
    precision: "exact" keeps every contraction's f32 activations; "fast" rounds those of
    16-bit weights to the weight's dtype and those of integer-coded packed weights to int8
    rows (the precision pass, docs/ir.md section 15).
    """

    attention: str = "auto"
    attention_max_keys: int | None = None
    attention_max_head_dim: int | None = 256
    disable: frozenset[str] = field(default_factory=frozenset)
    precision: str = "exact"
    fuse: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self):
        if self.attention not in ("auto", "never"):
            raise PolicyError(f"policy.attention must be 'auto' or 'never', not "
                              f"{self.attention!r}")
        object.__setattr__(self, "disable", frozenset(self.disable))
        object.__setattr__(self, "fuse", frozenset(self.fuse))
        unknown = sorted(self.fuse - set(every_op_key()))
        if unknown:
            raise PolicyError(f"policy.fuse names unknown op keys {unknown}; see "
                              f"poot.capability.every_op_key()")
        if self.precision not in PRECISIONS:
            raise PrecisionError(f"unknown precision {self.precision!r}; the levels are "
                                 f"{', '.join(PRECISIONS)}")
