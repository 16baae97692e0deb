"""The scalar helpers (poot.codegen.scalar) one kernel calls, as WGSL functions.

Each helper's meaning is its table entry: WGSL leaves some of poot's rules
implementation-defined (max with NaN, out-of-range float-to-int) or different (x / 0 = x,
shift amounts taken mod 32), so the entries spell them out; where a WGSL builtin already
is the rule (`exp`, wrapping `+` on i32) the call is that builtin, and no function is
printed. A helper whose body is a shared expression is printed by the kernel's printer.
"""
from __future__ import annotations

from poot.codegen.scalar import HELPERS, Helper, shared_lets
from poot.dtypes import DType

LANGUAGES = ("wgsl",)
TYPES = {DType.F32: "f32", DType.I32: "i32", DType.U32: "u32"}


class Helpers:
    """The helper functions one kernel uses, emitted before its entry point; `printer`
    prints the shared bodies (`body_lines(lets, result)`: a function body's lines)."""

    def __init__(self, printer):
        self.printer, self.used = printer, []

    def call(self, name: str, *args: str) -> str:
        helper = HELPERS[name]
        if helper.spelling(LANGUAGES)[0] != "inline":
            self.need(name)
        return helper.call(LANGUAGES, *args)

    def need(self, name: str) -> None:
        if name in self.used:
            return
        for dep in HELPERS[name].needs:
            self.need(dep)
        self.used.append(name)

    def source(self) -> str:
        """Every used helper as a function (printing a shared body may use more)."""
        out, done = [], 0
        while done < len(self.used):
            out.append(self.function(HELPERS[self.used[done]]))
            done += 1
        return "\n".join(out)

    def function(self, h: Helper) -> str:
        kind, spelled = h.spelling(LANGUAGES)
        if kind == "body":
            lines = self.printer.body_lines(h.params, *shared_lets(spelled))
        else:
            lines = spelled.splitlines()
        params = ", ".join(f"{p}: {TYPES[d]}" for p, d in h.params)
        result = "bool" if h.result is None else TYPES[h.result]
        return "\n".join([f"fn {h.name}({params}) -> {result} {{",
                          *(f"  {x}" for x in lines), "}"])
