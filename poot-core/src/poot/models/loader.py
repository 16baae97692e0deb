"""Open a model by name or path through the checkpoint plugins, with its config."""
from __future__ import annotations

from pathlib import Path

from poot.errors import CheckpointError
from poot.optional import install_command


def open_checkpoint(path: Path):
    from poot.plugin import manager

    m = manager()
    ckpt = m.open_checkpoint(str(path))
    if ckpt is None:
        why = m.failure("quant")
        need = (f"poot-quant failed to load ({why})" if why else
                f"GGUF files and safetensors folders need poot-quant: "
                f"{install_command('poot-quant')}")
        raise CheckpointError(f"{path}: no installed plugin reads this file ({need})")
    return ckpt


def open_model(name_or_path: str, *, max_seq: int | None = None, pull_missing: bool = True):
    """(checkpoint, LlamaConfig) for "smollm2", a .gguf file or an HF folder."""
    from poot.models import config as C
    from poot.models.hub import resolve_model

    path = resolve_model(name_or_path, pull_missing=pull_missing)
    ckpt = open_checkpoint(path)
    if ckpt.kind == "gguf":
        return ckpt, C.from_gguf(ckpt.metadata, ckpt.tensors, max_seq)
    return ckpt, C.from_hf(ckpt.metadata, ckpt.tensors, max_seq)
