"""The scheduler of `poot serve`: one thread owns the model and batches every request.

Each turn of the loop:
1. sequences whose client left are dropped at once, and their KV blocks go back to the pool;
2. queued requests are admitted, oldest first, while the batch has a free row and the pool
   has blocks for the whole of each (prompt + max_tokens, promised up front so that a
   running sequence never runs out of room mid-answer); with the prefix cache on (the
   default), a request starts with the cached blocks of its prompt's first whole blocks
   (same tokens, same adapter, same KV dtype) and prefills only the rest, at least its
   last token (poot.runtime.prefix_cache);
3. the oldest admitted requests still reading their prompts (up to `prefill_batch` of them)
   are fed one prefill chunk each, in one step (a long prompt delays the running streams by
   one chunk per turn, not by its whole length). A prefill plan of b sequences gives each
   prefill_tokens // b tokens, and at least MIN_WIDTH: up to prefill_tokens // MIN_WIDTH
   sequences share one chunk's rows, more take MIN_WIDTH rows each, so that a burst of
   prompts is fed in a few wide steps (a wide step costs far less than as many narrow
   ones: docs/performance.md, 2026-12-04). A turn takes the plan that feeds prompt tokens
   fastest: the tokens it feeds over its step's time (each plan timed once when it is
   made, then the fastest of its steps), so a lone prompt takes a narrow plan and a burst
   a wide one;
4. every sequence that is generating gets its next token in one decode step, through the
   decode plan of the smallest batch size that holds them all; the step samples each row
   in the graph with its request's own settings (or takes the argmax, through the argmax
   plan, when every row is greedy) and reads back only the token ids, and each streams its
   text at once (a prompt's first token is drawn on the host from the prefill's logits, by
   the same algorithm).

A request with a grammar (structured outputs, forced tool calls) or a `logit_bias` draws in
the graph under its token mask, after its bias: a step with such a row runs through the
"masked" decode plan, whose `sampler.mask` slot takes each row's bitmask over the
vocabulary (llguidance writes a constrained row's words straight into the slot's array;
every other row allows every id) and whose `sampler.bias_ids` / `sampler.bias` slots each
row's bias, and reads back only the token ids; the grammar then takes the token drawn. A
request whose logits the host must see (`logprobs`, a bias too wide for the slot: module
poot.serve.logits) makes its decode steps read the logits back: such a step runs through
the plan without a sampler (the "host" plan, one per batch size) and every row of it, the
others' included, draws on the host by the same algorithm and seeded draws (a bias and a
grammar's mask applied there on the host); the batch goes on together, at the cost of the logits' read-back for that
step.

With speculative decoding (`speculate`, or a request's `prediction`: poot.serve.speculation),
a sequence may propose tokens at a turn instead of taking the decode step: one
verification step scores every proposing sequence's proposal, each keeps what its sampler
accepts and rolls the rest back (`_verify`); the others take the decode step as before.
With a draft model (`draft:MODEL`, `self:N`), the proposals of every row proposing by it
come from the same batched draft steps first (poot.serve.speculation.DraftBatch), and a
sequence's draft blocks go back to the draft's pool when it leaves the batch.

Greedy decode steps overlap the host with the device (`overlap`, on by default on a paged
session without a stepper): a step of the argmax plan is launched without waiting, and
while its batch stays the same (no prefill, no one joining or leaving, room for one more
token each) the next turn launches the following step at once, its input tokens fed on the
device from the running step's, then reads the running step's token ids and streams them
while the new one runs. So each greedy token reaches its client one turn later than it
would, and the device does not wait for the host's slot arrays, token emission and events
between steps. A sequence that ends at a step (EOS, a stop string) has had one more step
launched for it: that token is dropped, and its blocks, that step's slot included, went
back to the pool when it ended. Anything else (a new prompt, a cancellation, a sampled row,
a sequence at its last token) first waits for the running step, then runs as before.

A vision model's image request (poot.serve.images) runs beside the batch on a dense session
of its own, one at a time: its whole prompt in one prefill step with the images' rows, then
one decode step per turn whose logits the host samples; it holds no paged blocks.

The plans `ready` waits for are made on the loop's own thread: a turn that needs one not
made yet plans it first, and an idle loop plans the rest in the background, smallest batch
first (the order a growing batch needs them), so the server answers at once and a lone
request waits only for the plans of one row (the cuda backend compiles each batch size's
kernels; 12 decode and 3 prefill plans up front took two minutes). The extra plans only
some requests need (`EXTRA_MODES`) are prepared on a thread of their own once those exist
and bound by the idle loop (poot.serve.extra_plans), so a plain request never waits for
one.

A sequence that ends (EOS, a stop string, max_tokens) or is cancelled leaves the batch in
the same turn and frees its blocks before its client hears that it finished; its full
blocks stay cached (prompt and answer: a next turn of a chat starts with them) until the
pool needs them, except a failed step's, whose rows may not have been written. The HTTP side
talks to the loop only through `submit`, `cancel` and `stats`. A turn's events go back in
one hand-over, `deliver(events)` (the app sets it to one call into its event loop per turn,
not one per token), which calls each request's own `emit`.
"""
from __future__ import annotations

import gc
import itertools
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from poot.errors import BindError, RequestError
from poot.models.speculate import (DRAFT_TOKENS, AdaptiveK, PromptLookup, accept,
                                   accept_ids, check_draft_tokens, parse, widths)
from poot.models.sample_graph import mode_for, slot_values
from poot.models.sampling import Sampler
from poot.runtime.session import SCORE, batch_for, plan_key, scoring
from poot.serve.extra_plans import ExtraPlans
from poot.serve.logits import LogitRule
from poot.serve.metrics import QUIET
from poot.serve.protocol import Generation, Limits
from poot.serve.speculation import DraftBatch, Prediction, Speculation
from poot.models.text_stream import TextStream


@dataclass(frozen=True)
class Event:
    """What a request's client hears: text, the end (with usage), or a failure."""

    kind: str                          # "text" | "done" | "error"
    text: str = ""
    finish_reason: str | None = None   # "stop" | "length" (kind "done")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0             # of the prompt, read from the prefix cache
    #: the log-probability entries of the tokens whose text this event carries (or, at
    #: "done", of those whose text was cut), when the request asked for them
    logprobs: tuple = ()
    #: an embeddings request's vectors, one per input (kind "done")
    embeddings: tuple = ()
    #: (accepted, rejected) proposed tokens of a request that gave a prediction ("done")
    predicted: tuple[int, int] | None = None


class EmbedJob:
    """An embeddings request: token ids of each input; its vectors come in one event."""

    def __init__(self, inputs: list[list[int]], emit: Callable[[Event], None]):
        self.inputs, self.emit = inputs, emit
        self.cancelled = False


class Job:
    """One admitted or queued request (one choice of it) and the state of its sequence.

    Choice `index` > 0 of a request with a seed draws with seed + index, so that its n
    choices differ and each is reproducible; it waits for the `leader`'s (choice 0's)
    prompt before it is admitted, so that it starts with the prompt's cached blocks."""

    def __init__(self, jid: int, gen: Generation, emit: Callable[[Event], None], tokenizer,
                 index: int = 0, leader: Job | None = None):
        self.id, self.gen, self.emit = jid, gen, emit
        self.index, self.leader = index, leader
        sampling = dict(gen.sampling)
        if index and gen.seed is not None:
            sampling["seed"] = (gen.seed + index) % 2 ** 64
        self.sampler = Sampler(**sampling)
        #: the host's part of each draw, or None when the step graph draws it alone
        self.rule = LogitRule(tokenizer, bias=gen.logit_bias, top=gen.logprobs,
                              constraint=gen.constraint(tokenizer)) \
            if gen.logit_bias or gen.logprobs is not None or gen.grammar else None
        self.logprobs: list[dict] = []   # entries not yet sent with text
        self.text = TextStream(tokenizer, gen.stop)
        self.history = list(gen.prompt_ids)
        self.fed = 0                 # prompt tokens already in the KV cache
        self.cached = 0              # of them, read from the prefix cache
        self.generated = 0
        self.last: int | None = None  # the token the next decode step feeds
        self.cancelled = False
        #: its speculative decoding (poot.serve.speculation), None where it has none
        self.spec: Speculation | None = None

    @property
    def blocks_needed(self) -> int:
        return len(self.gen.prompt_ids) + self.gen.max_tokens


#: the decode plans of each batch size: "full" samples every row in the graph with its own
#: settings (a greedy row takes the argmax), so it serves any mix of requests; "argmax" (one
#: ArgTopK k=1 on the logits, no sampler slots) serves a step whose rows are all greedy
#: without a penalty, and picks the same tokens at a fraction of the sampler's work
SAMPLE_MODES = ("argmax", "full")
#: the decode plans of steps with a constrained or biased row ("full" after each row's
#: logit bias and token mask): extra plans (`EXTRA_MODES`)
MASKED = "masked"
#: the decode plans only some requests need, by the /stats name of each: "host" (no
#: sampler; its logits read back, for logprobs) and MASKED. A helper thread prepares them
#: after every plan `ready` waits for, smallest batch first, and the idle loop binds them
#: (poot.serve.extra_plans), so neither `ready` nor a plain request waits for them and a
#: first such request seldom does; a step that needs one not bound yet takes it first
EXTRA_MODES = {"host": None, "masked": MASKED}
#: the interpreter's thread switch interval while an engine runs (seconds)
SWITCH_S = 0.0001
#: the fewest prompt tokens a prefill plan gives each of its sequences (see item 3 above)
MIN_WIDTH = 8


def batch_sizes(largest: int) -> list[int]:
    """The batch sizes planned for steps of up to `largest` sequences: powers of two below
    it, and itself."""
    return sorted({1 << i for i in range(largest.bit_length()) if 1 << i < largest}
                  | {largest})


class Engine:
    def __init__(self, model, *, name: str, max_batch: int = 8, pool_tokens: int | None = None,
                 max_queue: int = 64, prefill_batch: int | None = None,
                 overlap: bool = True, default_max_tokens: int | None = None,
                 prefix_cache: bool = True, speculate: str | None = None,
                 draft_tokens: int | None = None, allow_image_urls: bool = False):
        """`default_max_tokens`: the answer length of a request that names none, on both
        endpoints (None: poot.serve.protocol's defaults); `prefix_cache`: requests share
        the KV blocks of a common prompt prefix (item 2 above); `speculate`: "lookup" to
        speculate by prompt lookup, "draft:MODEL" or "self:N" with a draft model (loaded
        here, on the model's backend), proposing up to `draft_tokens` tokens a step (see
        `_verify`); `allow_image_urls`: a vision model's requests may name remote images
        (poot.serve.images)."""
        prefill_batch = max_batch if prefill_batch is None else prefill_batch
        if max_batch < 1 or max_queue < 0 or not 0 < prefill_batch:
            raise BindError(f"max_batch and prefill_batch must be >= 1 and max_queue >= 0, "
                            f"got {max_batch}, {prefill_batch} and {max_queue}")
        self.speculate = check_speculate(speculate)
        self.draft_tokens = DRAFT_TOKENS if draft_tokens is None else \
            check_draft_tokens(draft_tokens)
        #: the verification plans' widths (a proposal of k runs in the smallest above k)
        self.verify_widths = widths(self.draft_tokens)
        #: the engine's step costs AdaptiveK weighs (its `seconds`, shared by every
        #: speculating sequence): a plain decode step and each width's verification step
        self._step_clock = AdaptiveK(self.draft_tokens)
        #: argmax_verify_steps: the verification steps that read back only argmax ids
        self.speculation = dict(proposed=0, accepted=0, verify_steps=0, argmax_verify_steps=0)
        self.model, self.tokenizer = model, model.tokenizer
        self.max_batch, self.max_queue = max_batch, max_queue
        self.session = model.session("paged", batch=max_batch, pool=pool_tokens,
                                     decode_batches=batch_sizes(max_batch),
                                     prefill_batches=batch_sizes(min(prefill_batch,
                                                                     max_batch)))
        self.blocks = self.session.blocks
        self.blocks.use_prefix_cache(prefix_cache)
        #: the draft model's sequences (`--speculate draft:MODEL|self:N`), None without one
        self.drafts = DraftBatch(model, parse(self.speculate), batch_sizes(max_batch)) \
            if self.speculate and parse(self.speculate).kind != "lookup" else None
        #: what besides a prompt's tokens and adapter makes its KV rows (the cache's key)
        self.kv_key = f"kv={getattr(model, 'kv_dtype', 'f32')}"
        #: greedy steps launched without waiting, one in flight (see the module docstring)
        self.overlap = overlap and self.session.stepper is None
        #: the launched step not yet read: its jobs in row order and its PendingDecode
        self._inflight: tuple[list[Job], object] | None = None
        adapters = tuple(model.adapters.index) if model.adapters is not None else ()
        if name in adapters:
            raise BindError(f"the LoRA adapter {name!r} has the served model's own name; "
                            f"name it differently (--lora OTHER=PATH)")
        vision = getattr(model.checkpoint, "vision", None)
        #: a vision model's encoder, image cache and dense session (poot.serve.images)
        self.images = None
        if vision is not None:
            from poot.serve.images import ServedImages

            self.images = ServedImages(model)
        self.limits = Limits(name, model.config.max_seq, self.blocks.pool_slots,
                             min(model.config.vocab, self.tokenizer.vocab_size), adapters,
                             speculate=self.speculate is not None,
                             image_tokens=None if vision is None else vision.tokens,
                             image_urls=allow_image_urls,
                             **({} if default_max_tokens is None else {"default_max_tokens": {
                                 "completion": default_max_tokens,
                                 "chat": default_max_tokens}}))
        self._cv = threading.Condition()
        self._queue: deque[Job] = deque()
        self._embeds: deque[EmbedJob] = deque()
        self._embedder = None             # poot.serve.embed.Embedder, made on first use
        self._active: list[Job] = []      # admitted, in admission order
        self._ids = itertools.count()
        self._stopping = False
        self.broken: str | None = None    # why the loop stopped, if it failed
        self._thread: threading.Thread | None = None
        self._outbox: list[tuple[Job, Event]] = []
        #: hands a turn's events to the requests' side; by default calls each emit here
        self.deliver: Callable[[list[tuple[Job, Event]]], None] = deliver_here
        #: timing hooks for /metrics (poot.serve.metrics; the app installs a recorder)
        self.metrics = QUIET
        self.counters = dict(steps=0, peak_batch=0, prefill_chunks=0, generated_tokens=0,
                             finished=0, cancelled=0, rejected=0, failed=0, argmax_steps=0,
                             masked_steps=0, gc_full=0, overlapped_steps=0, host_steps=0,
                             embedded_inputs=0,
                             prompt_tokens=0, prefilled_tokens=0, cached_prompt_tokens=0)
        #: seconds in the loop's turns, and in the session's decode and prefill steps within
        #: them (slot arrays, the step, the read-back); the rest of a turn is the host's
        #: scheduling, text and events. decode_wait_s: the part of decode_step_s spent
        #: waiting for launched steps' token ids
        self.times = dict(turns_s=0.0, decode_step_s=0.0, prefill_step_s=0.0, planning_s=0.0,
                          gc_s=0.0, decode_wait_s=0.0, verify_step_s=0.0)
        s = self.session
        #: the chunk width of the prefill plan of each batch size (item 3 above)
        self.prefill_widths = {b: max(s.prefill_tokens // b, min(MIN_WIDTH, s.prefill_tokens))
                               for b in s.prefill_batches}
        #: seconds of a step of the prefill plan of each batch size, the fastest seen
        self.prefill_cost: dict[int, float] = {}
        #: the plans still to make ((tokens, batch, sample) as Session.executor takes
        #: them, and the session: the draft's after the model's), in the order a batch
        #: growing from one row needs them
        self._unplanned = sorted(
            [(t, b, None, s) for b, t in self.prefill_widths.items()]
            + [(1, b, mode, s) for mode in SAMPLE_MODES for b in s.decode_batches]
            + [(w, b, SCORE, s) for w in (self.verify_widths if self.speculate else ())
               for b in s.decode_batches]
            + [(t, b, m, self.drafts.session) for t, b, m in
               (self.drafts.plans() if self.drafts else ())],
            key=lambda p: (p[1], p[3] is not s, p[2] == SCORE, p[0] == 1, p[2] or ""))
        #: every plan of the configured batch (session, key), which `ready` waits for
        self._plans = [(p[3], plan_key(*p[:3])) for p in self._unplanned]
        #: the extra plans' keys by /stats name (those of a session that samples on the
        #: host have no masked plans), made after the others
        self._extra = {name: [plan_key(1, b, mode) for b in s.decode_batches]
                       for name, mode in EXTRA_MODES.items()
                       if mode is None or s.make_sampled is not None}
        #: the verification plans that take each row's argmax in the graph, made as extra
        #: plans: a greedy verification step runs one once it is bound, else the logits'
        self._verify_argmax = [(w, b, "argmax") for b in s.decode_batches
                               for w in self.verify_widths] \
            if self.speculate and s.make_sampled is not None else []
        #: their preparation beside the loop (its `prepare` is the hook tests slow down)
        self.extras = ExtraPlans(s, sorted(((1, b, EXTRA_MODES[name]) for name in self._extra
                                            for b in s.decode_batches), key=lambda p: p[1])
                                 + self._verify_argmax, self._cv)
        self._announced = False
        self._t0 = time.perf_counter()
        self.progress: Callable[[str], None] | None = None
        self._frozen = 0           # plans made when the collector last froze the heap
        self._gc_t0 = 0.0

    # -- the HTTP side --------------------------------------------------------------------
    def warm(self, progress=None, wait: bool = False) -> None:
        """Have the loop plan every prefill and decode plan while it is idle (with `wait`:
        plan those `ready` waits for now; the extra plans follow in the background), each
        run once on padding rows (a backend that records steps records it there);
        `progress` hears one line per plan, the extra ones' once bound."""
        self.progress = progress
        while wait and not self.ready and self._plan_next():
            self._freeze()

    @property
    def ready(self) -> bool:
        """Every plan of the configured batch exists (GET /ready): until then the server
        answers, but a request may wait while the plan its step needs is made."""
        return all(k in s.executors for s, k in self._plans)

    def _announce(self) -> None:
        """One progress line once every plan exists."""
        if self.ready:
            self.extras.start()        # the extra plans come after (EXTRA_MODES)
        if self.progress and not self._announced and self.ready:
            self._announced = True
            self.progress(f"ready: all {len(self._plans)} plans made, "
                          f"{time.perf_counter() - self._t0:.1f} s after the engine started "
                          f"({self.times['planning_s']:.1f} s of planning)")

    def _plan_next(self) -> bool:
        """Make the next plan not made yet (skipping those a turn made on demand); False
        when every one is made."""
        while self._unplanned and plan_key(*self._unplanned[0][:3]) in \
                self._unplanned[0][3].executors:
            self._unplanned.pop(0)
        if not self._unplanned:
            self._announce()
            return False
        tokens, batch, sample, session = self._unplanned.pop(0)
        if session is not self.session:
            self.drafts.share_weights(self.session)
        t0 = time.perf_counter()
        session.rehearse(tokens, batch, sample)
        took = time.perf_counter() - t0
        if sample is None and session is self.session and \
                self.prefill_widths.get(batch) == tokens:
            # a prefill plan: its cost, once recorded (item 3 above)
            t1 = time.perf_counter()
            session.rehearse(tokens, batch, sample)
            self._prefill_timed(batch, time.perf_counter() - t1)
        self.times["planning_s"] += took
        if self.progress:
            how = f" ({sample})" if sample else ""
            how += ", the draft's" if session is not self.session else ""
            self.progress(f"planned and ran the {tokens}-token x {batch} step{how} in "
                          f"{took:.1f} s; {self._waiting()} plans to go before ready")
        self._announce()
        return True

    def _waiting(self) -> int:
        """Plans `ready` waits for that are not made yet."""
        return sum(k not in s.executors for s, k in self._plans)

    def _bind_extra(self) -> None:
        """Bind an extra plan the helper prepared and run it once on padding rows (as
        `_plan_next` does)."""
        bound = self.extras.bind_one()
        if bound is None:
            return
        key, took = bound
        self.session.rehearse(*key)
        if self.progress:
            tokens, batch, sample = key
            how = "host logits" if sample is None else sample
            self.progress(f"made the {tokens}-token x {batch} step ({how}), an extra plan, "
                          f"in {took:.1f} s beside the scheduler; {self.extras.waiting} "
                          f"extra plans to go")

    def _freeze(self) -> None:
        """After a new plan: collect once, then set aside everything left (the plans live
        as long as the process), so that no later collection walks them again; each
        collection then walks what is new since the last plan. (What a running request
        holds at that moment is frozen too: freed by reference counts as ever, never by the
        cycle collector; at most once per plan.)"""
        if self._plans_made() != self._frozen:
            gc.collect()
            gc.freeze()
            self._frozen = self._plans_made()

    def _plans_made(self) -> int:
        return len(self.session.executors) + \
            (len(self.drafts.session.executors) if self.drafts else 0)

    def _gc_timed(self, phase: str, info: dict) -> None:
        """gc.callbacks: the process's collections while the engine runs, in /stats (any
        thread's: the pause stops both)."""
        if phase == "start":
            self._gc_t0 = time.perf_counter()
            return
        self.times["gc_s"] += time.perf_counter() - self._gc_t0
        self.counters["gc_full"] += info["generation"] == 2

    def start(self) -> None:
        # The loop shares the interpreter with the HTTP event loop: when a step's device
        # wait ends, the loop should get the interpreter back within a fraction of a step,
        # not after the default 5 ms switch interval (process-wide; a server owns its process)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_S))
        self._t0 = time.perf_counter()
        gc.callbacks.append(self._gc_timed)
        self._thread = threading.Thread(target=self._loop, name="poot-serve-engine",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
        self.extras.close()
        if self._gc_timed in gc.callbacks:
            gc.callbacks.remove(self._gc_timed)

    def submit(self, gen: Generation, emit: Callable[[Event], None]) -> Job:
        """Queue a request, or refuse it with 429 (the client's to retry) when `max_queue`
        requests already wait beyond the batch's free rows."""
        return self.submit_choices(gen, [emit])[0]

    def submit_choices(self, gen: Generation, emits: list[Callable[[Event], None]]) -> list[Job]:
        """Queue one sequence per choice of a request (`emits[i]` hears choice i), all or
        none, as `submit` does."""
        with self._cv:
            if self._stopping or self.broken:
                raise RequestError(f"the server is not serving: {self.broken or 'shutting down'}",
                                   status=503, type="server_error", code="not_serving")
            free_rows = max(0, self.max_batch - len(self._active))
            if len(self._queue) + len(emits) - 1 - free_rows >= self.max_queue:
                self.counters["rejected"] += 1
                raise RequestError(f"the server is busy: {len(self._active)} requests are "
                                   f"running and {len(self._queue)} are queued (the queue "
                                   f"holds {self.max_queue}); retry later", status=429,
                                   type="server_error", code="server_busy")
            jobs: list[Job] = []
            for i, emit in enumerate(emits):
                jobs.append(Job(next(self._ids), gen, emit, self.tokenizer, i,
                                jobs[0] if jobs else None))
                jobs[-1].spec = self._speculation(jobs[-1])
                self.metrics.queued(jobs[-1])
            self._queue.extend(jobs)
            self._cv.notify()
        return jobs

    def submit_embeddings(self, inputs: list[list[int]],
                          emit: Callable[[Event], None]) -> EmbedJob:
        """Queue an embeddings request (its inputs' token ids); the loop runs one such
        request per turn, between the batch's steps."""
        with self._cv:
            if self._stopping or self.broken:
                raise RequestError(f"the server is not serving: {self.broken or 'shutting down'}",
                                   status=503, type="server_error", code="not_serving")
            if len(self._embeds) >= self.max_queue:
                self.counters["rejected"] += 1
                raise RequestError(f"the server is busy: {len(self._embeds)} embeddings "
                                   f"requests are queued; retry later", status=429,
                                   type="server_error", code="server_busy")
            job = EmbedJob(inputs, emit)
            self._embeds.append(job)
            self._cv.notify()
        return job

    def _speculation(self, job: Job) -> Speculation | None:
        """A new job's speculation: with a prediction, proposed from it; else by prompt
        lookup where the server speculates; none where the request turned it off or the
        host reads its logits (a verification step's rows are not drawn that way)."""
        gen = job.gen
        if gen.speculate is False or job.rule is not None or gen.images or \
                (self.speculate is None and gen.prediction is None):
            return None
        proposer = Prediction(gen.prediction) if gen.prediction is not None else \
            self.drafts or PromptLookup()
        # a sampled sequence's draws follow its proposal lengths: they must not follow the
        # step times (nor so its neighbours), or a seed would not repeat its text; its
        # AdaptiveK weighs the fixed cost model alone
        clock = self._step_clock.seconds if job.sampler.greedy else {}
        return Speculation(proposer, self.draft_tokens, clock)

    def _embed_next(self) -> None:
        """The oldest embeddings request's vectors (poot.serve.embed), or its failure."""
        with self._cv:
            job = self._embeds.popleft()
        if job.cancelled:
            return
        try:
            if self._embedder is None:
                from poot.serve.embed import Embedder

                while self.session.weights is None and self._plan_next():
                    pass                     # the served weights, uploaded once
                self._embedder = Embedder(self.model, self.session.weights)
            vectors = tuple(self._embedder.embed(ids) for ids in job.inputs)
        except Exception as exc:  # a failed embedding must not take the server down
            traceback.print_exc(file=sys.stderr)
            self._emit(job, Event("error", text=f"{type(exc).__name__}: {exc}"))
            return
        self.counters["embedded_inputs"] += len(vectors)
        self._emit(job, Event("done", prompt_tokens=sum(map(len, job.inputs)),
                              embeddings=vectors))

    def cancel(self, job: Job) -> None:
        """The client left: the loop drops the job at its next turn (a no-op once done)."""
        with self._cv:
            job.cancelled = True
            self._cv.notify()

    def stats(self) -> dict:
        with self._cv:
            active = list(self._active)
            queued = len(self._queue)
        b = self.blocks
        return {
            "model": self.limits.model, "max_seq": self.limits.max_seq,
            "pool_slots": b.pool_slots, "block_size": b.block,
            "pool_blocks": b.pool_slots // b.block, "free_blocks": b.free,
            "active": len(active), "queued": queued,
            "prefilling": sum(j.last is None for j in active),
            "decoding": sum(j.last is not None for j in active),
            "max_batch": self.max_batch, "max_queue": self.max_queue,
            "decode_batches": list(self.session.decode_batches),
            "prefill_batches": list(self.session.prefill_batches),
            "prefill_widths": list(self.prefill_widths.values()),
            "plans_made": sum(k in s.executors for s, k in self._plans),
            "plans_waiting": self._waiting(),
            "extra_plans_waiting": self.extras.waiting,
            "extra_plans": {name: [k[1] for k in keys if k in self.session.executors]
                            for name, keys in self._extra.items()},
            "ready": self.ready,
            "prefix_cache": b.cache is not None,
            **(b.cache.stats() if b.cache is not None else {}),
            **(self.images.counters if self.images is not None else {}),
            "speculation": self._speculation_stats(),
            **self.counters,
            **{k: round(v, 6) for k, v in self.times.items()},
        }

    def _speculation_stats(self) -> dict:
        sp = dict(self.speculation)
        return {"mode": self.speculate, "draft_tokens": self.draft_tokens, **sp,
                "acceptance": round(sp["accepted"] / sp["proposed"], 6) if sp["proposed"]
                else None, **(self.drafts.stats() if self.drafts else {})}

    # -- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._turns()
        except Exception as exc:  # a fault outside any step: refuse from now on, loudly
            traceback.print_exc(file=sys.stderr)
            with self._cv:
                self.broken = f"the scheduler failed: {type(exc).__name__}: {exc}"
                for job in [*self._active, *self._queue]:
                    self._outbox.append((job, Event("error", text=self.broken)))
                self._active.clear()
                self._queue.clear()
            self.deliver(self._outbox)

    def _turns(self) -> None:
        clock, times = time.perf_counter, self.times
        while True:
            with self._cv:
                while not (self._stopping or self._queue or self._active or self._unplanned
                           or self._inflight or self._embeds or self.extras.prepared):
                    self._cv.wait()
                if self._stopping:
                    break
                idle = not self._queue and not self._active and not self._inflight \
                    and not self._embeds
            if idle:          # nothing to serve: make the next plan (outside the lock)
                if not self._plan_next():
                    self._bind_extra()
                self._freeze()
                continue
            with self._cv:
                t0 = clock()
                self._drop_cancelled()
                self._admit()
                imaging = [j for j in self._active if j.gen.images]
                prefilling = [j for j in self._active if j.last is None and not j.gen.images]
                prefilling = prefilling[: self.session.prefill_batches[-1]]
                decoding = [j for j in self._active if j.last is not None and
                            not j.gen.images]
            # each speculating job decides its proposal now: a verification step waits for
            # the step in flight (it proposes after that step's token)
            proposing = [j for j in decoding if j.spec is not None and
                         j.spec.wants(j.gen.max_tokens - j.generated)]
            if self.drafts is not None:
                self._release_drafts(decoding)
            chain = not proposing and not imaging and self._chains(prefilling, decoding)
            if self._inflight is not None and not chain:
                self._guarded(self._inflight[0], self._settle, None)
                decoding = [j for j in decoding if j in self._active]
            if prefilling:
                self._guarded(prefilling, self._prefill, prefilling)
            if self._embeds:
                self._embed_next()
            for job in imaging:
                self._guarded([job], self._image_step, job)
            if chain:
                self._guarded(decoding, self._decode_next, decoding)
            elif decoding:
                self._guarded(decoding, self._decode, decoding)
            if self._outbox:
                outbox, self._outbox = self._outbox, []
                self.deliver(outbox)
            times["turns_s"] += clock() - t0
            self._freeze()      # after a plan this turn made (a no-op otherwise)
        if self._inflight is not None:
            self._inflight[1].tokens()     # let the last step finish before the pool goes
        with self._cv:
            for job in self._active:
                self._close(job)
            self._active.clear()

    def _release_drafts(self, jobs: list[Job]) -> None:
        """The draft sequences of jobs whose AdaptiveK stopped proposing for good (a draft
        that does not pay for itself) give their blocks back now, not at the job's end."""
        for job in jobs:
            if job.spec is not None and job.spec.proposer is self.drafts and \
                    job.spec.k_of.off:
                self.drafts.close(job.id, spent=True)

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._queue if j.cancelled]:
            self._queue.remove(job)
            self.counters["cancelled"] += 1
        for job in [j for j in self._active if j.cancelled]:
            self._leave(job)
            self.counters["cancelled"] += 1

    def _admit(self) -> None:
        """Admit queued jobs (item 2 above). A job's cached blocks are not handed out
        again, but those no sequence holds now leave the pool's free count."""
        blk = self.blocks.block
        promised = sum(-(-j.blocks_needed // blk) - len(self.blocks.blocks(j.id))
                       for j in self._active if not j.gen.images)
        while self._queue and len(self._active) < self.max_batch:
            job = self._queue[0]
            if job.gen.images:
                if any(j.gen.images for j in self._active):
                    break            # the dense session holds one image request at a time
                self._queue.popleft()
                self.counters["prompt_tokens"] += len(job.gen.prompt_ids)
                self._active.append(job)
                continue
            if job.leader is not None and self.blocks.cache is not None and \
                    job.leader in self._active and job.leader.last is None:
                break        # a later choice waits for the prompt choice 0 is reading
            adapter = job.gen.model if job.gen.model in self.limits.adapters else None
            rows, key = self.model.adapter_rows(adapter), f"{adapter or ''}|{self.kv_key}"
            hit, idle = self.session.reusable(job.gen.prompt_ids, rows, key)
            need = -(-job.blocks_needed // blk) - hit
            if need + idle > self.blocks.free - promised:
                break                # the oldest waits for blocks; no one overtakes it
            self._queue.popleft()
            self.session.open(job.id, rows, key)
            job.fed = job.cached = self.session.reuse(job.id, job.gen.prompt_ids)
            self.counters["prompt_tokens"] += len(job.gen.prompt_ids)
            self.counters["cached_prompt_tokens"] += job.cached
            self._active.append(job)
            promised += need

    def _leave(self, job: Job, failed: bool = False) -> None:
        """Take a job out of the batch and close its sequence: its blocks go back to the
        pool, its full ones to the prefix cache unless its step failed."""
        self._active.remove(job)
        self._close(job, failed)

    def _close(self, job: Job, failed: bool = False) -> None:
        if job.gen.images:
            dense = self.images.session(None)
            if dense.dense_seq == job.id:     # opened at its first step
                dense.close(job.id)
        else:
            self.session.close(job.id, None if failed else job.history)
        if self.drafts is not None:
            self.drafts.close(job.id)

    def _image_session(self):
        """The dense session of image requests, sharing the paged session's weights."""
        while self.session.weights is None and self._plan_next():
            pass                     # the served weights, uploaded once
        return self.images.session(self.session.weights)

    def _image_step(self, job: Job) -> None:
        """An image request's turn (poot.serve.images): its whole prompt with the image
        rows in one prefill step, or one decode step; the host draws its token."""
        t0 = time.perf_counter()
        if job.last is None:
            adapter = job.gen.model if job.gen.model in self.limits.adapters else None
            self._image_session().open(job.id, self.model.adapter_rows(adapter))
            logits = self.images.prefill(job.id, job.gen)
            self.times["prefill_step_s"] += time.perf_counter() - t0
            job.fed = len(job.gen.prompt_ids)
            self.counters["prefill_chunks"] += 1
            self.counters["prefilled_tokens"] += job.fed
        else:
            logits = self.images.session(None).decode({job.id: job.last})[job.id]
            self.times["decode_step_s"] += time.perf_counter() - t0
            self._count_step([job], "host")
        self._advance(job, logits)

    def _guarded(self, jobs: list[Job], step, arg) -> None:
        """Run a step; if it fails, its sequences fail with the reason and the rest go on."""
        try:
            step(arg)
        except Exception as exc:  # a broken step must not take the server down
            traceback.print_exc(file=sys.stderr)
            with self._cv:
                for job in jobs:
                    if job in self._active:
                        self._leave(job, failed=True)
                        self.counters["failed"] += 1
                        self._emit(job, Event("error", text=f"{type(exc).__name__}: {exc}"))

    def _prefill(self, jobs: list[Job]) -> None:
        """The next chunk of the prompts of the oldest jobs (as many as `_prefill_shape`
        picks): together through a prefill plan, except where a whole chunk would pass the
        sequence's capacity (the session then feeds that chunk a token at a time)."""
        s = self.session
        k, t = self._prefill_shape(jobs)
        jobs = jobs[:k]
        chunks = {j: j.gen.prompt_ids[j.fed: j.fed + t] for j in jobs}
        whole = [j for j in jobs if j.fed + t <= s.capacity]
        b = batch_for(s.prefill_batches, len(whole)) if whole else 0
        planned = bool(whole) and plan_key(t, b) in s.executors
        t0 = time.perf_counter()
        logits = dict(zip(whole, s.prefill_rows({j.id: chunks[j] for j in whole}, t))) \
            if whole else {}
        if planned:      # a step of a plan made before: its time is the step's alone
            self._prefill_timed(b, time.perf_counter() - t0)
        for job in jobs:
            if job not in logits:
                logits[job] = s.prefill(job.id, chunks[job])
        self.times["prefill_step_s"] += time.perf_counter() - t0
        for job in jobs:
            job.fed += len(chunks[job])
            self.counters["prefill_chunks"] += 1
            self.counters["prefilled_tokens"] += len(chunks[job])
            if job.fed == len(job.gen.prompt_ids):
                self._advance(job, logits[job])

    def _prefill_shape(self, jobs: list[Job]) -> tuple[int, int]:
        """How many of the prefilling jobs (oldest first) this turn feeds, and their chunk
        width (`prefill_choice`)."""
        return prefill_choice(self.session.prefill_batches, self.prefill_widths,
                              self.prefill_cost, [len(j.gen.prompt_ids) - j.fed for j in jobs])

    def _prefill_timed(self, batch: int, seconds: float) -> None:
        self.prefill_cost[batch] = min(seconds, self.prefill_cost.get(batch, seconds))

    def _chains(self, prefilling: list[Job], decoding: list[Job]) -> bool:
        """Whether this turn launches the next step of the one in flight, fed on the
        device: the same jobs in the same rows, nothing to prefill, and room for the
        token after the running step's in each (below max_tokens)."""
        if self._inflight is None or prefilling or self._embeds:
            return False
        jobs = self._inflight[0]
        return (len(jobs) == len(decoding) and all(a is b for a, b in zip(jobs, decoding))
                and all(j.generated + 2 <= j.gen.max_tokens for j in jobs))

    def _decode_next(self, jobs: list[Job]) -> None:
        """Launch the step after the running one (its tokens fed on the device), then read
        and stream the running one's tokens while the new one runs."""
        t0 = time.perf_counter()
        launched = self.session.decode_launch([j.id for j in jobs], after=self._inflight[1])
        self.times["decode_step_s"] += time.perf_counter() - t0
        self._count_step(jobs, "argmax")
        self.counters["overlapped_steps"] += 1
        self._settle()
        self._inflight = (jobs, launched)

    def _settle(self, _=None) -> None:
        """Wait for the step in flight and advance its jobs still running by their tokens
        (a job that ended or left since its launch drops its token)."""
        jobs, launched = self._inflight
        self._inflight = None
        t0 = time.perf_counter()
        ids = launched.tokens()
        took = time.perf_counter() - t0
        self.times["decode_step_s"] += took
        self.times["decode_wait_s"] += took
        active = set(map(id, self._active))
        for job, tok in zip(jobs, ids, strict=True):
            if id(job) in active:
                self._advance(job, None, int(tok))

    def _count_step(self, jobs: list[Job], mode: str) -> None:
        self.counters["steps"] += 1
        self.counters["argmax_steps"] += mode == "argmax"
        self.counters["peak_batch"] = max(self.counters["peak_batch"], len(jobs))

    def _decode(self, jobs: list[Job]) -> None:
        """One decode step for every generating job; each row samples in the graph with
        its job's own settings (after its logit bias and under its grammar's token mask,
        where it has them), and only the token ids come back, unless a job's logits are
        wanted on the host (logprobs: then every row draws there). A greedy step with
        `overlap` is launched and read at the next turn (see the module docstring). Jobs
        that propose tokens this turn are verified first (`_verify`); the rest, and those
        whose proposal came up empty, take this step."""
        if any(j.spec is not None and j.spec.k for j in jobs):
            self._verify([j for j in jobs if j.spec is not None and j.spec.k])
            active = set(map(id, self._active))
            jobs = [j for j in jobs if id(j) in active and (j.spec is None or not j.spec.k)]
            if not jobs:
                return
        t0 = time.perf_counter()
        if any(j.rule is not None and j.rule.host for j in jobs):
            # a row's logits are wanted on the host (module logits): the step reads them
            # back, and every row of it draws on the host
            self.extras.need((1, batch_for(self.session.decode_batches, len(jobs)), None))
            logits = self.session.decode_rows({j.id: j.last for j in jobs})
            self.times["decode_step_s"] += time.perf_counter() - t0
            self._count_step(jobs, "host")
            self.counters["host_steps"] += 1
            for job, row in zip(jobs, logits, strict=True):
                self._advance(job, row)
            return
        rows = [(j.sampler, j.history) for j in jobs]
        # here a job's rule is its grammar and bias alone: its row draws after the bias,
        # under the grammar's mask
        masks = [j.rule.constraint if j.rule is not None else None for j in jobs]
        biases = [j.rule.bias if j.rule is not None else None for j in jobs]
        shaped = any(m is not None or b is not None for m, b in zip(masks, biases))
        mode = mode_for([j.sampler for j in jobs], masked=shaped)
        masks, biases = (masks, biases) if mode == MASKED else ([], [])
        if self.overlap and mode == "argmax":
            self._inflight = (jobs, self.session.decode_launch({j.id: j.last for j in jobs}))
            self.times["decode_step_s"] += time.perf_counter() - t0
            self._count_step(jobs, mode)
            return
        vocab = self.model.config.vocab
        if mode == MASKED:
            self.extras.need((1, batch_for(self.session.decode_batches, len(jobs)), mode))
        ids = self.session.decode_sampled(
            {j.id: j.last for j in jobs}, mode,
            lambda b: slot_values(rows, b, mode, vocab=vocab, masks=masks, biases=biases))
        self.times["decode_step_s"] += time.perf_counter() - t0
        if mode != MASKED:     # a masked step's time holds the masks' (not AdaptiveK's)
            self._step_clock.timed("plain", time.perf_counter() - t0)
        self._count_step(jobs, mode)
        self.counters["masked_steps"] += mode == MASKED
        for job, tok in zip(jobs, ids, strict=True):
            self._advance(job, None, int(tok))

    def _verify(self, jobs: list[Job]) -> None:
        """One verification step for the jobs proposing tokens this turn (Session.
        verify_rows, in the smallest of `verify_widths` that holds the longest proposal):
        each keeps the longest prefix its own sampler accepts and one more token
        (poot.models.speculate.accept: greedy keeps exactly its argmax's tokens; a step
        whose rows are all greedy reads back only those, accept_ids), the
        rejected positions are rolled back, and the tokens go through `_advance` one at a
        time, so EOS, a stop string or max_tokens ends the job there and drops the rest. A
        job whose proposal is empty, or whose context has no room for the widest step,
        has its k cleared and takes the plain step. The jobs proposing by the draft model
        are drafted together first (DraftBatch.propose_rows), each with the draft's
        distributions for the rejection rule."""
        s, clock = self.session, time.perf_counter
        drafts: dict[Job, list[int]] = {}
        qs: dict[Job, list | None] = {}
        by_draft: dict[Job, int] = {}
        widest = self.verify_widths[-1]
        for job in jobs:
            k = min(job.spec.k, job.gen.max_tokens - job.generated - 1)
            # room for the widest step, whatever the others propose: whether a job
            # speculates depends on it alone
            if k > 0 and s.length(job.id) + widest <= s.capacity:
                if job.spec.proposer is self.drafts:
                    if self.drafts.fits(len(job.history), k):
                        by_draft[job] = k
                    continue
                found = job.spec.proposer.propose(job.history, k, job.sampler)[0]
                if found:
                    drafts[job] = found
        if by_draft:
            self.drafts.share_weights(s)
            t0 = clock()
            got = self.drafts.propose_rows({j.id: (j.history, k, j.sampler)
                                            for j, k in by_draft.items()})
            self._step_clock.timed("propose", (clock() - t0) / max(by_draft.values()))
            for job in by_draft:
                drafts[job], qs[job] = got[job.id]
        width = next(w for w in self.verify_widths
                     if w > max(map(len, drafts.values()), default=0))
        for job in jobs:
            if job not in drafts:
                job.spec.k = 0
        if not drafts:
            return
        # a step of greedy rows reads back their argmax ids, where that plan is bound
        sample = "argmax" if mode_for([j.sampler for j in drafts]) == "argmax" and plan_key(
            width, batch_for(s.decode_batches, len(drafts)), "argmax") in s.executors else None
        warm = s.ran(width, len(drafts), scoring(sample))
        t0 = clock()
        rows = s.verify_rows({j.id: [j.last, *d] for j, d in drafts.items()}, width, sample)
        took = clock() - t0
        self.times["verify_step_s"] += took
        if warm:        # a first run may record the plan: not the step's time
            self._step_clock.timed(width, took)
        self._count_step(list(drafts), "verify")
        self.speculation["verify_steps"] += 1
        self.speculation["argmax_verify_steps"] += sample is not None
        for (job, found), got in zip(drafts.items(), rows, strict=True):
            out = accept_ids(got, found) if sample else \
                accept(got, found, qs.get(job), job.sampler, job.history)
            s.rollback(job.id, len(found) + 1 - len(out))
            job.spec.verified(len(found), len(out) - 1)
            self.speculation["proposed"] += len(found)
            self.speculation["accepted"] += len(out) - 1
            for tok in out:
                self._advance(job, None, tok)
                if job not in self._active:
                    break

    def _advance(self, job: Job, logits: np.ndarray | None, tok: int | None = None) -> None:
        """Sample job's next token from `logits` (unless the step already drew it), stream
        its text, and end the job where it ends."""
        entry = None
        if tok is None:
            if job.rule is None:
                tok = job.sampler.sample(logits, job.history)
            else:
                z = job.rule.apply(logits)
                tok = job.sampler.sample(z, job.history)
                entry = job.rule.chosen(z, tok)
        elif job.rule is not None:
            job.rule.drawn(tok)     # drawn in the graph under its bias and mask ("masked")
        job.history.append(tok)
        job.generated += 1
        self.counters["generated_tokens"] += 1
        self.metrics.token(job)
        if tok in self.tokenizer.stop_ids and not job.gen.ignore_eos:
            return self._finish(job, "stop", job.text.flush())
        if entry is not None:
            job.logprobs.append(entry)
        piece = job.text.push(tok)
        if job.text.stopped or (job.rule is not None and job.rule.done):
            return self._finish(job, "stop", piece + job.text.flush())
        if job.generated == job.gen.max_tokens:
            return self._finish(job, "length", piece + job.text.flush())
        if piece:
            self._emit(job, Event("text", text=piece, logprobs=self._sent(job)))
        job.last = tok

    def _finish(self, job: Job, reason: str, piece: str) -> None:
        with self._cv:
            if job in self._active:
                self._leave(job)
        self.counters["finished"] += 1
        if piece:
            self._emit(job, Event("text", text=piece, logprobs=self._sent(job)))
        predicted = None
        if job.gen.prediction is not None:
            sp = job.spec
            predicted = (sp.accepted, sp.proposed - sp.accepted) if sp is not None else (0, 0)
        self._emit(job, Event("done", finish_reason=reason,
                              prompt_tokens=len(job.gen.prompt_ids),
                              completion_tokens=job.generated, cached_tokens=job.cached,
                              logprobs=self._sent(job), predicted=predicted))

    @staticmethod
    def _sent(job: Job) -> tuple:
        """The job's log-probability entries not sent yet, now sent."""
        out, job.logprobs = tuple(job.logprobs), []
        return out

    def _emit(self, job: Job | EmbedJob, event: Event) -> None:
        self._outbox.append((job, event))


def prefill_choice(batches: list[int], widths: dict[int, int], cost: dict[int, float],
                   remaining: list[int]) -> tuple[int, int]:
    """The prefill step of a turn: how many of the prompts waiting (oldest first, each with
    `remaining` tokens to feed) it takes, and their chunk width. It takes those of the
    plan (one per batch size in `batches`, giving `widths[b]` tokens each) that feeds
    prompt tokens fastest at `cost[b]` seconds a step, the smaller plan on a tie. A plan
    not timed yet is costed by its rows at the rate of the timed plan cheapest per row
    (all alike while none is timed), so that a turn prefers plans already made."""
    per_row = min((cost[b] / (b * widths[b]) for b in cost), default=1.0)
    best = None
    for b in batches:
        k, t = min(b, len(remaining)), widths[b]
        if batch_for(batches, k) != b:
            continue     # fewer prompts than this plan's rows: a smaller plan takes them
        fed = sum(min(n, t) for n in remaining[:k])
        rate = fed / cost.get(b, per_row * b * t)
        if best is None or rate > best[0] * (1 + 1e-9):
            best = (rate, k, t)
    return best[1], best[2]


def check_speculate(mode: str | None) -> str | None:
    """The server's speculation mode: None, "lookup", "draft:MODEL" or "self:N"
    (poot.models.speculate.parse refuses anything else)."""
    return None if mode is None else str(parse(mode))


def deliver_here(events: list[tuple[Job, Event]]) -> None:
    for job, event in events:
        job.emit(event)
