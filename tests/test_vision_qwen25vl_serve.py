"""`poot serve` with images for Qwen2.5-VL, on the tiny random-weight folder of
tests/test_vision_qwen25vl.py: two images of different grids among a message's texts give
the prompt length and greedy answer of the library (ImageChat), whose decode turns its
tokens by the prompt's shifted M-RoPE positions; a remote image is refused (the prompt's
length depends on each image's size) even where the server fetches remote images."""
from __future__ import annotations

import base64

import pytest
from serve_process import openai_client, serve
from test_vision_qwen25vl import folder  # noqa: F401 (the module's fixture, reused)

MAX_SEQ = 160


def test_served_images_answer_as_the_library(folder):  # noqa: F811
    import openai

    import poot
    from poot.models.vision.chat import ImageChat

    path, _, _, images = folder
    urls = [f"data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}"
            for p in images]
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Compare "}, {"type": "image_url", "image_url": {"url": urls[0]}},
        {"type": "text", "text": " with"}, {"type": "image_url", "image_url": {"url": urls[1]}},
        {"type": "text", "text": " please."}]}]
    mine = [{"role": "user", "content": [{"type": "image"} if p["type"] == "image_url" else p
                                         for p in messages[0]["content"]]}]
    data = [p.read_bytes() for p in images]
    chat = ImageChat(poot.load(str(path), "reference", max_seq=MAX_SEQ))
    with serve(path, "--max-seq", str(MAX_SEQ), "--allow-image-urls") as server:
        client = openai_client(server)
        r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=5,
                                           temperature=0)
        assert r.usage.prompt_tokens == len(chat.prompt(mine, data)[0])
        answer = r.choices[0].message.content
        assert answer and answer == chat.generate(mine, data, max_tokens=5, temperature=0.0)
        remote = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "text", "text": "Hi"}]}]
        with pytest.raises(openai.BadRequestError, match="prompt depends on their sizes"):
            client.chat.completions.create(model="smollm2", messages=remote, max_tokens=2)
