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


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; `cached_tokens`: of the prompt, read from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def request_usage(ends: list) -> dict:
    """The usage of a request from the "done" events of its choices: the prompt once (its
    cached part as choice 0 read it), the tokens of every choice; with a prediction, the
    proposed tokens its choices' verification steps accepted and rejected."""
    out = usage(ends[0].prompt_tokens, sum(e.completion_tokens for e in ends),
                ends[0].cached_tokens)
    if ends[0].predicted is not None:
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": sum(e.predicted[0] for e in ends),
            "rejected_prediction_tokens": sum(e.predicted[1] for e in ends)}
    return out


class Shapes:
    """The objects of one response, by endpoint (chat or completion), sharing id and time.
    `logprobs`: whether the request asked for log-probabilities (each choice then carries
    them, in its endpoint's shape, from the engine's entries: poot.serve.logits)."""

    def __init__(self, kind: str, model: str, logprobs: bool = False):
        self.kind, self.model, self.logprobs = kind, model, logprobs
        self.chat = kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self._offsets: dict[int, int] = {}   # a completion choice's text offset so far
        # a text chunk's event is the same bytes around its text: made once, filled per piece
        mark = "\ue000"
        head, tail = sse(self.chunk(0, mark)).decode().split(json.dumps(mark, ensure_ascii=False))
        self._around = head, tail

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def shown_logprobs(self, index: int, entries) -> dict | None:
        """A choice's (or a chunk's) `logprobs` field for these entries."""
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": list(entries)}
        at = self._offsets.get(index, 0)
        offsets = []
        for e in entries:
            offsets.append(at)
            at += len(e["token"])
        self._offsets[index] = at
        return {"tokens": [e["token"] for e in entries],
                "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]}
                                 for e in entries],
                "text_offset": offsets}

    def whole(self, choices: list[dict], use: dict) -> dict:
        """`choices`: per index, {"text", "finish_reason", "logprobs" (entries)} and for
        chat optionally "tool_calls"."""
        out = []
        for i, c in enumerate(choices):
            lp = self.shown_logprobs(i, c["logprobs"])
            if self.chat:
                msg = {"role": "assistant", "content": c["text"]}
                if c.get("tool_calls"):    # the content: the text around the calls, if any
                    msg["tool_calls"] = c["tool_calls"]
                out.append({"index": i, "message": msg, "logprobs": lp,
                            "finish_reason": c["finish_reason"]})
            else:
                out.append({"index": i, "text": c["text"], "logprobs": lp,
                            "finish_reason": c["finish_reason"]})
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": out, "usage": use}

    def chunk(self, index: int, text: str | None, finish_reason: str | None = None,
              first: bool = False, entries=(), delta: dict | None = None) -> dict:
        """A streamed piece; the chat stream's first chunk of each choice names the role.
        `delta` (chat): the delta itself, in place of text."""
        lp = self.shown_logprobs(index, entries) if entries or finish_reason else None
        if self.chat:
            if delta is None:
                delta = {"role": "assistant", "content": ""} if first else \
                    ({} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": lp,
                      "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text or "", "logprobs": lp,
                  "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def text_event(self, index: int, text: str, entries=()) -> bytes:
        """sse(self.chunk(index, text)); choice 0's plain text without building and encoding
        the whole object again."""
        if index or entries or self.logprobs:
            return sse(self.chunk(index, text, entries=entries))
        head, tail = self._around
        return f"{head}{json.dumps(text, ensure_ascii=False)}{tail}".encode()

    def usage_chunk(self, use: dict) -> dict:
        """The last chunk when the client asked for stream_options.include_usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": use}
