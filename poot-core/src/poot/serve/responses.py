"""The OpenAI response objects: whole completions, streamed chunks, errors, SSE framing."""
from __future__ import annotations

import json
import time
import uuid

from poot.errors import RequestError


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def request_error_body(exc: RequestError) -> dict:
    return error_body(str(exc), exc.type, exc.param, exc.code)


def sse(obj) -> bytes:
    """One server-sent event carrying a JSON object (or the closing "[DONE]")."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Shapes:
    """The objects of one response, by endpoint (chat or completion), sharing id and time."""

    def __init__(self, kind: str, model: str):
        self.kind, self.model = kind, model
        self.chat = kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        # a text chunk's event is the same bytes around its text: made once, filled per piece
        mark = "\ue000"
        head, tail = sse(self.chunk(mark)).decode().split(json.dumps(mark, ensure_ascii=False))
        self._around = head, tail

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, use: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion"), "choices": [choice], "usage": use}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice], "usage": use}

    def chunk(self, text: str | None, finish_reason: str | None = None,
              first: bool = False) -> dict:
        """A streamed piece; the chat stream's first chunk names the role."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else \
                ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None,
                  "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def text_event(self, text: str) -> bytes:
        """sse(self.chunk(text)), without building and encoding the whole object again."""
        head, tail = self._around
        return f"{head}{json.dumps(text, ensure_ascii=False)}{tail}".encode()

    def usage_chunk(self, use: dict) -> dict:
        """The last chunk when the client asked for stream_options.include_usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": use}
