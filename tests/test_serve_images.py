"""`poot serve` with images (poot.serve.images): OpenAI image_url content parts on the tiny
random-weight Gemma 3 vision-language folder of tests/test_vision_gemma3.py. A greedy answer
with one and with two images is the library's (ImageChat.generate) for the same images and
prompt; an image sent again comes from the server's cache (/stats); a corrupt image, a
data URL that is no image, a decompression bomb, too many images for the context and a
remote URL the server may not fetch are each a 400 in OpenAI's error shape, and the server
goes on; with --allow-image-urls a remote image is fetched."""
from __future__ import annotations

import base64
import http.server
import struct
import threading
import zlib

import numpy as np
import openai
import pytest
from serve_process import openai_client, serve
from test_vision_gemma3 import folder  # noqa: F401 (the module's fixture, reused)

MAX_SEQ = 128
PROMPT = "Describe it."
#: "\n", the random weights' first token, and how far its logit is lowered
TOKEN, BIAS = 13, -40.0


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def message(urls: list[str], text: str = PROMPT) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def bomb_png(side: int = 20000) -> bytes:
    """A PNG whose header claims side x side pixels (more than poot decodes), no pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + \
            struct.pack(">I", zlib.crc32(kind + body))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2,
                                                            0, 0, 0)) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def images(folder):  # noqa: F811
    return [p.read_bytes() for p in folder[4]]


class Library:
    """The library's path (poot.models.vision.chat.ImageChat) for images (bytes) and the
    prompt: a greedy answer, and the first token's top log-probabilities."""

    def __init__(self, path):
        import poot
        from poot.models.vision.chat import ImageChat

        self.chat = ImageChat(poot.load(str(path), "reference", max_seq=MAX_SEQ))

    def generate(self, imgs, n: int) -> str:
        return self.chat.generate(PROMPT, imgs, max_tokens=n, temperature=0.0)

    def first(self, imgs) -> tuple[float, float]:
        """(token TOKEN's log-probability after the prompt, its logit lowered by BIAS;
        the same without the images' rows)."""
        ids, hosted, spans = self.chat.prompt(PROMPT, imgs)
        model = self.chat.model
        out = []
        for z in (model.prefill_logits(ids, hosted=hosted, spans=spans)[-1],
                  model.prefill_logits(ids)[-1]):
            z = z.astype(np.float64)
            z[TOKEN] += BIAS
            out.append(float(z[TOKEN] - z.max() - np.log(np.exp(z - z.max()).sum())))
        return out[0], out[1]


@pytest.fixture(scope="module")
def library(folder):  # noqa: F811
    return Library(folder[0])


@pytest.fixture(scope="module")
def remote(images):
    """A local http server holding the first image at /0.png."""
    body = images[0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/0.png"
    httpd.shutdown()


@pytest.fixture(scope="module")
def server(folder):  # noqa: F811
    with serve(folder[0], "--max-seq", str(MAX_SEQ), "--max-batch", "2",
               "--allow-image-urls") as s:
        yield s


def first_logprob(client, urls) -> float:
    """The first token's log-probability, TOKEN's logit lowered by BIAS."""
    r = ask(client, urls, n=1, logprobs=True, logit_bias={str(TOKEN): BIAS})
    assert r.choices[0].logprobs.content[0].token == "\n"
    return r.choices[0].logprobs.content[0].logprob


def ask(client, urls, n=6, **kw):
    return client.chat.completions.create(model="smollm2", messages=message(urls),
                                          max_tokens=n, temperature=0, **kw)


def test_answers_with_images_are_the_libraries_and_cached(server, images, library, remote):
    client = openai_client(server)
    one = ask(client, [data_url(images[0])])
    assert one.choices[0].message.content == library.generate([images[0]], 6)
    # the random weights put nearly all the first token's mass on one token: its logit
    # lowered by BIAS, its log-probability is the library's one-step prefill's, and would
    # not be without the image's rows
    got = first_logprob(client, [data_url(images[0])])
    want, without = library.first([images[0]])
    assert abs(got - want) < 2e-4 and abs(without - want) > 1e-2
    s0 = server.stats()
    assert s0["images_encoded"] == 1 and s0["image_cache_hits"] == 1
    two = ask(client, [data_url(images[0]), data_url(images[1])])
    s1 = server.stats()
    # image 0 again: from the cache; image 1: encoded
    assert s1["image_cache_hits"] == 2 and s1["images_encoded"] == 2
    assert two.choices[0].message.content == library.generate(images, 6)
    assert two.usage.prompt_tokens > one.usage.prompt_tokens
    got = first_logprob(client, [data_url(images[0]), data_url(images[1])])
    assert abs(got - library.first(images)[0]) < 2e-4
    s1 = server.stats()
    streamed = client.chat.completions.create(
        model="smollm2", messages=message([remote]), max_tokens=6, temperature=0,
        stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == one.choices[0].message.content     # the same bytes, fetched
    assert server.stats()["image_cache_hits"] == s1["image_cache_hits"] + 1
    # text requests still batch on the paged session beside
    plain = client.chat.completions.create(model="smollm2", max_tokens=3, temperature=0,
                                           messages=[{"role": "user", "content": "Hi"}])
    assert plain.choices[0].finish_reason in ("stop", "length")


def test_image_and_text_requests_at_once(server, images, library):
    """Two image requests (one waits for the other's dense session) and text requests at
    once: each answer is the one it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    client = openai_client(server)

    def text():
        return client.chat.completions.create(
            model="smollm2", max_tokens=8, temperature=0,
            messages=[{"role": "user", "content": "Hello there"}]).choices[0].message.content

    alone = text()
    with ThreadPoolExecutor(4) as pool:
        got = [pool.submit(lambda i=i: ask(client, [data_url(images[i])], n=8)
                           .choices[0].message.content) for i in (0, 1)]
        texts = [pool.submit(text) for _ in range(2)]
        assert [f.result() for f in texts] == [alone, alone]
        assert [f.result() for f in got] == [library.generate([im], 8) for im in images]
    assert server.wait_idle()["active"] == 0


def test_a_client_that_leaves_frees_the_image_session(server, images, library):
    client = openai_client(server)
    stream = client.chat.completions.create(
        model="smollm2", messages=message([data_url(images[1])]), max_tokens=80,
        temperature=0, stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    assert server.wait_idle()["active"] == 0
    answer = ask(client, [data_url(images[0])]).choices[0].message.content
    assert answer == library.generate([images[0]], 6)


@pytest.mark.parametrize("urls,match", [
    (lambda im: [data_url(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)], "corrupt|not an image"),
    (lambda im: [data_url(b"hello", "text/plain")], "not a base64 image data URL"),
    (lambda im: ["data:image/png;base64,%%%"], "not base64"),
    (lambda im: [data_url(bomb_png())], "pixels|decompression bomb"),
    (lambda im: [data_url(im[0])] * 20, "maximum context length"),
    (lambda im: ["ftp://example.com/a.png"], "data: URL or http"),
], ids=["corrupt", "not-image", "bad-base64", "bomb", "too-many", "scheme"])
def test_bad_images_are_400_and_the_server_goes_on(server, images, urls, match):
    client = openai_client(server)
    with pytest.raises(openai.BadRequestError, match=match) as err:
        ask(client, urls(images))
    assert err.value.status_code == 400
    assert err.value.body["type"] == "invalid_request_error"
    ok = ask(client, [data_url(images[1])], n=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_refusals_without_a_server(images):
    """A text-only model names itself; a remote URL needs --allow-image-urls; a chat with
    images takes system, user and assistant messages."""
    from poot.errors import RequestError
    from poot.models.vision.config import ImageTokens
    from poot.serve.protocol import Limits, parse_chat

    class Tok:
        chat_template, special_ids, tokens = "", (), []

    body = {"model": "m", "messages": message([data_url(images[0])])}
    with pytest.raises(RequestError, match="'m' takes no images"):
        parse_chat(body, Limits("m", 64, 64, 300), Tok())
    tokens = ImageTokens(261, 262, 263, 4)
    remote = {"model": "m", "messages": message(["http://127.0.0.1:1/a.png"])}
    with pytest.raises(RequestError, match="--allow-image-urls"):
        parse_chat(remote, Limits("m", 64, 64, 300, image_tokens=tokens), Tok())
    tool = {"model": "m", "messages": message([data_url(images[0])]) + [
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]}
    with pytest.raises(RequestError, match="system, user and assistant messages"):
        parse_chat(tool, Limits("m", 64, 64, 300, image_tokens=tokens), Tok())


def test_images_among_the_text_and_in_several_turns(server, images, library):
    """Content parts text, image, text, image, text in one message, and images in two user
    turns with an answer between: each prompt's length and greedy answer are the library's
    for the same conversation (poot.models.vision.template places each image where its
    part stands; tests/test_vision_interleaved.py checks the ids)."""
    client = openai_client(server)
    urls = [data_url(im) for im in images]

    def part(x: str) -> dict:
        return {"type": "image_url", "image_url": {"url": x}} if x.startswith("data:") \
            else {"type": "text", "text": x}

    interleaved = [{"role": "user", "content": [part("Compare "), part(urls[0]),
                                                 part(" with"), part(urls[1]),
                                                 part(" please.")]}]
    turns = [{"role": "user", "content": [part(urls[0]), part("What is it?")]},
             {"role": "assistant", "content": "A cat."},
             {"role": "user", "content": [part("And this one:"), part(urls[1])]}]
    lengths = set()
    for messages in (interleaved, turns):
        mine = [{**m, "content": m["content"] if isinstance(m["content"], str) else [
            {"type": "image"} if p["type"] == "image_url" else p for p in m["content"]]}
            for m in messages]
        r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=6,
                                           temperature=0)
        assert r.usage.prompt_tokens == len(library.chat.prompt(mine, images)[0])
        answer = r.choices[0].message.content
        assert answer and answer == library.chat.generate(mine, images, max_tokens=6,
                                                          temperature=0.0)
        lengths.add(r.usage.prompt_tokens)
    assert len(lengths) == 2
