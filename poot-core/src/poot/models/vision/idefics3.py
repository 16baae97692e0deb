"""Idefics3's (SmolVLM's) image prompt: each image's tokens as its processor expands them.

An image cut into R x C tiles becomes, row by row, `<fake_token_around_image><row_r_col_c>`
and `count` image tokens per tile, a newline after each row; then a newline and
`<fake_token_around_image><global-img>`, `count` image tokens for the whole image and
`<fake_token_around_image>`. An image that is one tile (or is not split) is the last part
alone. The image tokens' rows come from the encoder, tile by tile, the whole image last, in
the order their tokens stand. Each image's block goes where the conversation has it
(poot.models.vision.template: a template taking content lists, as SmolVLM's, writes each
image part as `<image>`, expanded here). Attention stays causal over the image tokens, as
in Idefics3's Llama.
"""
from __future__ import annotations

from collections.abc import Sequence

from poot.errors import CheckpointError


def image_text(grid: tuple[int, int], tokens) -> str:
    """The expanded prompt text of one image with tile grid (rows, cols)."""
    run = tokens.image_text * tokens.count
    rows, cols = grid
    tiled = "".join("".join(f"{tokens.around}<row_{r + 1}_col_{c + 1}>{run}"
                            for c in range(cols)) + "\n" for r in range(rows))
    whole = f"{tokens.around}{tokens.global_image}{run}{tokens.around}"
    return f"{tiled}\n{whole}" if rows or cols else whole


def check_tokens(tokenizer, tokens, grid: tuple[int, int]) -> None:
    """Refuse a tokenizer that lacks the image's marker tokens, or whose image token is
    not config.json's image_token_id."""
    names = [tokens.around, tokens.global_image, tokens.image_text,
             *(f"<row_{r + 1}_col_{c + 1}>" for r in range(grid[0]) for c in range(grid[1]))]
    for name in names:
        ids = tokenizer.encode(name, add_special=False)
        if len(ids) != 1:
            raise CheckpointError(f"the tokenizer has no {name} token (Idefics3's image "
                                  f"prompt needs it)")
        if name == tokens.image_text and ids[0] != tokens.image:
            raise CheckpointError(f"the tokenizer's {name} is token {ids[0]}, config.json's "
                                  f"image_token_id {tokens.image}")


def chat_ids(tokenizer, tokens, segments: Sequence, grids: Sequence[tuple[int, int]]
             ) -> tuple[list[int], list[list[int]]]:
    """(the token ids of the segments (poot.models.vision.template) with each image's block
    where it stands, expanded as the processor expands it, one tile grid per image; the
    positions of each image's image tokens in order)."""
    from poot.models.vision.template import expand_images

    def block(grid):
        check_tokens(tokenizer, tokens, grid)
        return tokenizer.encode(image_text(grid, tokens), add_special=False)

    return expand_images(tokenizer, segments, grids, block, tokens.image)
