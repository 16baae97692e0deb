"""Images among the text (poot.models.vision.template): a user message whose content parts
interleave text and images, and a conversation with images in several user turns, get each
image's tokens where its part stands, for Gemma 3 and Idefics3 (SmolVLM), through chat
templates written for string contents and for content lists; the ids are those of the text
each family's processor expands from the template's rendering, and Gemma 3's logits over
such a conversation are tests/reference_decoder.py's with each image's rows at its place.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import test_vision_gemma3 as g3
import test_vision_idefics3 as i3
from reference_decoder import forward
from test_vision_gemma3 import folder  # noqa: F401 (the module's fixture, reused)

from poot.models.chat import GEMMA_TEMPLATE, compile_template

G3_FULL = "\n\n<start_of_image>" + "<image_soft_token>" * g3.MM_TOKENS + "<end_of_image>\n\n"
#: Gemma 3's own template's way with content lists: each text part trimmed, each image
#: part <start_of_image>
GEMMA_LIST_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{% if m.content is string %}{{ m.content | trim }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}<start_of_image>{% else %}{{ p.text | trim }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def image(): return {"type": "image"}
def text(t): return {"type": "text", "text": t}


#: text, image, text, image, text in one message
INTERLEAVED = [{"role": "user", "content": [text("Compare "), image(), text(" with"), image(),
                                             text(" please.")]}]
#: images in two user turns, an answer between
TURNS = [{"role": "user", "content": [image(), text("What is it?")]},
         {"role": "assistant", "content": "A cat."},
         {"role": "user", "content": [text("And this one:"), image()]}]


def tokenizer(tmp_path, write, template):
    from poot.models.tokenizer import Tokenizer

    write(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**cfg,
                                                                "chat_template": template}))
    return Tokenizer.from_hf_folder(tmp_path)


def processor_text(tok, messages, placeholder: str, blocks: list[str]) -> str:
    """The template's rendering (content lists where it takes them, else each message's
    texts joined with `placeholder` where its images stand), each placeholder replaced by
    its image's expanded text in order: what the family's processor tokenizes."""
    lists = "p.type" in tok.chat_template or "line['type']" in tok.chat_template
    msgs = messages if lists else [
        {**m, "content": m["content"] if isinstance(m["content"], str) else "".join(
            placeholder if p["type"] == "image" else p["text"] for p in m["content"])}
        for m in messages]
    rendered = compile_template(tok.chat_template).render(
        messages=msgs, bos_token=tok.bos_token, eos_token=tok.eos_token,
        add_generation_prompt=True)
    pieces = rendered.split(placeholder)
    assert len(pieces) == len(blocks) + 1
    return pieces[0] + "".join(b + p for b, p in zip(blocks, pieces[1:]))


@pytest.mark.parametrize("template", [GEMMA_TEMPLATE, GEMMA_LIST_TEMPLATE],
                         ids=["string", "list"])
@pytest.mark.parametrize("messages", [INTERLEAVED, TURNS], ids=["interleaved", "turns"])
def test_gemma3_ids(tmp_path, template, messages):
    from poot.models.vision.chat import image_chat_ids
    from poot.models.vision.config import ImageTokens

    tok = tokenizer(tmp_path, g3.write_tokenizer, template)
    tokens = ImageTokens(g3.BOI, g3.EOI, g3.SOFT, g3.MM_TOKENS)
    ids, positions = image_chat_ids(tok, tokens, messages, [(0, 0)] * 2)
    want = processor_text(tok, messages, "<start_of_image>", [G3_FULL] * 2)
    assert ids == tok.encode(want, add_special=False)
    assert sum(positions, []) == [i for i, t in enumerate(ids) if t == g3.SOFT]
    assert [len(p) for p in positions] == [g3.MM_TOKENS] * 2
    # the first image stands after the text before it, the second after the text between
    first_text = tok.encode_text("Compare" if messages is INTERLEAVED else "What")
    start = next(i for i in range(len(ids)) if ids[i:i + len(first_text)] == first_text)
    assert (start < positions[0][0]) == (messages is INTERLEAVED)


@pytest.mark.parametrize("template", [i3.TEMPLATE, i3.SMOLVLM_TEMPLATE], ids=["string", "list"])
@pytest.mark.parametrize("messages", [INTERLEAVED, TURNS], ids=["interleaved", "turns"])
def test_idefics3_ids(tmp_path, template, messages):
    from poot.models.vision.chat import image_chat_ids
    from poot.models.vision.config import TileTokens

    tok = tokenizer(tmp_path, i3.write_tokenizer, template)
    if "line['type']" in template and messages is TURNS:   # SmolVLM's takes lists only
        messages = [{**m, "content": [text(m["content"])]} if isinstance(m["content"], str)
                    else m for m in messages]
    grids = [(2, 2), (0, 0)]
    ids, positions = image_chat_ids(tok, TileTokens(i3.IMAGE, i3.PER_TILE), messages, grids)
    want = processor_text(tok, messages, "<image>", [i3.expanded(g) for g in grids])
    assert ids == tok.encode(want, add_special=False)
    assert [len(p) for p in positions] == [5 * i3.PER_TILE, i3.PER_TILE]
    assert sum(positions, []) == [i for i, t in enumerate(ids) if t == i3.IMAGE]


def test_refusals(tmp_path):
    from poot.errors import RequestError
    from poot.models.vision.chat import image_chat_ids
    from poot.models.vision.config import ImageTokens

    tok = tokenizer(tmp_path, g3.write_tokenizer, GEMMA_TEMPLATE)
    tokens = ImageTokens(g3.BOI, g3.EOI, g3.SOFT, g3.MM_TOKENS)
    with pytest.raises(RequestError, match="2 images, 1 given"):
        image_chat_ids(tok, tokens, INTERLEAVED, [(0, 0)])
    with pytest.raises(RequestError, match="text and image parts"):
        image_chat_ids(tok, tokens, [{"role": "user", "content": [{"type": "audio"}]}], [])
    with pytest.raises(RequestError, match="alternate"):   # the template's own refusal
        image_chat_ids(tok, tokens, [TURNS[0], TURNS[0]], [(0, 0)] * 2)


def test_gemma3_logits_over_turns(folder):  # noqa: F811
    """Each image's rows at its own turn's soft tokens, each block seeing itself both ways."""
    import poot
    from poot.models.vision.chat import ImageChat
    from poot.models.vision.preprocess import pixels, read_processing

    path, weights, vis, proj, images = folder
    chat = ImageChat(poot.load(str(path), "reference", max_seq=128))
    ids, hosted, spans = chat.prompt(TURNS, images)
    soft = [i for i, t in enumerate(ids) if t == g3.SOFT]
    assert sorted(hosted) == soft and len(soft) == 2 * g3.MM_TOKENS
    proc = read_processing(path, 16)
    rows, want_spans = {}, {}
    for k, im in enumerate(images):
        where = soft[k * g3.MM_TOKENS:(k + 1) * g3.MM_TOKENS]
        rows.update(zip(where, g3.reference_rows(vis, proj, pixels(im, proc))))
        want_spans.update(dict.fromkeys(where, k + 1))
    assert spans == want_spans
    want = forward(weights, g3.TEXT, ids, rows, want_spans)
    got = chat.model.prefill_logits(ids, hosted=hosted, spans=spans)
    assert g3.rel_err(got, want) < 1e-4
    # the images swapped give other logits: each image's rows are at its own place
    swapped = dict(zip(soft, [rows[p] for p in soft[g3.MM_TOKENS:] + soft[:g3.MM_TOKENS]]))
    assert g3.rel_err(forward(weights, g3.TEXT, ids, swapped, want_spans), want) > 1e-3
    text = chat.generate(TURNS, images, max_tokens=3)
    assert chat.model.stats.prompt_tokens == len(ids) and isinstance(text, str)
