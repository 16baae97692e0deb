"""Qwen2.5-VL's image prompt: each image where the conversation has it as
<|vision_start|>, one <|image_pad|> per merged block of its patch grid (grid_h/merge x
grid_w/merge of them, row by row, as the processor expands the template's one), and
<|vision_end|>; the rows of the image's tokens come from the tower in that order, and the
tokens' M-RoPE positions (poot.models.mrope) from the grid. Attention stays causal.

Qwen2.5-VL's chat template writes an image part as the three tokens with one
<|image_pad|>; a template written for string contents gets each image where its part was
(poot.models.vision.template).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from poot.errors import CheckpointError

START, PAD, END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
#: how the chat template writes one image
PLACEHOLDER = START + PAD + END


def check_tokens(tokenizer, tokens) -> None:
    """Refuse a tokenizer without the image's three tokens, or whose ids are not
    config.json's."""
    for name, want in ((START, tokens.start), (PAD, tokens.image), (END, tokens.end)):
        ids = tokenizer.encode(name, add_special=False)
        if ids != [want]:
            raise CheckpointError(f"the tokenizer's {name} is {ids}, config.json's token "
                                  f"{want} (Qwen2.5-VL's image prompt needs it)")


def chat_ids(tokenizer, tokens, segments: Sequence, grids: Sequence[tuple[int, int]]
             ) -> tuple[list[int], list[list[int]]]:
    """(the token ids of the segments (poot.models.vision.template) with each image's
    tokens where it stands, one (grid_h, grid_w) per image; the positions of each image's
    <|image_pad|> tokens)."""
    from poot.models.vision.template import expand_images

    def block(grid):
        check_tokens(tokenizer, tokens)
        count = (grid[0] // tokens.merge) * (grid[1] // tokens.merge)
        return [tokens.start] + [tokens.image] * count + [tokens.end]

    return expand_images(tokenizer, segments, grids, block, tokens.image)


def prompt_positions(length: int, positions: Sequence[Sequence[int]],
                     grids: Sequence[tuple[int, int]], merge: int) -> tuple[np.ndarray, int]:
    """(the prompt's M-RoPE positions [3, length], the shift of what follows it)."""
    from poot.models import mrope

    return mrope.positions(length, [(where[0], grid) for where, grid in
                                    zip(positions, grids, strict=True) if where], merge)


class MRopeStepper:
    """A Session stepper for one sequence of an M-RoPE model: it writes the prompt's three
    positions into the steps that take them (the prefill steps built with hosted rows;
    past the prompt, a token's own position plus the shift) and the shift into every step,
    until released."""

    def __init__(self, session, positions: np.ndarray, shift: int):
        self.session, self.positions, self.shift = session, np.asarray(positions), shift
        self.inner = session.stepper
        session.stepper = self

    def __call__(self, ex, slots, real):
        from poot.models import mrope

        if mrope.SHIFT in ex.slots:
            slots[mrope.SHIFT] = np.full(np.asarray(slots["pos"]).shape[0], self.shift,
                                         np.int32)
        if mrope.POS in ex.slots:
            pos = int(np.asarray(slots["pos"]).reshape(-1)[0])
            t = int(np.asarray(slots["tokens"]).shape[-1])
            want = np.arange(pos, pos + t)
            have = want < self.positions.shape[1]
            rows = np.where(have, want + self.shift, 0)     # past the prompt: shifted
            rows = np.broadcast_to(rows, (3, t)).copy()
            rows[:, have] = self.positions[:, want[have]]
            slots[mrope.POS] = rows.astype(np.int32)
        return self.inner(ex, slots, real) if self.inner is not None else ex.step(slots)

    def release(self) -> None:
        if self.session.stepper is self:
            self.session.stepper = self.inner
