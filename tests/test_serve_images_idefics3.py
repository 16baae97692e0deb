"""`poot serve` with images among the text for Idefics3 (SmolVLM), on the tiny random-weight
folder of tests/test_vision_idefics3.py: a message whose content parts go text, image, text,
image, text, and images in two user turns with an answer between, give the prompt length
and greedy answer of the library (ImageChat) for the same conversation; the ids themselves
are checked in tests/test_vision_interleaved.py."""
from __future__ import annotations

import base64

from serve_process import openai_client, serve
from test_vision_idefics3 import folder  # noqa: F401 (the module's fixture, reused)

MAX_SEQ = 256


def test_images_among_the_text_and_in_several_turns(folder):  # noqa: F811
    import poot
    from poot.models.vision.chat import ImageChat

    path, *_, images = folder
    urls = [f"data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}"
            for p in images]

    def part(x: str) -> dict:
        return {"type": "image_url", "image_url": {"url": x}} if x.startswith("data:") \
            else {"type": "text", "text": x}

    conversations = [
        [{"role": "user", "content": [part("Compare "), part(urls[0]), part(" with"),
                                      part(urls[1]), part(" please.")]}],
        [{"role": "user", "content": [part(urls[1]), part("What is it?")]},
         {"role": "assistant", "content": "A cat."},
         {"role": "user", "content": [part("And this:"), part(urls[0])]}]]
    chat = ImageChat(poot.load(str(path), "reference", max_seq=MAX_SEQ))
    with serve(path, "--max-seq", str(MAX_SEQ)) as server:
        client = openai_client(server)
        for messages in conversations:
            mine = [{**m, "content": m["content"] if isinstance(m["content"], str) else [
                {"type": "image"} if p["type"] == "image_url" else p for p in m["content"]]}
                for m in messages]
            order = [1, 0] if messages is conversations[1] else [0, 1]
            data = [images[k].read_bytes() for k in order]
            r = client.chat.completions.create(model="smollm2", messages=messages,
                                               max_tokens=5, temperature=0)
            assert r.usage.prompt_tokens == len(chat.prompt(mine, data)[0])
            answer = r.choices[0].message.content
            assert answer and answer == chat.generate(mine, data, max_tokens=5,
                                                      temperature=0.0)
