"""What a pass sees besides the graph: the target's table, the policy, its record."""
from __future__ import annotations

from dataclasses import dataclass

from poot.capability import CapabilityTable
from poot.compiler.policy import Policy
from poot.compiler.report import PassRecord
from poot.compiler.view import GraphView
from poot.errors import PootError
from poot.ir.graph import Eqn, Lit, Operand, Value
from poot.ir.ops import OpKind


@dataclass
class PassContext:
    table: CapabilityTable
    policy: Policy
    record: PassRecord

    def refusal(self, op: OpKind, inputs: list[Operand], out: Eqn, view: GraphView,
                types: list | None = None) -> str | None:
        """Why `op(inputs)` cannot stand in for `out` here (its type differs, the target
        cannot lower it, or lowers it without electing it and the policy does not ask for
        it), or None when it can. `types`: the operands' types, where some are not in the
        graph yet (added by the rewrite)."""
        types = types or [x.type if isinstance(x, Lit) else
                          view.type_of(x.id if isinstance(x, Value) else x) for x in inputs]
        want = view.type_of(out.out)
        try:
            got = op.infer(types)
        except PootError as exc:
            return f"{op.name} does not type-check here: {exc}"
        if got != want:
            return f"{op.name} would give {got}, not {want}"
        err = self.table.refusal(op, types, want)
        if err is not None:
            return str(err)
        key = self.table.unelected_key(op, types, self.policy.fuse)
        return None if key is None else \
            f"{key} is declared but not elected on {self.table.device} (Policy(fuse=...))"
