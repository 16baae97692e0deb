"""poot.load(MODEL): a checkpoint ready to generate on a backend.

The runner ties the pieces together: the checkpoint plugin opens the file (weights
stay packed and memory-mapped), the Llama builder traces a step, compile fuses it for
the target, the planner lays out its buffers, and a Session (poot.runtime.session)
runs prefill and decode plans that share one weight cache and one KV cache.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from poot.errors import BindError, RequestError


@dataclass
class Stats:
    """Timing of the last generation, and why it ended."""

    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    #: "stop" (an end-of-sequence token or a stop string), "length" (max_tokens), or
    #: "context" (the KV capacity, max_seq, was full before max_tokens); None while running
    finish_reason: str | None = None
    #: speculative decoding: tokens proposed, accepted, and the verification steps
    proposed: int = 0
    accepted: int = 0
    verified: int = 0
    #: the step times speculation chose its proposal lengths by (AdaptiveK.seconds:
    #: "plain", "propose" per token, and each verification width), seconds
    step_seconds: dict = field(default_factory=dict)

    @property
    def acceptance(self) -> float:
        """The share of proposed tokens the target accepted (0 with none proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def __str__(self) -> str:
        out = (f"prefill {self.prompt_tokens} tokens at {self.prefill_tps:.1f} tok/s, "
               f"decode {self.generated_tokens} tokens at {self.decode_tps:.1f} tok/s")
        return out + (f", {self.speculation}" if self.verified else "")

    @property
    def speculation(self) -> str:
        """Acceptance over the verification steps, for a stats line."""
        per = (self.accepted + self.verified) / self.verified if self.verified else 0.0
        return (f"speculation: {self.accepted}/{self.proposed} proposed tokens accepted "
                f"({100 * self.acceptance:.0f}%), {per:.2f} tokens per verification step")


class BindingBar:
    """A progress bar on stderr while a plan binds its buffers (decoding and uploading
    weights), for `poot run`; one bar per plan."""

    def __init__(self):
        self.bar = None

    def __call__(self, done: int, total: int, label: str) -> None:
        import sys

        from poot.optional import require

        tqdm = require("tqdm").tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, desc="binding weights", unit="buf", file=sys.stderr,
                            leave=False, disable=not sys.stderr.isatty())
        self.bar.update(done - self.bar.n)
        if done == total:
            self.bar.close()
            self.bar = None


class Model:
    """A loaded model: tokenizer, config, target, and the sessions that run it."""

    def __init__(self, checkpoint, config, tokenizer, backend, device, *, kv: str = "dense",
                 prefill_tokens: int = 32, progress=None, weights=None,
                 lora: Sequence[tuple[str | None, str]] = (), expert_pool: int | None = None,
                 precision: str = "exact", kv_dtype: str | None = None):
        """`weights` overrides the checkpoint's (a WeightSource with `.arrays`, such as
        `poot.models.llama.random_weights(...)` for a model of a real shape). `lora`: PEFT
        adapters as (name or None, folder), all resident (poot.models.lora); `expert_pool`:
        experts per layer kept on the device (poot.models.expert_pool). `precision` ("exact"
        or "fast") and `kv_dtype` ("f32", "f16", "q8_0"; None: the level's) are refused here,
        in one line, where unknown or where the backend cannot run them (docs/ir.md
        section 15)."""
        from poot.compiler.precision import check
        from poot.models.llama import check_kv_dtype
        from poot.models.weights import CheckpointWeights

        self.checkpoint, self.config, self.tokenizer = checkpoint, config, tokenizer
        self.backend, self.device = backend, device
        self.kv_dtype = check(backend.capabilities(device), precision, kv_dtype)
        check_kv_dtype(self.kv_dtype, config.kv_row)
        self.precision = precision
        at_least_one("prefill_tokens", prefill_tokens)
        # a prefill chunk longer than the KV capacity could never be written into it
        self.kv, self.prefill_tokens = kv, min(prefill_tokens, config.max_seq)
        self.weights = weights if weights is not None else \
            CheckpointWeights(checkpoint, config)
        self.consts: dict[str, np.ndarray] = {}
        self.stats = Stats()
        self.progress = progress
        self._sessions: dict[tuple[str, int], object] = {}
        #: proposers of speculative decoding by their spec (a draft model loads once)
        self._proposers: dict[str, object] = {}
        #: eqns of each step graph made, by (tokens, batch, sampling mode), for progress
        self._eqns: dict[tuple, int] = {}
        self.adapters = self.expert_pool = None
        if lora:
            from poot.models.lora import load_adapters

            self.adapters = load_adapters(list(lora), self.weights, config)
        if expert_pool is not None:
            from poot.models.expert_pool import ExpertPool

            self.expert_pool = ExpertPool(config, self.weights, expert_pool)
            self.prefill_tokens = min(self.prefill_tokens, self.expert_pool.max_tokens)
        #: this process's rank of a tensor-parallel run (poot.parallel.model.TensorParallel)
        self.tp = None
        #: decode steps draw the next token in the graph (poot.models.sample_graph) and read
        #: back only its id; False: they return logits and the host samples
        self.device_sampling = True
        #: the q, k and v projections (the FFN's gate and up) read one weight stacked by
        #: rows (build_decoder's stack_qkv, stack_ffn); a tensor-parallel rank's graph
        #: reads them apart (the sharding does)
        self.stack_qkv = True
        self.stack_ffn = True
        #: prefill chunks take hosted embedding rows (poot.models.hosted_rows), which a
        #: Session stepper fills: images in (poot.models.vision.chat)
        self.hosted_prefill = False

    # -- graphs -----------------------------------------------------------------------
    def step_graph(self, tokens: int, batch: int = 1, kv: str | None = None,
                   logits: str = "all", compiled: bool = True, pool: int | None = None,
                   sample: str | None = None, hosted_rows: bool = False):
        """The traced (and, by default, compiled) graph of one step. `pool` is the paged
        KV pool's size in token slots (shared by every plan of one session); `sample`
        ("argmax" or "full") makes a decode step that samples in the graph; `hosted_rows`
        a step that takes embedding rows from the host (poot.models.hosted_rows; a dense
        one also its spans, tokens that see each other both ways)."""
        import poot
        from poot.compiler import Policy
        from poot.models.llama import build_decoder

        kv = kv or self.kv
        step = build_decoder(self.config, self.weights, tokens=tokens, batch=batch, kv=kv,
                             logits=logits, pool_slots=pool, lora=self.adapters,
                             expert_pool=self.expert_pool, sample=sample,
                             hosted_rows=hosted_rows, spans=hosted_rows and kv == "dense",
                             stack_qkv=self.stack_qkv and self.tp is None,
                             stack_ffn=self.stack_ffn and self.tp is None,
                             kv_dtype=self.kv_dtype)
        self.consts.update(step.consts)
        policy = Policy(precision=self.precision)
        self.consts.update(self.weights.arrays)
        if self.tp is None:
            return poot.compile(step.graph, (self.backend, self.device),
                                policy=policy).graph if compiled else step.graph
        # a rank's graph: compiled, it stays a compile result, whose table (declaring the
        # collectives over the rank's communicator) the planner checks them against
        graph = self.tp.rank_graph(step)
        return poot.compile(graph, (self.backend, self.device), policy=policy,
                            communicator=self.tp.communicator) if compiled else graph

    @property
    def bound_consts(self):
        """The const arrays the plans bind: the checkpoint's, or views of this rank's part."""
        return self.consts if self.tp is None else self.tp.consts(self.consts)

    def session(self, kv: str | None = None, batch: int = 1, *, pool: int | None = None,
                decode_batches: Sequence[int] = (), prefill_batches: Sequence[int] = ()):
        """The Session for this KV form and batch (planned lazily, cached). `pool` is the
        paged pool's size in token slots (default: room for `batch` whole sequences);
        `decode_batches` and `prefill_batches` add plans of these batch sizes."""
        from poot.models.sample_graph import slot_values
        from poot.runtime.session import SCORE, Session

        kv = kv or self.kv
        pool = pool or self.config.max_seq * batch
        key = (kv, batch, pool, tuple(sorted(decode_batches)), tuple(sorted(prefill_batches)))
        if key not in self._sessions:
            session = Session(
                lambda t, b: self._timed_graph(t, b, kv, pool), self.bound_consts, kv=kv,
                capacity=self.config.max_seq, batch=batch, prefill_tokens=self.prefill_tokens,
                pool_slots=pool, target=(self.backend, self.device),
                decode_batches=decode_batches, prefill_batches=prefill_batches,
                runtime=None if self.tp is None else self.tp.runtime,
                make_sampled=lambda b, mode: self._timed_graph(1, b, kv, pool, mode),
                padding_draws=lambda b, mode: slot_values([], b, mode,
                                                          vocab=self.config.vocab),
                make_scoring=lambda t, b, mode=SCORE: self._timed_graph(t, b, kv, pool, mode))
            if self.progress:
                session.progress = BindingBar()
                session.planned = self._planned
            self._fit_features(session)
            self._sessions[key] = session
        return self._sessions[key]

    def _fit_features(self, session) -> None:
        """Give a new session the per-sequence adapter slot, M-RoPE's shift and the expert
        pager."""
        if self.adapters is not None:
            from poot.models.lora import SLOT

            session.row_slots[SLOT] = {}
        if self.config.mrope is not None:
            from poot.models.mrope import SHIFT

            session.row_slots[SHIFT] = {}
        if self.expert_pool is not None:
            from poot.models.expert_pool import ExpertPager

            most = self.expert_pool.max_tokens
            prefill = session.prefill_batches[-1] * session.prefill_tokens
            if session.batch > most or prefill > most:
                raise BindError(f"an expert pool of {self.expert_pool.rows} rows serves steps "
                                f"of at most {most} tokens ({self.config.experts_used} "
                                f"experts each); asked for decode steps of {session.batch} "
                                f"sequences and prefill steps of {prefill} tokens (a batch "
                                f"of {session.prefill_batches[-1]} prompts)")
            session.stepper = ExpertPager(self.expert_pool)

    def adapter_rows(self, adapter: str | None) -> dict:
        """The per-sequence slot values that select `adapter` (None: no adapter)."""
        if self.adapters is None:
            if adapter is not None:
                from poot.errors import ConfigError

                raise ConfigError(f"no LoRA adapter is loaded, so {adapter!r} cannot be used",
                                  key="lora", value=adapter)
            return {}
        from poot.models.lora import SLOT

        return {SLOT: self.adapters.lookup(adapter)}

    def prepare(self, session, prompt_tokens: int, sample: str | None = None,
                speculate=None, draft_tokens: int | None = None) -> None:
        """Plan and bind the prefill and decode steps before any timing starts (`sample`:
        the decode step that samples in the graph, in that mode); with `speculate` (as
        generate's), the verification steps and the draft model's steps too."""
        if prompt_tokens > 1:
            session.executor(self.prefill_tokens, 1)
        mode = sample if self.device_sampling else None
        session.executor(1, session.batch, mode)
        if speculate is None:
            return
        from poot.models import speculate as spec
        from poot.runtime.session import scoring

        for w in spec.widths(draft_tokens or spec.DRAFT_TOKENS):
            session.executor(w, 1, scoring(spec.verify_sample(mode)))
        draft = getattr(self.proposer(speculate), "model", None)
        if draft is not None:       # a greedy draft decodes with the argmax in the graph
            draft.prepare(draft.session(), prompt_tokens, mode)
            draft.session().executor(1, 1)      # else it reads its logits on the host

    def proposer(self, speculate):
        """The proposer of speculative decoding `speculate` names ("lookup", "draft:MODEL",
        "self:N", or a parsed poot.models.speculate.Spec), made once per model."""
        from poot.models import speculate as spec

        key = str(speculate)
        if key not in self._proposers:
            if self.tp is not None:
                raise BindError("speculative decoding runs on one rank; drop --tp")
            parsed = spec.parse(key)
            spec.check_rollback(self.config, self.kv)
            if parsed.kind == "lookup":
                self._proposers[key] = spec.PromptLookup()
            else:
                draft = self.self_draft(parsed.arg) if parsed.kind == "self" else \
                    self.draft_model(parsed.arg)
                spec.check_rollback(draft.config, draft.kv)
                self._proposers[key] = spec.DraftModel(draft, self.config)
        return self._proposers[key]

    def self_draft(self, layers: int) -> Model:
        """The first `layers` layers of this model and its head as a Model of their own,
        reading this model's weights (self-speculation's draft)."""
        from poot.models.speculate import check_self_draft

        check_self_draft(self.config, layers)
        return Model(self.checkpoint, replace(self.config, layers=layers), self.tokenizer,
                     self.backend, self.device, kv=self.kv, prefill_tokens=self.prefill_tokens,
                     weights=self.weights, precision=self.precision, kv_dtype=self.kv_dtype)

    def draft_model(self, name: str) -> Model:
        """Another model as a draft: loaded on this backend with this context, refused
        unless its tokenizer is this model's."""
        from poot.models.speculate import check_shared_tokenizer

        draft = load(name, self.backend.name, max_seq=self.config.max_seq, kv=self.kv,
                     prefill_tokens=self.prefill_tokens, precision=self.precision)
        check_shared_tokenizer(self.tokenizer, draft.tokenizer, name,
                               self.checkpoint.path.name)
        return draft

    def sample_mode(self, samplers) -> str | None:
        """The in-graph sampling mode decode steps use for these samplers (None: the
        host samples)."""
        from poot.models.sample_graph import mode_for

        return mode_for(samplers) if self.device_sampling else None

    def _timed_graph(self, tokens: int, batch: int, kv: str, pool: int,
                     sample: str | None = None):
        """The graph of a session's plan; `sample` a sampling mode, or SCORE: every row's
        logits (a verification step)."""
        from poot.runtime.session import SCORE

        # a session reads one row of a prefill chunk: the head runs on that row only (a
        # rank's graph keeps every row: the sharding pass knows no gathered activations);
        # a verification step (SCORE, or its argmax) runs it on every row
        logits = "rows" if tokens > 1 and self.tp is None and sample is None else "all"
        g = self.step_graph(tokens, batch, kv, pool=pool, logits=logits,
                            sample=None if sample == SCORE else sample,
                            hosted_rows=self.hosted_prefill and tokens > 1 and sample is None)
        # a rank's step is a compile result
        self._eqns[(tokens, batch, sample)] = len(getattr(g, "graph", g).eqns())
        return g

    def _planned(self, key: tuple, seconds: float) -> None:
        """Session.planned: one progress line per plan, timed from its graph to its bound
        buffers (the kernels' source printed and built included)."""
        from poot.runtime.session import SCORE

        tokens, batch, sample = (*key, None)[:3]
        how = ", every row's logits" if sample == SCORE else \
            ", every row's argmax" if sample and tokens > 1 else \
            f", sampling ({sample})" if sample else ""
        eqns = self._eqns.get((tokens, batch, sample))
        size = f" ({eqns} eqns)" if eqns is not None else ""
        self.progress(f"compiled a {tokens}-token x {batch} step{how}{size} in {seconds:.2f} s")

    def _next_tokens(self, session, last: dict, rows: dict, mode: str | None) -> dict:
        """The next token of each sequence in `last` (seq -> the token it feeds now), from
        one decode step: sampled in the graph in `mode`, else on the host from the logits.
        `rows` is seq -> (sampler, history including the fed token)."""
        from poot.models.sample_graph import slot_values

        if mode is None:
            logits = session.decode(last)
            return {s: rows[s][0].sample(logits[s], rows[s][1]) for s in last}
        order = [rows[s] for s in last]
        ids = session.decode_sampled(last, mode, lambda b: slot_values(order, b, mode))
        return {s: int(t) for s, t in zip(last, ids, strict=True)}

    # -- the Python API ------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def prefill_logits(self, token_ids: Sequence[int], adapter: str | None = None,
                       hosted: Mapping[int, np.ndarray] | None = None,
                       spans: Mapping[int, int] | None = None,
                       positions: np.ndarray | None = None) -> np.ndarray:
        """Logits [T, vocab] (float32) of a prompt run from an empty cache in one step,
        through the loaded LoRA adapter `adapter` if given. `hosted` maps prompt positions
        to embedding rows [dim] that replace those positions' token embeddings
        (poot.models.hosted_rows); `spans` maps hosted positions to span ids (tokens of one
        span, an image's, see each other both ways); `positions` [3, T] are an M-RoPE
        model's positions of an image prompt (poot.models.mrope; None: the tokens' own)."""
        from poot.models import hosted_rows
        from poot.plan import plan
        from poot.runtime.executor import Executor

        ids = np.asarray(token_ids, np.int32).reshape(-1)
        if not 0 < len(ids) <= self.config.max_seq:
            raise BindError(f"prefill takes 1 to {self.config.max_seq} tokens, got {len(ids)}")
        if self.expert_pool is not None:
            raise BindError("prefill_logits runs a whole prompt in one step, more than an "
                            "expert pool may hold; use a session (or generate)")
        rows = {k: [v] for k, v in self.adapter_rows(adapter).items()}
        g = self.step_graph(len(ids), 1, "dense", hosted_rows=bool(hosted))
        ex = Executor(plan(g, (self.backend, self.device)), self.bound_consts,
                      runtime=None if self.tp is None else self.tp.runtime)
        slots = {"tokens": ids, "pos": [0], **rows,
                 **({"end": [len(ids)]} if "end" in ex.slots else {})}
        if hosted:
            slots.update(hosted_rows.slot_values(hosted, len(ids), self.config.dim))
            slots.update(hosted_rows.span_values(spans or {}, len(ids)))
        if self.config.mrope is not None:
            from poot.models import mrope

            slots[mrope.SHIFT] = [0]
            if hosted:
                slots[mrope.POS] = np.broadcast_to(np.arange(len(ids)), (3, len(ids))) \
                    if positions is None else positions
        return np.asarray(ex.step(slots).result, np.float32)

    def prompt_ids(self, prompt, chat: bool | None = None, system: str | None = None) -> list[int]:
        """The token ids `generate` feeds for `prompt`: a string (raw text, or with `chat`
        the user's message through the model's chat template), token ids (as they are),
        or a list of chat messages ({"role", "content"} dicts, always through the
        template). `system` adds a system message first (and implies `chat`)."""
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("the prompt is empty")
            if chat is False and system is not None:
                raise RequestError("a system prompt needs the chat template (chat=True or "
                                   "a list of messages)")
            if not (chat or system is not None):
                return self.tokenize(prompt)
            prompt = [{"role": "user", "content": prompt}]
        elif not isinstance(prompt, Sequence) or not prompt:
            raise RequestError(f"the prompt must be a non-empty string, list of token ids "
                               f"or list of chat messages, got {type(prompt).__name__} "
                               f"{prompt!r:.60}")
        elif all(isinstance(m, Mapping) for m in prompt):
            if chat is False:
                raise RequestError("chat messages go through the chat template; drop "
                                   "chat=False")
        else:
            return self._checked_ids(prompt, system)
        from poot.errors import ChatTemplateError
        from poot.models.chat import chat_ids

        msgs = ([{"role": "system", "content": system}] if system is not None else []) + \
            [dict(m) for m in prompt]
        try:
            return chat_ids(self.tokenizer, msgs)
        except ChatTemplateError as exc:
            raise RequestError(str(exc)) from exc

    def _checked_ids(self, ids: Sequence, system) -> list[int]:
        if system is not None:
            raise RequestError("a system prompt needs the chat template; token ids are fed "
                               "as they are")
        vocab = self.config.vocab
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, (int, np.integer))
                    or not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"token ids must be whole numbers in [0, {vocab}), got {bad!r}")
        return [int(t) for t in ids]

    def generate(self, prompt: str | Sequence[int] | Sequence[Mapping[str, str]], *,
                 max_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int | None = None,
                 stop: Sequence[str] = (), chat: bool | None = None, system: str | None = None,
                 adapter: str | None = None, stream: bool = False, speculate=None,
                 draft_tokens: int | None = None) -> str | Iterator[str]:
        """The continuation of `prompt` as text: it stops at the end-of-sequence token, a
        stop string, `max_tokens`, or the end of the context (`max_seq` of `load`), and
        `self.stats` says which (`finish_reason`) with the timing.

        `prompt` is a string (raw text; with `chat=True` the user's message, through the
        model's chat template), token ids, or a list of chat messages such as
        `[{"role": "user", "content": "Hi"}]` (through the template; `system` puts a
        system prompt first). Greedy by default; `temperature` > 0 samples with `top_k`,
        `top_p`, `repetition_penalty` and `seed` (same seed and settings: the same text on
        every backend). `adapter` names a loaded LoRA adapter. With `stream=True` it
        returns an iterator of text pieces as they are decoded instead. `speculate`
        ("lookup", "draft:MODEL" or "self:N"; poot.models.speculate) proposes up to
        `draft_tokens` tokens (default 7) per step and verifies them in one step: greedy
        text is the same as without it, sampled text follows the same distribution (not
        the same text for a seed); `self.stats` counts the accepted tokens. Arguments are
        checked before anything runs (a RequestError or SamplingError)."""
        from poot.models import speculate as spec
        from poot.models.sampling import Sampler

        at_least_one("max_tokens", max_tokens)
        if speculate is not None:
            spec.parse(str(speculate))
            draft_tokens = spec.check_draft_tokens(draft_tokens or spec.DRAFT_TOKENS)
        stop = checked_stops(stop)
        ids = self.prompt_ids(prompt, chat, system)
        room = self.config.max_seq - len(ids)
        if room <= 0:
            raise BindError(f"the prompt has {len(ids)} tokens; this model was loaded with "
                            f"room for {self.config.max_seq} (load with a larger max_seq)")
        sampler = Sampler(temperature, top_k, top_p, repetition_penalty, seed)
        rows = self.adapter_rows(adapter)
        pieces = self._pieces(ids, min(max_tokens, room), max_tokens > room, sampler, rows,
                              tuple(stop), speculate, draft_tokens)
        return pieces if stream else "".join(pieces)

    def _pieces(self, ids: list[int], max_tokens: int, cut: bool, sampler, rows: dict,
                stop: tuple[str, ...], speculate=None, draft_tokens=None) -> Iterator[str]:
        """generate's text pieces; `cut`: max_tokens was lowered to the room in the context."""
        from poot.models.text_stream import TextStream

        mode = self.sample_mode([sampler])
        session = self.session()
        self.prepare(session, len(ids), mode, speculate, draft_tokens)
        seq = object()
        session.open(seq, rows)
        self.stats = stats = Stats(prompt_tokens=len(ids))
        stream = TextStream(self.tokenizer, stop)
        following = None
        propose = None if speculate is None else self.proposer(speculate)
        try:
            t0 = time.perf_counter()
            logits = session.prefill(seq, ids)
            if propose is not None:         # a draft model reads the prompt too
                propose.start(ids)
            stats.prefill_seconds = time.perf_counter() - t0
            history = list(ids)
            t0 = time.perf_counter()
            tok = sampler.sample(logits, history)    # the first from the prompt's logits
            if speculate is None:
                following = self._following(session, seq, tok, sampler, history, mode,
                                            max_tokens - 1)
            else:
                from poot.models import speculate as spec

                following = spec.tokens(self, session, seq, tok, sampler, history, mode,
                                        max_tokens - 1, propose, draft_tokens, stats)
            for i in range(max_tokens):
                history.append(tok)
                stats.generated_tokens += 1
                if tok in self.tokenizer.stop_ids:
                    stats.finish_reason = "stop"
                    break
                piece = stream.push(tok)
                if piece:
                    yield piece
                if stream.stopped:
                    stats.finish_reason = "stop"
                    break
                if i + 1 < max_tokens:
                    tok = next(following)
            else:
                stats.finish_reason = "context" if cut else "length"
            tail = stream.flush()       # what was held back; nothing after a stop string
            if tail:
                yield tail
            stats.decode_seconds = time.perf_counter() - t0
        finally:
            if following is not None:
                following.close()       # a step still in flight is waited for
            if propose is not None:
                propose.close()
            session.close(seq)

    def _following(self, session, seq, tok: int, sampler, history: list, mode: str | None,
                   count: int) -> Iterator[int]:
        """The `count` tokens after `tok` of one sequence; `history` is the caller's, which
        it extends by each token before asking for the next. Greedy decoding keeps a step
        queued ahead (Session.greedy) where the session can queue steps: one rank of one
        process, no stepper."""
        if mode == "argmax" and session.stepper is None and self.tp is None:
            yield from session.greedy(seq, tok, count)
            return
        for _ in range(count):
            tok = self._next_tokens(session, {seq: tok}, {seq: (sampler, history)}, mode)[seq]
            yield tok

    def generate_many(self, prompts: Sequence[str], *, max_tokens: int = 32,
                      chat: bool = False, **sampling) -> list[str]:
        """Several prompts at once: each prefilled alone, then decoded together, one
        token per sequence per step, sharing one paged KV pool."""
        from poot.models.sampling import Sampler

        at_least_one("max_tokens", max_tokens)
        session = self.session("paged", batch=len(prompts))
        seqs = list(range(len(prompts)))
        ids = [self.prompt_ids(p, chat) for p in prompts]
        samplers = [Sampler(**sampling) for _ in prompts]
        mode = self.sample_mode(samplers)
        out = [[] for _ in prompts]
        picked = {}
        for s in seqs:
            session.open(s)
        try:
            for s in seqs:
                picked[s] = samplers[s].sample(session.prefill(s, ids[s]), ids[s])
            live = set(seqs)
            for step in range(max_tokens):
                nxt = {}
                for s in sorted(live):
                    if picked[s] in self.tokenizer.stop_ids:
                        live.discard(s)
                        continue
                    out[s].append(picked[s])
                    nxt[s] = picked[s]
                if not nxt or step + 1 == max_tokens:
                    break
                rows = {s: (samplers[s], ids[s] + out[s]) for s in nxt}
                picked.update(self._next_tokens(session, nxt, rows, mode))
        finally:
            for s in seqs:
                session.close(s)
        return [self.tokenizer.decode(o) for o in out]


def at_least_one(name: str, value) -> None:
    """Refuse a count (max_tokens, max_seq) below 1 with a RequestError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"{name} must be a whole number of at least 1, got {value!r}")


def checked_stops(stop) -> tuple[str, ...]:
    """Stop strings as `generate` takes them: one string or a sequence of non-empty ones
    (an empty one would match nowhere); a RequestError otherwise."""
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, Sequence) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(f"stop must be a non-empty string or a list of them, got "
                           f"{stop!r:.60}")
    return tuple(stops)


#: GGUF keys that only the tokenizer reads
VOCAB_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
              "tokenizer.ggml.scores")


def load(model: str | os.PathLike, backend: str | None = None, *, max_seq: int = 1024,
         kv: str = "dense", prefill_tokens: int = 32,
         progress: Callable[[str], None] | None = None, lora: Sequence = (),
         expert_pool: int | None = None, precision: str = "exact",
         kv_dtype: str | None = None) -> Model:
    """Open `model` for generating: a known name ("smollm2", "gemma3-270m"; pulled into
    $POOT_CACHE/models on first use), a .gguf file or a Hugging Face folder.

    `backend` names one ("cpu", "cuda", ... as `poot backends` lists them); None picks
    the best available: the highest-priority backend with a hardware device (a GPU's,
    else the compiled cpu backend), the numpy reference backend where none has one.
    `max_seq` is the KV capacity in positions (prompt and answer together); `kv` the
    cache's form ("dense", or "paged" for batches of sequences); `prefill_tokens` the
    prompt tokens fed per prefill step; `progress` hears one line per stage (compiled
    plans); `lora` lists PEFT adapter folders, each a path or (name, path); `expert_pool`
    keeps that many MoE experts per layer on the device (all of them when None).
    `precision` ("exact", the default, or "fast") and `kv_dtype` ("f32", "f16" or "q8_0";
    None: f32 for exact, f16 for fast) say how contractions read their activations and how
    the KV cache holds its rows (docs/ir.md section 15); an unknown one, or one the backend
    cannot run, is a one-line PrecisionError before anything is loaded.

        model = poot.load("smollm2")
        print(model.generate("The capital of France is", max_tokens=8))
    """
    from poot.compiler.precision import check as check_precision
    from poot.errors import ConfigError
    from poot.models.loader import open_model
    from poot.models.shapes import check_memory
    from poot.models.tokenizer import Tokenizer
    from poot.plugin import select_backend

    if kv not in ("dense", "paged"):
        raise RequestError(f"kv must be 'dense' or 'paged', got {kv!r}")
    at_least_one("prefill_tokens", prefill_tokens)
    if expert_pool is not None:
        at_least_one("expert_pool", expert_pool)
    b, dev = select_backend(backend)        # an unknown backend is refused before loading
    kv_dtype = check_precision(b.capabilities(dev), precision, kv_dtype)
    at_least_one("max_seq", max_seq)
    ckpt, config = open_model(model, max_seq=max_seq)
    if ckpt.kind == "gguf":
        tok = Tokenizer.from_gguf_metadata(ckpt.metadata, str(ckpt.path))
        # the vocabulary lives on in the tokenizer: ~100k Python strings not held twice
        for key in VOCAB_KEYS:
            ckpt.metadata.pop(key, None)
    else:
        tok = Tokenizer.from_hf_folder(ckpt.path)
    if tok.vocab_size > config.vocab:
        raise ConfigError(f"{ckpt.path}: the tokenizer has {tok.vocab_size} tokens but the "
                          f"embedding only {config.vocab} rows", file=str(ckpt.path),
                          key="vocab", value=config.vocab)
    config = replace(config, max_seq=min(config.max_seq, max_seq))
    check_memory(config)
    adapters = [x if isinstance(x, tuple) else (None, x) for x in lora]
    return Model(ckpt, config, tok, b, dev, kv=kv, prefill_tokens=prefill_tokens,
                 progress=progress, lora=adapters, expert_pool=expert_pool,
                 precision=precision, kv_dtype=kv_dtype)
