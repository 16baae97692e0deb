"""Every format poot_quant provides, by name."""
from __future__ import annotations

from poot.errors import FormatError

from poot_quant.base import Format
from poot_quant.fp4 import FP4_FORMATS
from poot_quant.fp8 import FP8_FORMATS
from poot_quant.gguf_blocks import GGUF_FORMATS
from poot_quant.intgroup import INT_FORMATS

ALL_FORMATS: list[Format] = [*GGUF_FORMATS, *INT_FORMATS, *FP8_FORMATS, *FP4_FORMATS]
_BY_NAME = {f.name: f for f in ALL_FORMATS}


def formats() -> list[str]:
    """The names of the formats poot_quant provides, sorted."""
    return sorted(_BY_NAME)


def get(name: str) -> Format:
    """The format called `name` (e.g. "gguf:Q4_K", "gptq:int4"); FormatError if unknown."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise FormatError(f"unknown packed weight format {name!r}; poot_quant provides: "
                          f"{', '.join(formats())}") from None
