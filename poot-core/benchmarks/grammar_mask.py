"""The grammar engine's cost per token: structured outputs' token masks (poot.serve.grammar)
on a real tokenizer, without a model.

Runs --requests constrained answers over a set of JSON schemas (nested objects, arrays,
enums, numbers, bounded strings), each drawn token by token from seeded random logits under
its mask, checks that every answer parses and validates against its schema, and reports the
host's time per token on the path `poot serve` takes for a constrained decode step: the
mask (llguidance writing its bitmask into a row of the sampler's mask slot, the u32 words
the step uploads) and the matcher's advance; beside it, the host path's mask (the same
bitmask, then numpy setting the disallowed logits to -inf), which a step that reads its
logits back (logprobs, logit_bias) still takes.

With --backend (cpu, reference, ...), it also times the sampler's step graph alone
(poot.models.sample_graph) on that backend for --batch rows of the tokenizer's vocabulary,
in the "full" mode and the "masked" mode (every row constrained): their difference is what
applying the mask in the graph costs a step, against the logits' read-back the host path
needs (vocabulary x 4 bytes a row).

    python poot-core/benchmarks/grammar_mask.py --backend cpu \
        --gguf ~/.cache/poot/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from poot.models.sample_graph import mask_words

SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 10},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": False}},
     "required": ["name", "age", "address"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", "blue", 7, None]},
     "minItems": 1, "maxItems": 6},
    {"type": "object", "properties": {
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "counts": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                              "maximum": 999}, "maxItems": 5},
        "ok": {"type": "boolean"}},
     "required": ["ratio", "counts", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {
        "kind": {"const": "event"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                 "maxItems": 3},
        "when": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9999},
                           {"type": "null"}]}},
     "required": ["kind", "tags", "when"], "additionalProperties": False},
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True, help="a GGUF file whose tokenizer to use")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--backend", help="also time the sampler graph's step on this backend")
    ap.add_argument("--batch", type=int, default=8, help="rows of that step")
    ap.add_argument("--steps", type=int, default=50, help="timed steps of each mode")
    args = ap.parse_args()

    import jsonschema

    from poot.models.tokenizer import Tokenizer
    from poot.serve import grammar

    tok = Tokenizer.from_gguf(args.gguf)
    t0 = time.perf_counter()
    grammar.llg_tokenizer(tok)
    print(f"llguidance tokenizer of {tok.vocab_size} tokens built in "
          f"{time.perf_counter() - t0:.2f} s")
    grammars = [grammar.checked(grammar.json_schema_grammar(s), tok) for s in SCHEMAS]
    rng = np.random.default_rng(0)
    words = np.empty(mask_words(tok.vocab_size), np.uint32)
    slot_s, host_s, accept_s, kept, valid, tokens, cut = [], [], [], [], 0, 0, 0
    for n in range(args.requests):
        k = n % len(SCHEMAS)
        # two matchers in step, one per path: llguidance keeps the mask it computed for a
        # state, so one matcher would time the second path on the first path's work
        c, host = grammar.Constraint(grammars[k], tok), grammar.Constraint(grammars[k], tok)
        ids = []
        for _ in range(args.max_tokens):
            z = rng.standard_normal(tok.vocab_size).astype(np.float32)
            t = time.perf_counter()
            c.write_mask(words)                 # the graph's path: the slot's words
            slot_s.append(time.perf_counter() - t)
            if len(slot_s) % 7 == 0 and len(kept) < args.batch * 8:
                kept.append(words.copy())       # real masks, for the graph's timing
            t = time.perf_counter()
            host.mask(z)                        # the host path: the bitmask, then -inf
            host_s.append(time.perf_counter() - t)
            allowed = np.unpackbits(words.view(np.uint8), bitorder="little")
            assert (allowed[: z.size] == 1).tolist() == np.isfinite(z).tolist()
            best = int(np.argmax(z))
            t = time.perf_counter()
            c.accept(best)
            accept_s.append(time.perf_counter() - t)
            host.accept(best)
            if best in tok.stop_ids:
                break
            ids.append(best)
            if c.done:
                break
        else:
            cut += 1
        tokens += len(ids)
        try:
            jsonschema.validate(json.loads(tok.decode(ids)), SCHEMAS[k])
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    us = 1e6
    print(f"{args.requests} answers, {tokens} tokens; {valid} parse and validate, {cut} cut "
          f"at {args.max_tokens} tokens")
    for label, xs in (("mask into the slot's words (graph path)", slot_s),
                      ("mask and -inf on the logits (host path)", host_s),
                      ("matcher advance", accept_s)):
        print(f"{label} per token: p50 {statistics.median(xs) * us:.0f} us, p99 "
              f"{np.percentile(xs, 99) * us:.0f} us, mean {statistics.fmean(xs) * us:.0f} us")
    print(f"a constrained row uploads {words.nbytes} bytes of mask a step; the host path "
          f"reads back {tok.vocab_size * 4} bytes of logits")
    if args.backend:
        graph_cost(args.backend, args.batch, tok.vocab_size, args.steps, np.stack(kept))
    return 0 if valid + cut == args.requests else 1


def graph_cost(backend: str, batch: int, vocab: int, steps: int, masks: np.ndarray) -> None:
    """Time the sampler's step graph alone on `backend`: "full", and "masked" with every
    row constrained (its masks taken in turn from `masks`, the answers' own)."""
    import poot
    from poot import ops, plugin
    from poot.conformance import roles
    from poot.dtypes import DType
    from poot.models.sample_graph import sample_tokens, slot_values
    from poot.models.sampling import Sampler
    from poot.plan import plan
    from poot.runtime.executor import Executor
    from poot.tracer import trace

    plugin.register(roles, name="poot.conformance.roles")
    target = plugin.get_backend(backend)
    device = plugin.probe(target)[0][0]
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((batch, vocab)).astype(np.float32)
    executors, samplers, times = {}, {}, {}
    for mode in ("full", "masked"):
        def f(mode=mode):
            x = ops.slot(roles.input_role(DType.F32), (batch, vocab), "logits")
            return sample_tokens(x, mode)
        executors[mode] = Executor(plan(poot.compile(trace(f, name=f"sampler_{mode}"),
                                                     (target, device)), (target, device)), {})
        samplers[mode] = [(Sampler(temperature=0.8, seed=i), []) for i in range(batch)]
        times[mode] = []
    for i in range(steps + 3):                # the modes alternate: the same machine load
        for mode, ex in executors.items():
            slots = slot_values(samplers[mode], batch, mode, vocab=vocab)
            if mode == "masked":
                slots["sampler.mask"][:] = masks[np.arange(i * batch, (i + 1) * batch)
                                                 % len(masks)]
            t = time.perf_counter()
            ex.step({"logits": logits, **slots})
            if i >= 3:                        # the first steps warm the backend up
                times[mode].append(time.perf_counter() - t)
    per_step = {mode: statistics.median(ts) for mode, ts in times.items()}
    extra = per_step["masked"] - per_step["full"]
    print(f"sampler step on {backend}, {batch} rows of {vocab} ids (median of {steps}): full "
          f"{per_step['full'] * 1e3:.2f} ms, masked {per_step['masked'] * 1e3:.2f} ms; the "
          f"mask adds {extra * 1e6:.0f} us a step, {extra / batch * 1e6:.0f} us a row")


if __name__ == "__main__":
    raise SystemExit(main())
