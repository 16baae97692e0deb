"""poot_quant's plugin module (entry point `poot` -> `quant`): formats and checkpoint loaders."""
from __future__ import annotations

from pathlib import Path

from poot.plugin import hookimpl

from poot_quant.checkpoint import Checkpoint, open_checkpoint
from poot_quant.gguf_file import is_gguf, looks_gguf
from poot_quant.registry import ALL_FORMATS
from poot_quant.safetensors_dir import is_safetensors

#: format hints this plugin answers to
HINTS = ("gguf", "safetensors")


@hookimpl
def poot_weight_formats():
    return list(ALL_FORMATS)


@hookimpl
def poot_open_checkpoint(path: str, format_hint: str | None) -> Checkpoint | None:
    """Claim GGUF files and safetensors files/folders; pass (None) on anything else."""
    p = Path(path)
    if format_hint and format_hint.lower() not in HINTS:
        return None
    if format_hint or is_gguf(p) or looks_gguf(p) or is_safetensors(p):
        return open_checkpoint(p, format_hint)
    return None
