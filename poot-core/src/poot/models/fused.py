"""Projections a checkpoint stores fused by rows (Phi-3 / Phi-4: q|k|v as one qkv_proj, the
FFN's gate|up as one gate_up_proj; llama.cpp's phi3 GGUF files keep them so, as attn_qkv and
an ffn_up that holds gate|up).

The builder reads the q, k and v projections (and gate and up) either stacked by rows under
`poot.models.weights.stacked(parts)` or one by one. `FusedParts` serves both from the fused
tensor: the stacked name is the tensor as stored, each part its row range (a view of the
dense array, or of every row-holding source of a packed one), under its own identity.
"""
from __future__ import annotations

import re
from dataclasses import replace

from poot.errors import CheckpointError, FormatError

#: the fused tensors (GGUF-style names within a layer) and their parts in row order
QKV, GATE_UP = "attn_qkv.weight", "ffn_gate_up.weight"
PARTS = {QKV: ("attn_q.weight", "attn_k.weight", "attn_v.weight"),
         GATE_UP: ("ffn_gate.weight", "ffn_up.weight")}
_LAYER = re.compile(r"(blk\.\d+\.)(.+)")


def gguf_fused_name(name: str) -> str:
    """The name poot gives a tensor of a fused-family GGUF file: llama.cpp's converter writes
    gate|up under ffn_up, which poot calls ffn_gate_up (its ffn_up is the up part)."""
    m = _LAYER.fullmatch(name)
    return m.group(1) + GATE_UP if m and m.group(2) == "ffn_up.weight" else name


def part_rows(config) -> dict[str, tuple[int, ...]]:
    """Rows of each part of each fused tensor, by the config."""
    q, kv = config.heads * config.head_dim, config.kv_heads * config.head_dim
    return {QKV: (q, kv, kv), GATE_UP: (config.ffn, config.ffn)}


def check_fused(config, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Each fused tensor present (GGUF-style name -> shape) has the parts' rows and K = dim."""
    rows = part_rows(config)
    for name, shape in shapes.items():
        m = _LAYER.fullmatch(name)
        if not m or m.group(2) not in rows:
            continue
        want = (sum(rows[m.group(2)]), config.dim)
        if tuple(shape) != want:
            raise CheckpointError(
                f"{where}: fused tensor {name!r} is {list(shape)}, but the config (heads "
                f"{config.heads}, kv heads {config.kv_heads}, head dim {config.head_dim}, ffn "
                f"{config.ffn}, dim {config.dim}) implies {list(want)}")


class FusedParts:
    """The names the fused tensors among `present` serve: `alias` maps each to (fused tensor,
    first row, end row), or (fused tensor, None, None) for the stacked name (all of it);
    `stacked(parts)` spells a stacked name (poot.models.weights.stacked). Without a config
    only the stacked names are served (the row ranges need its sizes)."""

    def __init__(self, present, stacked, config=None):
        self.alias: dict[str, tuple[str, int | None, int | None]] = {}
        rows = part_rows(config) if config is not None else {}
        for name in present:
            m = _LAYER.fullmatch(name)
            if not m or m.group(2) not in PARTS:
                continue
            layer, kind = m.groups()
            parts = [layer + p for p in PARTS[kind]]
            self.alias[stacked(parts)] = (name, None, None)
            if kind in rows:
                start = 0
                for part, n in zip(parts, rows[kind], strict=True):
                    self.alias[part] = (name, start, start + n)
                    start += n

    def __contains__(self, name: str) -> bool:
        return name in self.alias

    def spec(self, name: str, fused_spec, arrays: dict):
        """The spec (a DenseSpec or PackedSpec) of alias `name` from the fused tensor's;
        a row range's arrays are added to `arrays` (label -> array)."""
        fused, start, end = self.alias[name]
        if start is None:
            return fused_spec
        tag = f"[{start}:{end}]"

        def ref_of(ref):
            return type(ref)(ref.checkpoint, ref.tensor + tag,
                             ref.payload and ref.payload + tag, ref.format)

        if hasattr(fused_spec, "ref"):      # dense: a view of its rows
            ref = ref_of(fused_spec.ref)
            arrays[ref.tensor] = arrays[fused_spec.ref.tensor][start:end]
            shape = (end - start, *fused_spec.type.shape[1:])
            return replace(fused_spec, type=type(fused_spec.type)(shape, fused_spec.type.dtype),
                           ref=ref)
        weight = fused_spec.weight
        try:
            holds = weight.source_rows()
        except FormatError as e:
            raise CheckpointError(f"{fused}: {e}, so its part {name} cannot be read "
                                  f"alone") from None
        refs = []
        for ref, row in zip(fused_spec.refs, holds, strict=True):
            if row:
                part = ref_of(ref)
                arrays[part.tensor] = arrays[ref.tensor][start:end]
                refs.append(part)
            else:
                refs.append(ref)
        return replace(fused_spec, weight=weight.with_rows(end - start), refs=tuple(refs))
