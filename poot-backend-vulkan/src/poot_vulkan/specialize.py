"""A printed kernel's integer literals lifted into specialization constants.

Kernels of one kind differ mostly by sizes (a contraction's column count, an elementwise
kernel's extent and strides), which the printer writes as literals into `main()`. Each
such literal becomes a specialization constant, so kernels whose text is equal apart from
those literals and the comments compile to one SPIR-V module (one glslang compile, one
shader module), and each pipeline specializes it with its own values. The driver folds
specialization constants before it optimizes, so the code it makes is the code the
literals made: nothing is read per dispatch, unlike push constants.

Lifted: a decimal `int` literal of at least 2 in the body of `main()` (no `u` suffix, not
part of a name or a float literal), outside a local array's declared size and a
preprocessor line. 0 and 1 stay literals: they are the printer's truth values and
identities, never a size worth sharing, and leaving them keeps the skeleton's constant
folding. The declarations default to 1 (never 0: a divisor glslang folds in a
specialization-constant expression).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "poot_k"
_LITERAL = re.compile(r"(?<![\w.])(\d+)(?![\w.])")
_COMMENT = re.compile(r"//[^\n]*")
_LOCAL_ARRAY = re.compile(r"^\s*\w+\s+\w+\[\d+\];\s*$")
MAIN = "void main() {"


@dataclass(frozen=True)
class Shader:
    """A SPIR-V module, the values of its specialization constants (constant_id i holds
    `constants[i]`, an int32) and the subgroup its pipeline asks for."""

    spirv: bytes
    constants: tuple[int, ...] = ()
    #: the subgroup size its pipeline requires (0: any) and whether whole subgroups only
    #: (poot_vulkan.glsl.required_subgroup)
    subgroup: int = 0
    full_subgroups: bool = False


def lift(source: str) -> tuple[str, tuple[int, ...]]:
    """(the source with its comments dropped and its body's literals replaced by
    specialization constants, the literals' values in constant_id order)."""
    text = _COMMENT.sub("", source)
    head, sep, body = text.partition(MAIN)
    if not sep:
        return text, ()
    values: list[int] = []

    def constant(m: re.Match) -> str:
        value = int(m.group(1))
        if value < 2 or value > 2**31 - 1:
            return m.group(0)
        values.append(value)
        return f"{PREFIX}{len(values) - 1}"

    lines = [line if _LOCAL_ARRAY.match(line) or line.lstrip().startswith("#")
             else _LITERAL.sub(constant, line) for line in body.split("\n")]
    decls = "".join(f"layout(constant_id = {i}) const int {PREFIX}{i} = 1;\n"
                    for i in range(len(values)))
    return head + decls + sep + "\n".join(lines), tuple(values)


__all__ = ["Shader", "lift"]
