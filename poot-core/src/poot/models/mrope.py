"""Multimodal rotary positions (M-RoPE, Qwen2.5-VL's text model): each token has three
positions (temporal, height, width); the rotary pairs are split into three consecutive
sections, each turned by one of them. A text token's three positions are equal, so a
prompt without images rotates exactly as plain RoPE does; an image's tokens take the
(0, row, column) of their merged patch, offset by where the image starts, and the text
after an image goes on from the largest position before it plus one: from there on each
token's position is its cache position plus a per-sequence `shift` (zero or negative).

A step of a model with M-RoPE (poot.models.llama.build_decoder, config.mrope) takes

| slot (and role) | dtype | shape | range |
|---|---|---|---|
| mrope.shift | I32 | [B] | at most 0: added to every position of the sequence's tokens |

(a per-sequence row slot, 0 unless the host says: poot.runtime.session's `row_slots`); a
step built with hosted rows (an image prompt's prefill) also takes

| slot (and role) | dtype | shape | range |
|---|---|---|---|
| mrope.pos | I32 | [3, T] | 0 to capacity: each token's three positions (the shift not added) |

and rotates each section by its own row, through three rotations whose cos/sin tables are
the plain table within the section and the identity (cos 1, sin 0) outside it.
"""
from __future__ import annotations

import numpy as np

from poot import ops
from poot.dtypes import DType
from poot.ir.types import SlotKind
from poot.plugin import hookimpl, manager

OWNER = "poot.models.mrope"
SHIFT, POS = "mrope.shift", "mrope.pos"


def roles() -> list[SlotKind]:
    return [SlotKind(SHIFT, DType.I32, None, 1, owner=OWNER),
            SlotKind(POS, DType.I32, 0, None, owner=OWNER)]


@hookimpl
def poot_slot_roles():
    return roles()


def shifted(rope_pos, batch: int):
    """The steps' rope positions (dense [T], paged [B, T]) plus each sequence's shift."""
    manager()  # loads the plugins, this one included, which declares the roles
    shift = ops.slot(SlotKind.get(SHIFT), (batch,), SHIFT)
    return ops.add(rope_pos, shift if rope_pos.ndim == 1 else ops.reshape(shift, (batch, 1)))


def positions_slot(t: int, cap: int):
    """Each of a dense step's T tokens' three positions [3, T]."""
    manager()
    return ops.slot(SlotKind.get(POS), (3, t), POS, bound=cap)


def section_tables(cos: np.ndarray, sin: np.ndarray, sections) -> dict[str, np.ndarray]:
    """The plain cos/sin tables [P, rot/2] as three, each the identity outside its section
    of rotary pairs."""
    out = {}
    edges = np.cumsum([0, *sections])
    for s in range(3):
        inside = np.zeros(cos.shape[1], bool)
        inside[edges[s]:edges[s + 1]] = True
        out[f"mrope.{s}.cos"] = np.where(inside, cos, np.float32(1.0)).astype(np.float32)
        out[f"mrope.{s}.sin"] = np.where(inside, sin, np.float32(0.0)).astype(np.float32)
    return out


def rotate(x, tables: dict, pos3, rot: int):
    """x [1, T, H, D] (tokens first) turned section by section: section s by row s of
    pos3 [3, T]."""
    t = pos3.shape[1]
    for s in range(3):
        row = ops.reshape(ops.slice_axis(pos3, 0, s, s + 1), (1, t))
        x = ops.rope_partial(x, tables[f"mrope.{s}.cos"], tables[f"mrope.{s}.sin"], row, rot,
                             tokens_first=True)
    return x


def positions(ids_len: int, images: list[tuple[int, tuple[int, int]]], merge: int
              ) -> tuple[np.ndarray, int]:
    """(the three positions [3, ids_len] of a prompt, the shift of every token after it)
    given each image's first token position and (grid_h, grid_w) in patches, its tokens
    (grid_h/merge x grid_w/merge of them) consecutive from there, as transformers'
    get_rope_index places one still image each."""
    out = np.zeros((3, ids_len), np.int64)
    at, nxt = 0, 0        # the next token, and the next position
    for start, (gh, gw) in sorted(images):
        n = start - at
        out[:, at:start] = nxt + np.arange(n)
        nxt += n
        h, w = gh // merge, gw // merge
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        out[0, start:start + h * w] = nxt
        out[1, start:start + h * w] = nxt + rows.reshape(-1)
        out[2, start:start + h * w] = nxt + cols.reshape(-1)
        at, nxt = start + h * w, nxt + max(h, w)
    out[:, at:] = nxt + np.arange(ids_len - at)
    return out, int(out.max()) + 1 - ids_len if ids_len else 0
