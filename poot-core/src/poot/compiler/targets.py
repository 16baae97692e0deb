"""A target that declares less than another: to see what compile does on a backend
that lacks some composites (`poot compile --without Attention`), and to test it."""
from __future__ import annotations

from dataclasses import replace

from poot.contract import Backend


class LimitedBackend(Backend):
    """`base` without the op keys in `without` (e.g. {"Attention", "Rope"})."""

    def __init__(self, base: Backend, without):
        self.base, self.without = base, frozenset(without)
        self.name = f"{base.name}-without-{'-'.join(sorted(self.without))}"
        self.priority = base.priority

    def probe(self):
        return self.base.probe()

    def unavailable_reason(self):
        return self.base.unavailable_reason()

    def capabilities(self, device):
        table = self.base.capabilities(device)
        ops = {k: v for k, v in table.ops.items() if k not in self.without}
        return replace(table, backend=self.name, ops=ops)
