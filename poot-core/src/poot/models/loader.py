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
        if why:
            need = f"poot-quant failed to load ({why})"
        elif not m.pm.hook.poot_open_checkpoint.get_hookimpls():
            need = (f"GGUF files and safetensors folders need poot-quant: "
                    f"{install_command('poot-quant')}")
        else:
            need = missing_weights(path)
        raise CheckpointError(f"{path}: no installed plugin reads this file ({need})"
                              if path.is_file() else f"{path}: {need}")
    return ckpt


def missing_weights(path: Path) -> str:
    """What a folder that no checkpoint plugin claims lacks (the readers are installed)."""
    if not path.is_dir():
        return "not a GGUF file, nor a safetensors file"
    have = sorted(p.name for p in path.iterdir())
    shown = ", ".join(have[:8]) + (f" and {len(have) - 8} more" if len(have) > 8 else "")
    return (f"no weights: an HF model folder holds its tensors in *.safetensors files "
            f"(model.safetensors, or shards listed by model.safetensors.index.json) next "
            f"to config.json; this folder has {shown or 'nothing'}")


def open_model(name_or_path: str, *, max_seq: int | None = None, pull_missing: bool = True):
    """(checkpoint, LlamaConfig) for "smollm2", a .gguf file or an HF folder."""
    from poot.models import config as C
    from poot.models.hub import resolve_model

    path = resolve_model(name_or_path, pull_missing=pull_missing)
    ckpt = open_checkpoint(path)
    if ckpt.kind == "gguf":
        return ckpt, C.from_gguf(ckpt.metadata, ckpt.tensors, max_seq)
    from poot.models.vision.config import is_vision_config

    if ckpt.metadata.get("model_type") == "qwen2_5_vl":
        from poot.models.vision.qwen25vl_weights import open_qwen25vl

        return open_qwen25vl(ckpt, max_seq)
    if is_vision_config(ckpt.metadata):   # the text model's view, the tower beside it
        from poot.models.vision.weights import open_vision

        return open_vision(ckpt, max_seq)
    return ckpt, C.from_hf(ckpt.metadata, ckpt.tensors, max_seq)
