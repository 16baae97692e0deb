"""The HTTP side of `poot serve`: a Starlette app over one Engine.

Routes: POST /v1/chat/completions and /v1/completions (whole or streamed as server-sent
events ending in `data: [DONE]`), POST /v1/embeddings, GET /v1/models, /health, /ready,
/metrics (Prometheus: poot.serve.metrics) and /stats (the engine's pool, batch and
counters, for operators and tests). With an API key, every /v1 route wants
`Authorization: Bearer KEY` and answers 401 without it; the probes, /metrics and /stats
stay open (they name no prompt or answer). Every refusal is an OpenAI error object
with its 4xx/5xx status, whatever the request held (an unexpected fault too: a 500 in the
same shape, never a bare text page), and one `refused` line in the log; a full queue is
the client's to retry, a 429 with Retry-After. Each request watches its connection: a client that
leaves, mid-stream or while waiting for a whole answer, cancels its sequence at once.

Probes, as Kubernetes has them: /health is liveness (200 while the scheduler runs, its
status "warming" until every plan exists, then "ok"; 503 once the scheduler has failed,
when a restart is the cure), /ready is readiness (503 {"status": "warming"} until the plans
of the configured batch exist, then 200 {"status": "ready"}): the server answers requests
while warming, but a request may wait while the plan its step needs is made.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
from contextlib import asynccontextmanager
from functools import partial

from poot.errors import RequestError
from poot.optional import require
from poot.serve.engine import Engine, Event, deliver_here
from poot.serve.metrics import ServerMetrics
from poot.serve.protocol import parse_chat, parse_completion, parse_embedding
from poot.serve.responses import (Shapes, error_body, request_error_body, request_usage,
                                  sse)
from poot.serve.tools import CallStream

Starlette = require("starlette.applications").Starlette
HTTPException = require("starlette.exceptions").HTTPException
_requests = require("starlette.requests")
Request, ClientDisconnect = _requests.Request, _requests.ClientDisconnect
_responses = require("starlette.responses")
JSONResponse, Response = _responses.JSONResponse, _responses.Response
StreamingResponse = _responses.StreamingResponse
Route = require("starlette.routing").Route

#: the largest request body read (a prompt of the longest context is far smaller)
MAX_BODY = 4 << 20
#: the Retry-After (seconds) of a 429 (the queue is full): about a short answer's time
RETRY_AFTER_S = 1
#: where refusals are logged: uvicorn's server log, so they show as its lines do
LOG = logging.getLogger("uvicorn.error")


def log_refusal(method: str, path: str, status: int, reason: str | None,
                message: str) -> None:
    """One log line per refused request: its route, status, code or param, and why (on
    one line: a message may quote the request)."""
    why = message.replace("\r", "\\r").replace("\n", "\\n")
    LOG.info("refused %s %s: %d %s: %s", method, path, status, reason or "-", why)


class Events:
    """A request's events as the engine sends them, each with its choice's index, then None
    once its client has left."""

    def __init__(self, receive):
        self.queue: asyncio.Queue[tuple[int, Event] | None] = asyncio.Queue()
        self._receive = receive
        self._gone = asyncio.ensure_future(self._watch())

    def put(self, index: int, event: Event) -> None:
        """Called in the event loop (the engine's deliver hands events over)."""
        self.queue.put_nowait((index, event))

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.queue.put_nowait(None)

    async def ready(self) -> list[tuple[int, Event] | None]:
        """The next event and every one already behind it (a turn's text and end come
        together): at least one, waiting for it if none has come; None marks the end."""
        got = [await self.queue.get()]
        while got[-1] is not None and not self.queue.empty():
            got.append(self.queue.get_nowait())
        return got

    def close(self) -> None:
        self._gone.cancel()


class EventStream(StreamingResponse):
    """A server-sent event stream whose producer is closed as soon as sending stops, so
    that its clean-up (cancelling the sequence) never waits for garbage collection."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass                        # the client left while we wrote
        finally:
            await self.body_iterator.aclose()


async def _json_body(request: Request):
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise RequestError(f"the request body has {declared} bytes; at most {MAX_BODY} are "
                           f"read", status=413)
    # the parts are joined once all have come: a body grown in place past the allocator's
    # mmap threshold leaves its memory with the process (a body over the limit each time)
    parts, size = [], 0
    async for part in request.stream():
        parts.append(part)
        size += len(part)
        if size > MAX_BODY:
            raise RequestError(f"the request body passes {MAX_BODY} bytes", status=413)
    try:
        return json.loads(b"".join(parts))
    except (UnicodeDecodeError, ValueError) as exc:    # ValueError: JSONDecodeError, and
        raise RequestError(f"we could not parse the JSON body of your request: {exc}") \
            from None                                   # an int past Python's digit limit
    except RecursionError:
        raise RequestError("the JSON body of your request nests too deeply") from None


class Gate:
    """In front of the whole app: Bearer auth on the /v1 routes (when there is a key), and
    the status of every /v1 response counted for /metrics (a 401 and a 500 included)."""

    #: the routes counted by name; any other /v1 path is counted as "other" (a 404), so a
    #: client cannot grow the metrics without bound
    ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                        "/v1/models"})

    def __init__(self, app, metrics: ServerMetrics, api_key: str | None):
        self.app, self.metrics = app, metrics
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/v1" or path.startswith("/v1/")):
            return await self.app(scope, receive, send)
        route = path if path in self.ROUTES else "other"
        refusal = self._refusal(scope)
        if refusal is not None:
            self.metrics.answered(route, 401)
            log_refusal(scope.get("method", ""), path, 401, "invalid_api_key", refusal)
            return await JSONResponse(error_body(refusal, code="invalid_api_key"), 401,
                                      headers={"WWW-Authenticate": "Bearer"})(
                scope, receive, send)

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.answered(route, message["status"])
            await send(message)

        await self.app(scope, receive, counted)

    def _refusal(self, scope) -> str | None:
        """Why the request may not pass (None: it may)."""
        if self.key is None:
            return None
        given = [v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
        if not given:
            return ("you didn't provide an API key: send it as 'Authorization: Bearer "
                    "KEY' (this server was started with --api-key)")
        scheme, _, token = given[0].partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
            return "incorrect API key provided"
        return None


def create_app(engine: Engine, api_key: str | None = None):
    """The app (an ASGI app); the caller starts and closes the engine (see
    poot.cli.serve). `api_key`: the Bearer token every /v1 route wants (None: open)."""
    metrics = ServerMetrics(engine)
    engine.metrics = metrics

    async def generate(request: Request, parse) -> Response:
        gen = parse(await _json_body(request), engine.limits, engine.tokenizer)
        if gen.images:   # fetched and decoded off the event loop: a bad one is a 400 now
            gen.pixels = await asyncio.get_running_loop().run_in_executor(
                None, engine.images.prepare, gen.images)
        events = Events(request.receive)
        try:
            jobs = engine.submit_choices(gen, [partial(events.put, i) for i in range(gen.n)])
        except RequestError:
            events.close()
            raise
        shapes = Shapes(gen.kind, gen.model, logprobs=gen.logprobs is not None)
        if gen.stream:
            return EventStream(stream(jobs, events, shapes, gen.include_usage, gen.tools),
                               media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache"})
        return await whole(jobs, events, shapes, gen.tools)

    async def stream(jobs, events: Events, shapes: Shapes, include_usage: bool, tools):
        """The SSE body: each wake-up writes everything that came, in one piece; it ends
        once every choice has. With tools, a choice's text goes through its CallStream
        (poot.serve.tools): content and tool_calls deltas as soon as the syntax shows
        which the text is."""
        ends: dict[int, Event] = {}
        calls = {i: CallStream(tools) for i in range(len(jobs))} if tools else {}
        pending: dict[int, tuple] = {i: () for i in range(len(jobs))}  # entries not sent

        def deltas(i: int, found: list[dict]) -> list[bytes]:
            """A CallStream's deltas as chunks, the first carrying the entries held."""
            out = []
            for d in found:
                out.append(sse(shapes.chunk(i, None, delta=d, entries=pending[i])))
                pending[i] = ()
            return out

        try:
            if shapes.chat:
                yield b"".join(sse(shapes.chunk(i, None, first=True)) for i in range(len(jobs)))
            while True:
                out = []
                for item in await events.ready():
                    if item is None:
                        return                       # the client left
                    i, ev = item
                    if ev.kind == "text" and tools is not None:
                        pending[i] += ev.logprobs
                        out += deltas(i, calls[i].feed(ev.text))
                        continue
                    if ev.kind == "text":
                        out.append(shapes.text_event(i, ev.text, ev.logprobs))
                        continue
                    if ev.kind == "error":
                        out.append(sse(error_body(ev.text, "server_error")))
                    else:
                        reason = ev.finish_reason
                        if tools is not None:
                            found, called = calls[i].end()
                            out += deltas(i, found)
                            if called and reason != "length":   # a call cut short
                                reason = "tool_calls"             # ends as OpenAI's does
                        out.append(sse(shapes.chunk(i, None, reason,
                                                    entries=pending[i] + ev.logprobs)))
                        ends[i] = ev
                        if len(ends) < len(jobs):
                            continue
                        if include_usage:
                            out.append(sse(shapes.usage_chunk(
                                request_usage([ends[k] for k in sorted(ends)]))))
                    out.append(sse("[DONE]"))
                    yield b"".join(out)
                    return
                yield b"".join(out)
        finally:
            events.close()
            for job in jobs:
                engine.cancel(job)

    async def whole(jobs, events: Events, shapes: Shapes, tools) -> Response:
        choices = [{"text": [], "logprobs": [], "finish_reason": None} for _ in jobs]
        ends: dict[int, Event] = {}
        try:
            while True:
                for item in await events.ready():
                    if item is None:
                        return Response(status_code=499)   # the client left; no one reads this
                    i, ev = item
                    choices[i]["logprobs"] += ev.logprobs
                    if ev.kind == "text":
                        choices[i]["text"].append(ev.text)
                    elif ev.kind == "error":
                        return JSONResponse(error_body(ev.text, "server_error"), 500)
                    else:
                        choices[i]["finish_reason"] = ev.finish_reason
                        ends[i] = ev
                if len(ends) == len(jobs):
                    for c in choices:
                        c["text"] = "".join(c["text"])
                        if tools is not None:
                            c["text"], c["tool_calls"] = tools.parse(c["text"])
                            if c["tool_calls"]:
                                c["finish_reason"] = "tool_calls"
                    return JSONResponse(shapes.whole(
                        choices, request_usage([ends[k] for k in sorted(ends)])))
        finally:
            events.close()
            for job in jobs:
                engine.cancel(job)

    async def embeddings(request):
        """POST /v1/embeddings (poot.serve.embed): one vector per input, in input order."""
        from poot.serve.embed import refusal

        req = parse_embedding(await _json_body(request), engine.limits, engine.tokenizer)
        refused = refusal(engine.model)
        if refused is not None:
            raise refused
        events = Events(request.receive)
        try:
            job = engine.submit_embeddings(req.inputs, partial(events.put, 0))
        except RequestError:
            events.close()
            raise
        try:
            (item,) = await events.ready()
            if item is None:
                return Response(status_code=499)        # the client left
            ev = item[1]
            if ev.kind == "error":
                return JSONResponse(error_body(ev.text, "server_error"), 500)
            data = [{"object": "embedding", "index": i,
                     "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                     if req.base64 else v.tolist()} for i, v in enumerate(ev.embeddings)]
            return JSONResponse({"object": "list", "data": data, "model": req.model,
                                 "usage": {"prompt_tokens": ev.prompt_tokens,
                                           "total_tokens": ev.prompt_tokens}})
        finally:
            events.close()
            engine.cancel(job)

    async def chat(request):
        return await generate(request, parse_chat)

    async def completions(request):
        return await generate(request, parse_completion)

    async def models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "poot"}
            for name in (engine.limits.model, *engine.limits.adapters)]})

    async def health(request):
        if engine.broken:
            return JSONResponse(error_body(engine.broken, "server_error"), 503)
        return JSONResponse({"status": "ok" if engine.ready else "warming"})

    async def ready(request):
        if engine.broken:
            return JSONResponse(error_body(engine.broken, "server_error"), 503)
        if not engine.ready:
            s = engine.stats()
            return JSONResponse({"status": "warming", "plans_made": s["plans_made"],
                                 "plans_waiting": s["plans_waiting"]}, 503)
        return JSONResponse({"status": "ready"})

    async def stats(request):
        return JSONResponse(engine.stats())

    async def scrape(request):
        body, content_type = metrics.render()
        return Response(body, headers={"Content-Type": content_type})

    async def refused(request, exc: RequestError):
        headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 429 else None
        log_refusal(request.method, request.url.path, exc.status, exc.code or exc.param, str(exc))
        return JSONResponse(request_error_body(exc), exc.status, headers=headers)

    async def http_error(request, exc: HTTPException):
        log_refusal(request.method, request.url.path, exc.status_code, None, str(exc.detail))
        return JSONResponse(error_body(exc.detail, code=str(exc.status_code)),
                            exc.status_code, headers=exc.headers)

    async def gone(request, exc: ClientDisconnect):
        """The client left while sending its body: no one reads an answer, and it is no
        fault of the server's."""
        return Response(status_code=499)

    async def fault(request, exc: Exception):
        """A fault no check foresaw: still an OpenAI error object (uvicorn logs the
        traceback), and the server goes on."""
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}",
                                       "server_error"), 500)

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/embeddings", embeddings, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/ready", ready, methods=["GET"]),
              Route("/stats", stats, methods=["GET"]),
              Route("/metrics", scrape, methods=["GET"])]
    @asynccontextmanager
    async def lifespan(app):
        loop = asyncio.get_running_loop()
        engine.deliver = lambda events: loop.call_soon_threadsafe(deliver_here, events)
        from poot.serve import grammar

        if grammar.available():    # structured outputs' tokenizer, before any request needs it
            loop.run_in_executor(None, grammar.llg_tokenizer, engine.tokenizer)
        yield

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={RequestError: refused, HTTPException: http_error,
                                        ClientDisconnect: gone, Exception: fault})
    return Gate(app, metrics, api_key)
