"""The step API of the model runner: prefill prompts, decode one token per sequence.

A `Session` drives plans of one graph builder, `make_graph(tokens, batch) -> Graph` (or an
object with `.graph`: `poot.models.llama.build_decoder(...)`'s Step, or a `poot.compile`
result). It plans each shape it needs once: a prefill plan for chunks of `prefill_tokens`
tokens of one sequence, a decode plan for one token of up to `batch` sequences, and with
paged KV one more per size in `decode_batches` and `prefill_batches` (a step of n sequences
runs the smallest plan that holds n, so a server's batch that shrinks and grows pays for
the rows it has); each graph is compiled for the target first, unless compile=False. All
its executors share one WeightCache (each weight is uploaded once, whichever plan bound it
first) and one StateStore (state buffers by state name: the prefill and decode plans read
and write the same KV buffers), so a prefill followed by decode steps is one continuous
cache.

The builder's interface is the Llama builder's (poot.models.llama.build_decoder):
- slots "tokens" ([T] dense, [B, T] paged) and "pos" ([1] dense, [B, 1] paged), and for
  paged KV "write_map" [B*T] and "slot_map" [B, capacity]; a dense graph may also take
  "end" [1], one past its last real token;
- the result holds logits for every token, [B*T, vocab]; or, for a graph with slot "last"
  (Pos [B]: the row of each sequence's last real token in the step), one row per
  sequence, [B, vocab] (build_decoder's logits="rows": the head skips the padding).
A graph may also take per-sequence slots of owner-defined roles, one value per batch row
(`row_slots`: the LoRA adapter index), and a model may run each step through a `stepper`
(the expert pool pages experts in and re-runs the step until they are resident).
A decode step that samples in the graph (`make_sampled(batch, mode)`) takes the sampler's
slots besides these; their owner is the model's sampler, not the session: each step's
values come from the caller (`draws`), and those of padding rows from `padding_draws`.
An "argmax" step samples greedily and takes no sampler slot.
Speculative decoding scores several proposed tokens of one sequence in one step (`verify`,
through a plan of `make_scoring(tokens, batch)`, whose head runs on every token: the
prefill step with logits for all rows) and drops the positions of the rejected ones
(`rollback`: the dense length, or the paged sequence's last blocks). A greedy verification
(`sample="argmax"`) runs the scoring plan with the argmax in the graph (`make_scoring(tokens,
batch, "argmax")`, keyed (tokens, batch, "argmax") as a decode step that samples is) and
reads back each row's next token id, not its logits.
Dense KV holds one sequence; paged KV holds as many as its pool has blocks for. With the
allocator's prefix cache on (`blocks.use_prefix_cache`), `reuse` starts a paged sequence
with the cached blocks of its prompt, and each paged step registers the full blocks it
completed (poot.runtime.kv).
`runtime` (optional) is the runtime the first plan binds to, and through the shared weight
cache every later one: a tensor-parallel rank's, whose communicator runs the collectives.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from poot.errors import BindError, CapacityError
from poot.ir.graph import Graph
from poot.plan import plan
from poot.runtime.executor import Executor, StateStore
from poot.runtime.kv import BlockAllocator, DenseCache
from poot.runtime.weights import WeightCache

#: the slot of a step whose head runs on each sequence's last real token only
LAST = "last"
#: the plan variant (Session.executor's `sample`) whose head runs on every token
SCORE = "score"


def batch_for(batches: Sequence[int], n: int) -> int:
    """The plan batch size a step of n sequences runs in: the smallest of `batches` (sorted)
    that holds them."""
    return next(b for b in batches if b >= n)


def plan_key(tokens: int, batch: int, sample: str | None = None) -> tuple:
    """How `Session.executors` keys the plan of (tokens, batch) and its sampling mode."""
    return (tokens, batch) if sample is None else (tokens, batch, sample)


class Session:
    def __init__(self, make_graph: Callable[[int, int], object], consts: Mapping, *,
                 kv: str = "paged", capacity: int, batch: int = 1, prefill_tokens: int = 16,
                 pool_slots: int | None = None, block: int = 16, target=None,
                 compile: bool = True, decode_batches: Sequence[int] = (),
                 prefill_batches: Sequence[int] = (), runtime=None,
                 make_sampled: Callable[[int, str], object] | None = None,
                 padding_draws: Callable[[int, str], Mapping] | None = None,
                 make_scoring: Callable[[int, int], object] | None = None):
        if kv not in ("dense", "paged"):
            raise BindError(f"kv must be 'dense' or 'paged', not {kv!r}")
        if kv == "dense" and batch != 1:
            raise BindError("a dense KV cache holds one sequence: use batch=1 or kv='paged'")
        self.make_graph, self.consts, self.kv, self.target = make_graph, consts, kv, target
        #: `make_sampled(batch, mode)`: a decode step that samples in the graph
        #: (poot.models.llama.build_decoder's `sample`); None: the host samples
        self.make_sampled = make_sampled
        #: `padding_draws(batch, mode)`: the sampler slots of a sampled step of `batch`
        #: padding rows (poot.models.sample_graph.slot_values([], batch, mode))
        self.padding_draws = padding_draws
        #: `make_scoring(tokens, batch)`: a step whose head runs on every token, logits
        #: [B*T, vocab] (None: make_graph's steps already do); `make_scoring(tokens, batch,
        #: "argmax")`: the same step taking each row's argmax in the graph, ids [B*T]
        self.make_scoring = make_scoring
        self.compile = compile
        self.capacity, self.batch, self.prefill_tokens = capacity, batch, prefill_tokens
        if any(not 0 < b <= batch for b in (*decode_batches, *prefill_batches)):
            raise BindError(f"decode and prefill batch sizes {list(decode_batches)}, "
                            f"{list(prefill_batches)} must lie in 1..{batch}")
        #: batch sizes of the decode plans, smallest first (the last is `batch`)
        self.decode_batches = sorted({*decode_batches, batch})
        #: batch sizes of the prefill plans (prefill_rows), smallest first
        self.prefill_batches = sorted({*prefill_batches, 1})
        self.runtime = runtime          # the runtime its first plan binds to (None: the target's)
        self.weights: WeightCache | None = None
        self.state: StateStore | None = None
        #: (tokens, batch), or (tokens, batch, mode) for a plan that samples -> executor
        self.executors: dict[tuple, Executor] = {}
        #: called as `progress(done, total, label)` while a new plan binds its buffers
        self.progress = None
        #: called as `planned(key, seconds)` once a new plan is ready: its graph built and
        #: compiled, planned, its kernels printed and built, its buffers bound
        self.planned: Callable[[tuple, float], None] | None = None
        #: per-sequence slots of owner-defined roles (e.g. the LoRA adapter index), one value
        #: per batch row: slot name -> {sequence: value}; a padding row or a sequence not
        #: listed gets 0. The model declares the names; `open(seq, rows=...)` sets values.
        self.row_slots: dict[str, dict] = {}
        #: runs one step: `stepper(executor, slots, real)` -> StepResult, `real` [B*T] bool
        #: marking the tokens that are not padding (the expert pool pages experts in
        #: around the step); None runs `executor.step(slots)`
        self.stepper = None
        if kv == "paged":
            self.blocks = BlockAllocator(pool_slots or capacity * batch, block, capacity)
        else:
            self.dense = DenseCache(capacity)
            self.dense_seq = None

    # -- plans ----------------------------------------------------------------------
    def executor(self, tokens: int, batch: int, sample: str | None = None) -> Executor:
        """The executor of the (tokens, batch) plan, planned and bound on first use; with
        `sample` ("argmax" or "full"), of the decode plan that samples in the graph; with
        SCORE, of the step whose head runs on every token (make_scoring); with "argmax" and
        more than one token, of that step taking every row's argmax in the graph."""
        ex = self.executors.get(plan_key(tokens, batch, sample))
        if ex is None:
            t0 = time.perf_counter()
            made = self.prepare(tokens, batch, sample)
            ex = self.bind(plan_key(tokens, batch, sample), made, time.perf_counter() - t0)
        return ex

    def prepare(self, tokens: int, batch: int, sample: str | None = None):
        """The plan `executor` binds, made but not bound: graph built, compiled and
        planned, and where the runtime has a `prepare` (the cpu's: the plan's library
        built into the kernel cache) that done too. It changes nothing of the session, so
        another thread may prepare a plan while this one steps."""
        if sample is None:
            made = self.make_graph(tokens, batch)
        elif sample == SCORE:
            made = (self.make_scoring or self.make_graph)(tokens, batch)
        elif tokens > 1 and sample == "argmax" and self.make_scoring is not None:
            made = self.make_scoring(tokens, batch, sample)
        elif self.make_sampled is None or tokens != 1:
            raise BindError(f"this session samples on the host: it has no {tokens}-token "
                            f"step that samples in the graph")
        else:
            made = self.make_sampled(batch, sample)
        planned = plan(self._plannable(made), self.target)
        runtime = self.weights.runtime if self.weights is not None else None
        if getattr(runtime, "prepare", None) is not None:
            runtime.prepare(planned)
        return planned

    def bind(self, key: tuple, planned, seconds: float = 0.0) -> Executor:
        """The executor of a `prepare`d plan under `key` (plan_key), its buffers bound
        (the session's weights and state shared); `seconds` its preparation's, for
        `planned`. A key already bound keeps its executor."""
        if key in self.executors:
            return self.executors[key]
        t0 = time.perf_counter()
        ex = Executor(planned, self.consts, weights=self.weights, state=self.state,
                      runtime=self.runtime if self.weights is None else None)
        self.weights, self.state = ex.weights, ex.state
        self.executors[key] = ex
        if self.planned is not None:
            self.planned(key, seconds + time.perf_counter() - t0)
        return ex

    def _plannable(self, made):
        """What the builder made, ready for the planner: a compile result as it is, a
        traced graph (or a Step's) compiled for the target first. A graph that already
        holds compiler-only ops was compiled by the builder and is planned as it is."""
        if not isinstance(made, Graph) and hasattr(made, "backend"):
            return made
        graph = made if isinstance(made, Graph) else made.graph
        if not self.compile or any(e.op.compiler_only for e in graph.eqns()):
            return graph
        from poot.compiler import compile as compile_graph

        return compile_graph(graph, self.target)

    # -- sequences --------------------------------------------------------------------
    def open(self, seq, rows: Mapping | None = None, key: str = "") -> None:
        """Open a sequence; `rows` gives its values of the per-sequence `row_slots`, `key`
        (paged) what besides its tokens and those values makes its KV rows: sequences
        share cached blocks only where both agree."""
        for name in rows or {}:
            if name not in self.row_slots:
                raise BindError(f"this session has no per-sequence slot {name!r}; it has: "
                                f"{', '.join(self.row_slots) or 'none'}")
        for name, value in (rows or {}).items():
            self.row_slots[name][seq] = value
        if self.kv == "paged":
            self.blocks.open(seq, _cache_key(rows, key))
            return
        if self.dense_seq is not None:
            raise CapacityError(f"the dense KV cache holds sequence {self.dense_seq!r}; close "
                                f"it first or use kv='paged'")
        self.dense_seq = seq
        self.dense.reset()

    def close(self, seq, tokens=None) -> None:
        """Close a sequence; `tokens` (paged: its ids so far, where every step that fed
        them ran) lets the prefix cache keep its full blocks (BlockAllocator.close)."""
        for table in self.row_slots.values():
            table.pop(seq, None)
        if self.kv == "paged":
            self.blocks.close(seq, tokens)
        elif seq == self.dense_seq:
            self.dense_seq = None
        else:
            raise CapacityError(f"sequence {seq!r} is not open")

    def reusable(self, tokens, rows: Mapping | None = None, key: str = "") -> tuple[int, int]:
        """For a prompt to open with these `rows` and `key` (see open): the cached blocks
        `reuse` would give it, and how many of them no sequence holds now."""
        if self.kv != "paged":
            return 0, 0
        return self.blocks.reusable(_cache_key(rows, key), tokens)

    def reuse(self, seq, tokens) -> int:
        """Start a new paged sequence with the cached blocks of its prompt `tokens`
        (BlockAllocator.reuse); returns the positions it holds: feed the rest."""
        if self.kv != "paged":
            return 0
        return self.blocks.reuse(seq, tokens)

    def length(self, seq) -> int:
        if self.kv == "paged":
            return self.blocks.length(seq)
        self._dense_check(seq)
        return self.dense.length

    # -- steps ------------------------------------------------------------------------
    def prefill(self, seq, tokens) -> np.ndarray:
        """Feed a prompt to an open sequence; returns the logits after its last token.

        Chunks of `prefill_tokens` go through the prefill plan (the last one padded); a
        tail that would pass the capacity in a whole chunk goes through the decode plan.
        """
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        self._check_fits(seq, len(tokens))
        t = self.prefill_tokens
        logits = None
        i = 0
        while i < len(tokens):
            n = min(t, len(tokens) - i)
            if self.length(seq) + t > self.capacity or n == 1:
                logits = self.decode({seq: int(tokens[i])})[seq]
                i += 1
                continue
            logits = self._chunk(seq, tokens[i: i + n], t)
            i += n
        if logits is None:
            raise BindError("prefill needs at least one token")
        return logits

    def decode(self, tokens: Mapping) -> dict:
        """One token for each given sequence (at most `batch`); returns logits by sequence."""
        return dict(zip(tokens, self.decode_rows(tokens)))

    def decode_rows(self, tokens: Mapping) -> np.ndarray:
        """decode's logits as one array [len(tokens), vocab], rows in the order of tokens."""
        return self._decode(tokens, None, None)

    def decode_sampled(self, tokens: Mapping, mode: str,
                       draws: Callable[[int], Mapping]) -> np.ndarray:
        """One token for each given sequence through the decode plan that samples in the
        graph (`mode`: "argmax" or "full"); `draws(b)` gives the sampler slots of a step of
        b rows (poot.models.sample_graph.slot_values). Returns the next token id of each
        sequence [len(tokens)], in the order of tokens: the step reads back nothing else."""
        return self._decode(tokens, mode, draws)

    def _decode(self, tokens: Mapping, sample: str | None, draws) -> np.ndarray:
        if not 0 < len(tokens) <= self.batch:
            raise BindError(f"decode takes 1 to {self.batch} sequences, got {len(tokens)}")
        if self.kv == "dense":
            (seq,) = tokens
            self._dense_check(seq)
            ex = self.executor(1, 1, sample)
            extra = dict(draws(1)) if draws else {}
            pos = self.dense.reserve(1)
            out = self._run(ex, {**_dense_slots(ex, [int(tokens[seq])], pos, 1), **extra},
                            [seq], [True])
            return out.result[:1]
        return self._paged_step({s: [tok] for s, tok in tokens.items()}, 1,
                                self.decode_batches, sample, draws)

    def verify(self, seq, tokens, width: int, sample: str | None = None) -> np.ndarray:
        """Feed 1 to `width` tokens to an open sequence in one step of the (width, 1)
        scoring plan (padded); returns the logits after each of them [len(tokens), vocab],
        or with sample="argmax" the argmax of each, taken in the graph [len(tokens)] (the
        step reads back nothing else). The positions stay claimed until `rollback` drops
        the rejected ones; a paged step registers no block with the prefix cache before
        then."""
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        n = len(tokens)
        if not 0 < n <= width or self.length(seq) + width > self.capacity:
            raise CapacityError(f"sequence {seq!r} at {self.length(seq)} of {self.capacity} "
                                f"positions cannot take {n} tokens in a step of {width}")
        if self.kv == "paged":
            return self.verify_rows({seq: tokens}, width, sample)[0]
        self._dense_check(seq)
        ex = self.executor(width, 1, scoring(sample))
        if "end" in ex.slots:
            raise BindError("a dense KV cache with sliding-window layers writes a ring, "
                            "whose overwritten rows a rejected token cannot give back; use "
                            "kv='paged' to verify proposed tokens")
        toks = np.zeros(width, np.int32)
        toks[:n] = tokens
        out = self._run(ex, _dense_slots(ex, toks, self.dense.reserve(n), n), [seq],
                        np.arange(width) < n)
        return out.result[:n]

    def verify_rows(self, rows: Mapping, width: int,
                    sample: str | None = None) -> list[np.ndarray]:
        """verify for several paged sequences in one step of the (width, b) scoring plan
        (b: the smallest of decode_batches that holds them), each fed 1 to `width` tokens;
        each one's logits [its tokens, vocab] (sample="argmax": its ids [its tokens]), in
        the order of rows."""
        if self.kv != "paged" or not 0 < len(rows) <= self.batch:
            raise BindError(f"verify_rows takes 1 to {self.batch} paged sequences, got "
                            f"{len(rows)} ({self.kv} KV)")
        for seq, toks in rows.items():
            if not 0 < len(toks) <= width or self.length(seq) + width > self.capacity:
                raise CapacityError(f"sequence {seq!r} at {self.length(seq)} of "
                                    f"{self.capacity} positions cannot take {len(toks)} "
                                    f"tokens in a step of {width}")
        rows = {s: np.asarray(t, np.int64).reshape(-1) for s, t in rows.items()}
        ex, slots, real, row_seqs = self._paged_slots(rows, width, self.decode_batches,
                                                      scoring(sample), None)
        out = self._run(ex, slots, row_seqs, real).result
        return [out[r * width: r * width + len(t)] for r, t in enumerate(rows.values())]

    def rollback(self, seq, n: int) -> None:
        """Drop the last `n` positions of an open sequence (rejected tokens `verify` fed);
        the paged sequence then registers its full blocks with the prefix cache."""
        if self.kv == "dense":
            self._dense_check(seq)
            self.dense.rollback(n)
            return
        self.blocks.rollback(seq, n)
        self.blocks.seal(seq)

    def prefill_rows(self, chunks: Mapping, tokens: int | None = None) -> np.ndarray:
        """One prefill chunk (1 to `tokens` tokens, default prefill_tokens) for each given
        paged sequence, all in one step of the (tokens, b) plan; the logits after each
        chunk's last token [len(chunks), vocab]."""
        t = tokens or self.prefill_tokens
        if not 0 < t <= self.prefill_tokens:
            raise BindError(f"a prefill chunk holds 1 to {self.prefill_tokens} tokens, "
                            f"not {t}")
        if self.kv != "paged" or not 0 < len(chunks) <= self.prefill_batches[-1]:
            raise BindError(f"prefill_rows takes 1 to {self.prefill_batches[-1]} paged "
                            f"sequences, got {len(chunks)} ({self.kv} KV)")
        for seq, chunk in chunks.items():
            if not 0 < len(chunk) <= t or self.length(seq) + t > self.capacity:
                raise BindError(f"sequence {seq!r} at {self.length(seq)} of "
                                f"{self.capacity} positions cannot take a chunk of "
                                f"{len(chunk)} tokens (1 to {t}, and {t} must fit)")
        return self._paged_step(chunks, t, self.prefill_batches)

    def ran(self, tokens: int, rows: int, sample: str | None = None) -> bool:
        """Whether the plan a step of `rows` sequences of `tokens` tokens takes (keyed as
        `executor`'s; a paged step at the smallest of decode_batches that holds the rows)
        has run before. A backend may record or compile a plan on its first run, so only a
        later run's time is the step's."""
        b = batch_for(self.decode_batches, rows) if self.kv == "paged" else 1
        ex = self.executors.get(plan_key(tokens, b, sample))
        return ex is not None and ex.steps > 0

    def rehearse(self, tokens: int, batch: int, sample: str | None = None) -> None:
        """Plan the paged (tokens, batch) step (with `sample`, the decode step that samples
        in the graph) and run it once on padding rows (every WriteMap entry -1: no KV slot
        is written), so that a backend that records its steps on the first run has
        recorded this one before any sequence needs it."""
        if self.kv != "paged":
            raise BindError("rehearse runs paged plans; a dense session has no padding rows")
        draws = self._padding(batch, sample) if sample not in (None, SCORE) else {}
        ex = self.executor(tokens, batch, sample)
        slots = {"tokens": np.zeros((batch, tokens), np.int32),
                 "pos": np.zeros((batch, 1), np.int32),
                 "write_map": np.full(batch * tokens, -1, np.int32),
                 "slot_map": np.zeros((batch, self.capacity), np.int32), **draws}
        if LAST in ex.slots:
            slots[LAST] = np.zeros(batch, np.int32)
        self._run(ex, slots, [None] * batch, np.zeros(batch * tokens, bool))

    def _padding(self, batch: int, sample: str) -> dict:
        """The sampler slots of a sampled step whose `batch` rows are all padding (the
        rows a step fills with real ones are the caller's `draws`)."""
        if sample == "argmax":
            return {}
        if self.padding_draws is None:
            raise BindError(f"a {sample!r} sampled step takes the sampler's slots; this "
                            f"session was given no padding_draws for its padding rows")
        return dict(self.padding_draws(batch, sample))

    def _chunk(self, seq, chunk: np.ndarray, t: int) -> np.ndarray:
        if self.kv == "paged":
            return self.prefill_rows({seq: chunk})[0]
        n = len(chunk)
        toks = np.zeros(t, np.int32)
        toks[:n] = chunk
        self._dense_check(seq)
        pos = self.dense.reserve(n)
        ex = self.executor(t, 1)
        slots = _dense_slots(ex, toks, pos, n)
        if LAST in ex.slots:
            slots[LAST] = [n - 1]
        out = self._run(ex, slots, [seq], np.arange(t) < n)
        return out.result[0 if LAST in ex.slots else n - 1]

    def decode_launch(self, tokens: Sequence | Mapping, after=None):
        """One greedy decode step through the argmax plan, queued without waiting: returns
        the step's `Pending` (its `result()` is each sequence's next token [len(tokens)]).
        `tokens` maps each sequence to its input token, or, with `after` (a pending step
        of the same sequences in the same order), lists the sequences, whose input tokens
        are `after`'s results, fed on the device with no host round trip."""
        seqs = list(tokens)
        if after is not None and list(after.seqs) != seqs:
            raise BindError(f"a decode step fed by an earlier one runs its sequences in its "
                            f"order: {list(after.seqs)}, not {seqs}")
        if not 0 < len(seqs) <= self.batch or self.stepper:
            raise BindError(f"decode_launch takes 1 to {self.batch} sequences and no "
                            f"stepper, got {len(seqs)}")
        first = [0 if after is not None else tokens[s] for s in seqs]
        if self.kv == "dense":
            (seq,) = seqs
            self._dense_check(seq)
            ex = self.executor(1, 1, "argmax")
            slots = _dense_slots(ex, first, self.dense.reserve(1), 1)
            row_seqs = seqs
        else:
            rows = {s: [t] for s, t in zip(seqs, first, strict=True)}
            ex, slots, _, row_seqs = self._paged_slots(       # argmax: no sampler slot
                rows, 1, self.decode_batches, "argmax", None, known=after is None)
        feed = None
        if after is not None:
            del slots["tokens"]
            feed = {"tokens": after.pending}
        self._row_slots(ex, slots, row_seqs)
        return PendingDecode(seqs, ex.launch(slots, feed))

    def greedy(self, seq, token: int, count: int) -> Iterator[int]:
        """The `count` greedy tokens that follow `token` in an open sequence, decoded with
        one step always queued ahead: step i+1 is launched, fed step i's token on the
        device, before step i's token is read, so the device runs while the caller handles
        each token. Closing the iterator early waits for the step in flight (its token is
        dropped; its position stays claimed until the sequence closes)."""
        pending = None
        try:
            for i in range(count):
                if pending is None:
                    pending = self.decode_launch({seq: token})
                ahead = self.decode_launch([seq], after=pending) if i + 1 < count else None
                token = int(pending.tokens()[0])
                pending = ahead
                yield token
        finally:
            if pending is not None:
                pending.tokens()

    def _paged_step(self, rows: Mapping, t: int, batches: Sequence[int],
                    sample: str | None = None, draws=None) -> np.ndarray:
        """One step of the plan of t tokens x b rows (b the smallest of `batches` that holds
        them), each sequence fed its 1..t tokens; the logits after each one's last token
        (with `sample`, each one's sampled next token)."""
        ex, slots, real, row_seqs = self._paged_slots(rows, t, batches, sample, draws)
        k, counts = len(rows), [len(r) for r in rows.values()]
        last = np.arange(k) * t + np.asarray(counts, np.int64) - 1
        if LAST in ex.slots:      # the step's head ran on these rows only
            last = np.arange(k)
        out = self._run(ex, slots, row_seqs, real)
        if self.blocks.cache is not None:      # the step ran: its full blocks are written
            for seq in rows:
                self.blocks.seal(seq)
        return out.result[last]

    def _paged_slots(self, rows: Mapping, t: int, batches: Sequence[int],
                     sample: str | None, draws, known: bool = True) -> tuple:
        """The executor and slot values of a paged step (see _paged_step), each sequence's
        KV slots reserved (for its tokens in `rows`, or for tokens the host does not know
        unless `known`); also which tokens are real and each row's sequence."""
        seqs = list(rows)
        counts = {s: len(rows[s]) for s in seqs}
        b = batch_for(batches, len(seqs))
        toks = np.zeros((b, t), np.int32)
        pos = np.zeros((b, 1), np.int32)
        wmap = np.full(b * t, -1, np.int32)
        smap = np.zeros((b, self.capacity), np.int32)
        self._check_room(counts)
        k = len(seqs)
        pos[:k, 0] = [self.blocks.length(seq) for seq in seqs]
        if t == 1:      # a decode step: whole columns at once (a server's 32 rows a step)
            toks[:k, 0] = [rows[seq][0] for seq in seqs]
            wmap[:k] = np.concatenate([self.blocks.reserve(seq, 1, rows[seq] if known
                                                           else None) for seq in seqs])
        else:
            for r, seq in enumerate(seqs):
                n = counts[seq]
                toks[r, :n] = rows[seq]
                wmap[r * t: r * t + n] = self.blocks.reserve(seq, n, rows[seq])
        for r, seq in enumerate(seqs):
            smap[r] = self.blocks.slot_map_view(seq)
        slots = {"tokens": toks, "pos": pos, "write_map": wmap, "slot_map": smap,
                 **(dict(draws(b)) if draws else {})}
        ex = self.executor(t, b, sample)
        if LAST in ex.slots:      # the step's head runs on each sequence's last token only
            slots[LAST] = np.zeros(b, np.int32)
            slots[LAST][:k] = np.arange(k) * t + np.fromiter(counts.values(), np.int64) - 1
        return ex, slots, wmap >= 0, seqs + [None] * (b - k)

    def _run(self, ex: Executor, slots: dict, row_seqs: Sequence, real) -> object:
        """One step of `ex`: the per-sequence row slots filled in (row r from the sequence
        `row_seqs[r]`, None for padding), through the stepper where there is one."""
        self._row_slots(ex, slots, row_seqs)
        if self.stepper is not None:
            return self.stepper(ex, slots, np.asarray(real, bool))
        return ex.step(slots)

    def _row_slots(self, ex: Executor, slots: dict, row_seqs: Sequence) -> None:
        for name, table in self.row_slots.items():
            if name in ex.slots:
                slots[name] = np.array([table.get(s, 0) if s is not None else 0
                                        for s in row_seqs], np.int32)

    def _check_fits(self, seq, n: int) -> None:
        """Refuse a whole prompt the cache cannot hold before any of it is fed."""
        if self.length(seq) + n > self.capacity:
            raise CapacityError(f"sequence {seq!r} holds {self.length(seq)} positions; "
                                f"{n} more pass its capacity of {self.capacity}")
        if self.kv == "paged":
            self._check_room({seq: n})

    def _check_room(self, counts: Mapping) -> None:
        """Refuse a step the pool cannot hold (counts: new tokens by sequence) before any
        sequence claims a slot."""
        blk = self.blocks.block
        need = self.blocks.blocks_needed(counts)
        if need > self.blocks.free:
            raise CapacityError(f"KV pool out of blocks: this step needs {need} more blocks "
                                f"of {blk} slots, {self.blocks.free} are free; finish a "
                                f"sequence or plan a larger pool")

    def _dense_check(self, seq) -> None:
        if seq != self.dense_seq:
            raise CapacityError(f"sequence {seq!r} is not open in the dense KV cache")


class PendingDecode:
    """A queued decode step (Session.decode_launch): its sequences, in row order, and
    `tokens()`, their next token ids once the step has run."""

    def __init__(self, seqs: list, pending):
        self.seqs, self.pending = seqs, pending

    def tokens(self) -> np.ndarray:
        return self.pending.result()[: len(self.seqs)]


def scoring(sample: str | None) -> str:
    """The plan variant of a verification step: every row's logits, or its argmax."""
    if sample not in (None, "argmax"):
        raise BindError(f"a verification step reads back logits or argmax ids, not "
                        f"{sample!r} samples (the host applies the rejection rule)")
    return SCORE if sample is None else sample


def _cache_key(rows: Mapping | None, key: str) -> str:
    """A paged sequence's prefix-cache key: the caller's and its per-sequence slot values
    (a LoRA adapter's index changes its KV rows)."""
    return key + "|" + ",".join(f"{k}={v}" for k, v in sorted((rows or {}).items()))


def _dense_slots(ex: Executor, tokens, pos: int, n: int) -> dict:
    """A dense step's slots; `end` (one past the last real token) where the graph has it
    (ring caches of sliding-window layers skip the padding's writes by it)."""
    slots = {"tokens": tokens, "pos": [pos]}
    if "end" in ex.slots:
        slots["end"] = [pos + n]
    return slots


__all__ = ["Session", "scoring"]
