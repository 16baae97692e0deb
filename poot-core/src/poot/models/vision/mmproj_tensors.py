"""A vision projector GGUF's tensors (llama.cpp's mmproj) checked against those its tower
reads, before anything is built: each present, of its shape, dense, and nothing else."""
from __future__ import annotations

from poot.errors import CheckpointError


def check_tensors(tensors: dict, want: dict, where: str) -> dict:
    """The file's tensors under poot's names, each present, dense and of its shape."""
    from poot.dtypes import DType

    extra = sorted(set(tensors) - set(want))
    if extra:
        raise CheckpointError(f"{where}: tensor {extra[0]!r} is not one of the tower's or "
                              f"the connector's (per clip.projector_type and clip.vision.*)")
    out = {}
    for name, (ours, shape) in want.items():
        info = tensors.get(name)
        if info is None:
            raise CheckpointError(f"{where}: lacks tensor {name!r} (shape {list(shape)})")
        if tuple(info.shape) != shape:
            raise CheckpointError(f"{where}: tensor {name!r} is {list(info.shape)}, not "
                                  f"{list(shape)} (per its clip.vision keys and the language "
                                  f"model)")
        if info.dtype not in (DType.F32, DType.F16, DType.BF16):
            raise CheckpointError(f"{where}: tensor {name!r} is {info.storage}; poot reads "
                                  f"f32, f16 and bf16 vision towers")
        out[ours] = info
    return out
