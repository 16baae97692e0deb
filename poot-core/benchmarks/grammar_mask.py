"""The grammar engine's cost per token: structured outputs' token masks (poot.serve.grammar)
on a real tokenizer, without a model.

Runs --requests constrained answers over a set of JSON schemas (nested objects, arrays,
enums, numbers, bounded strings), each drawn token by token from seeded random logits under
its mask (the mask computed, applied to the logits, the token taken by the matcher: what
the engine does per constrained sequence and step), checks that every answer parses and
validates against its schema, and reports the host's time per token: the mask (llguidance
computing the bitmask and numpy setting the disallowed logits to -inf) and the matcher's
advance.

    python poot-core/benchmarks/grammar_mask.py --gguf ~/.cache/poot/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

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
    mask_s, accept_s, valid, tokens, cut = [], [], 0, 0, 0
    for n in range(args.requests):
        k = n % len(SCHEMAS)
        c = grammar.Constraint(grammars[k], tok)
        ids = []
        for _ in range(args.max_tokens):
            z = rng.standard_normal(tok.vocab_size).astype(np.float32)
            t = time.perf_counter()
            c.mask(z)
            mask_s.append(time.perf_counter() - t)
            best = int(np.argmax(z))
            t = time.perf_counter()
            c.accept(best)
            accept_s.append(time.perf_counter() - t)
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
    print(f"mask per token: p50 {statistics.median(mask_s) * us:.0f} us, p99 "
          f"{np.percentile(mask_s, 99) * us:.0f} us, mean {statistics.fmean(mask_s) * us:.0f} us")
    print(f"matcher advance per token: p50 {statistics.median(accept_s) * us:.0f} us")
    return 0 if valid + cut == args.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
