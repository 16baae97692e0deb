"""SmolLM2-135M (the real GGUF) on the cuda backend against the reference backend.

Greedy decoding of N tokens from one prompt on both backends (the same token ids must come
out), then on cuda: decode tokens/s with CUDA graph replay and without (every kernel
launched each step), and prefill tokens/s (a short prompt, and a long one in 32-token
chunks). Timing is host wall time around Session.prefill/decode (slot writes and the
logits read included), after a warm-up generation that records the graphs.

    POOT_SMOLLM2_GGUF=/path/SmolLM2.gguf python smollm2_gpu.py          # on a CUDA GPU
    POOT_SMOLLM2_GGUF=/path/SmolLM2.gguf python smollm2_gpu.py --plan   # no GPU: compile
                                                                        # and plan only
Lines starting with "SUMMARY " are collected by h200_session.sh.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback

import numpy as np

PROMPT = "The capital of France is"


#: appended to every SUMMARY key of a run compiled without some passes (`--disable`)
LABEL = ""


def summary(key: str, value) -> None:
    print(f"SUMMARY {key}{LABEL} | {value}", flush=True)


def model_path() -> str:
    from poot.models.hub import smollm2_path

    path = smollm2_path()
    if path is None:
        raise SystemExit("no SmolLM2 GGUF: set POOT_SMOLLM2_GGUF")
    return str(path)


def greedy(model, ids: list[int], n: int, replay: bool | None = None,
           on_device: bool = False, chained: bool = False) -> dict:
    """`n` greedy tokens after `ids` through the model's dense-KV session; with `replay`
    given, every loaded cuda executable is switched to it first. `on_device`: each decode
    step takes the argmax in the graph and reads back only the token id (4 bytes), else
    the host reads the logits back and takes it. `chained`: the tokens come from
    Session.greedy (Model.generate's greedy path: a step always queued ahead, fed the
    last token on the device), timed as a whole. Returns ids and times."""
    session = model.session()
    model.prepare(session, len(ids), "argmax" if on_device or chained else None)
    if replay is not None:
        for ex in session.executors.values():
            ex.executable.replay = replay
    seq = object()
    session.open(seq)
    try:
        t0 = time.perf_counter()
        logits = session.prefill(seq, ids)
        prefill_s = time.perf_counter() - t0
        out = [int(np.argmax(np.asarray(logits, np.float32)))]
        if chained:
            t0 = time.perf_counter()
            out += list(session.greedy(seq, out[0], n - 1))
            return {"ids": out, "prefill_s": prefill_s,
                    "steps_s": [(time.perf_counter() - t0) / (n - 1)] * (n - 1)}
        step_s = []
        for i in range(n - 1):
            t0 = time.perf_counter()
            if on_device:
                nxt = int(session.decode_sampled({seq: out[i]}, "argmax", lambda b: {})[0])
            else:
                nxt = int(np.argmax(np.asarray(session.decode({seq: out[i]})[seq],
                                               np.float32)))
            step_s.append(time.perf_counter() - t0)
            out.append(nxt)
    finally:
        session.close(seq)
    return {"ids": out, "prefill_s": prefill_s, "steps_s": step_s}


def tps(run: dict) -> float:
    return len(run["steps_s"]) / sum(run["steps_s"]) if run["steps_s"] else 0.0


#: the real tokenization of PROMPT by SmolLM2's tokenizer (used with --random weights)
PROMPT_IDS = [504, 3575, 282, 4649, 314]
_RANDOM: dict = {}


def random_smollm2(max_seq: int):
    """SmolLM2-135M's exact shape with random weights quantized to Q4_1 (seed 0), for a
    machine the 98 MB checkpoint cannot reach. Built once, shared by both backends."""
    if max_seq not in _RANDOM:
        from poot.models.llama import LlamaConfig, random_weights

        cfg = LlamaConfig(vocab=49152, dim=576, layers=30, heads=9, kv_heads=3, head_dim=64,
                          ffn=1536, norm_eps=1e-5, rope_base=100000.0, rope_layout="pairs",
                          tied=False, max_seq=max_seq, arch="llama")  # untied: a random
        # tied head would echo the input token (the residual stream is mostly its embedding)
        t0 = time.perf_counter()
        _RANDOM[max_seq] = cfg, random_weights(cfg, seed=0, packed_format="gguf:Q4_1")
        print(f"random SmolLM2-shaped Q4_1 weights in {time.perf_counter() - t0:.1f} s")
    return _RANDOM[max_seq]


def load(backend: str, max_seq: int, random: bool = False):
    import poot

    t0 = time.perf_counter()
    if random:
        from poot.models.runner import Model
        from poot.plugin import get_backend

        cfg, weights = random_smollm2(max_seq)
        b = get_backend(backend)
        m = Model(None, cfg, None, b, b.default_device(), weights=weights,
                  progress=lambda s: print(f"  [{backend}] {s}", flush=True))
    else:
        m = poot.load(model_path(), backend=backend, max_seq=max_seq,
                      progress=lambda s: print(f"  [{backend}] {s}", flush=True))
    print(f"[{backend}] loaded {m.config.layers} layers on {m.device} in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    return m


def plan_only(max_seq: int) -> None:
    """No GPU: compile and plan the decode and prefill steps for a compile-only sm_90
    device (fills the NVRTC disk cache for a later run on the GPU)."""
    from dataclasses import replace

    from poot.models.loader import open_model
    from poot.models.runner import Model
    from poot.models.tokenizer import Tokenizer
    from poot.plan import plan
    from poot_cuda.backend import CudaBackend

    backend = CudaBackend()
    device = backend.compile_only_device("sm_90")
    ckpt, config = open_model(model_path(), max_seq=max_seq)
    config = replace(config, max_seq=min(config.max_seq, max_seq))
    m = Model(ckpt, config, Tokenizer.from_gguf_metadata(ckpt.metadata), backend, device)
    for tokens in (1, m.prefill_tokens):
        t0 = time.perf_counter()
        g = m.step_graph(tokens, 1, "dense", pool=config.max_seq)
        p = plan(g, (backend, device))
        print(f"planned a {tokens}-token step: {len(p.steps)} steps in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--long-prompt", type=int, default=256,
                    help="tokens of the long prompt timed for prefill tokens/s")
    ap.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the reference backend and compare token ids")
    ap.add_argument("--plan", action="store_true", help="no GPU: compile and plan only")
    ap.add_argument("--random", action="store_true",
                    help="SmolLM2's shape with random Q4_1 weights (no checkpoint needed)")
    ap.add_argument("--backend", default="cuda",
                    help="the backend measured (another name checks this script without a GPU)")
    ap.add_argument("--disable", default="",
                    help="compile passes left out, comma-separated (an A/B of a pass in one "
                         "call: its SUMMARY keys say 'without ...')")
    args = ap.parse_args()
    if args.disable:
        from poot.compiler import pipeline

        global LABEL
        off = set(args.disable.split(","))
        pipeline.PASSES[:] = [p for p in pipeline.PASSES if p[0] not in off]
        LABEL = f" (without {args.disable})"
    if args.plan:
        plan_only(args.max_seq)
        return 0
    failed = False
    gpu = load(args.backend, args.max_seq, args.random)
    ids = PROMPT_IDS if args.random else gpu.tokenize(PROMPT)
    text = (lambda ids: "(random weights: no text)") if args.random else gpu.tokenizer.decode
    print(f"prompt {PROMPT!r} -> {len(ids)} ids {ids}", flush=True)
    t0 = time.perf_counter()
    first = greedy(gpu, ids, args.tokens, replay=True)   # plans, records the graphs
    print(f"[cuda] first generation (plans bound, graphs recorded) "
          f"{time.perf_counter() - t0:.2f} s", flush=True)
    gpu_text = text(first["ids"])
    print(f"[cuda] ids  {first['ids']}\n[cuda] text {gpu_text!r}", flush=True)

    replay = greedy(gpu, ids, args.tokens, replay=True)
    eager = greedy(gpu, ids, args.tokens, replay=False)
    on_device = greedy(gpu, ids, args.tokens, replay=True, on_device=True)
    on_device = greedy(gpu, ids, args.tokens, replay=True, on_device=True)  # recorded now
    chained = greedy(gpu, ids, args.tokens, replay=True, chained=True)
    same_modes = replay["ids"] == first["ids"] == eager["ids"] == on_device["ids"] == \
        chained["ids"]
    if not same_modes:
        failed = True
        print(f"MISMATCH between cuda runs: replay {replay['ids']} eager {eager['ids']} "
              f"on-device greedy {on_device['ids']} chained {chained['ids']}")
    long = min(256, gpu.config.max_seq - len(ids))
    c_tps = max(tps(greedy(gpu, ids, long, replay=True, chained=True)) for _ in range(3))
    print(f"[cuda] generation, greedy steps chained on the device (Model.generate's path): "
          f"{c_tps:.1f} tok/s ({long} tokens, best of 3)", flush=True)
    summary("smollm2 cuda generation, chained greedy steps", f"{c_tps:.1f} tok/s")
    d_tps = tps(on_device)
    print(f"[cuda] decode, argmax in the graph (4 bytes read back): {d_tps:.1f} tok/s "
          f"(median step {1e3 * float(np.median(on_device['steps_s'])):.3f} ms)")
    summary("smollm2 cuda decode, on-device greedy, graph replay", f"{d_tps:.1f} tok/s")
    r_tps, e_tps = tps(replay), tps(eager)
    print(f"[cuda] decode with graph replay: {r_tps:.1f} tok/s (median step "
          f"{1e3 * float(np.median(replay['steps_s'])):.3f} ms)")
    print(f"[cuda] decode without replay:    {e_tps:.1f} tok/s (median step "
          f"{1e3 * float(np.median(eager['steps_s'])):.3f} ms)")
    summary("smollm2 cuda decode, graph replay", f"{r_tps:.1f} tok/s")
    summary("smollm2 cuda decode, no replay", f"{e_tps:.1f} tok/s")
    summary("smollm2 cuda replay vs no-replay ids", "same" if same_modes else "DIFFERENT")
    short = len(ids) / replay["prefill_s"]
    print(f"[cuda] prefill {len(ids)}-token prompt: {1e3 * replay['prefill_s']:.2f} ms "
          f"({short:.1f} tok/s; one {gpu.prefill_tokens}-token chunk)", flush=True)
    try:
        rng = np.random.default_rng(0)
        n = min(args.long_prompt, gpu.config.max_seq - 2)
        long_ids = [int(x) for x in rng.integers(100, gpu.config.vocab - 100, n)]
        greedy(gpu, long_ids, 2, replay=True)      # warm-up: all chunks replay afterwards
        runs = [greedy(gpu, long_ids, 2, replay=True)["prefill_s"] for _ in range(3)]
        long_tps = n / min(runs)
        print(f"[cuda] prefill {n}-token prompt ({gpu.prefill_tokens}-token chunks): "
              f"{1e3 * min(runs):.2f} ms, {long_tps:.1f} tok/s", flush=True)
        summary(f"smollm2 cuda prefill ({n} tokens)", f"{long_tps:.1f} tok/s")
    except Exception:  # noqa: BLE001 - report and go on to the comparison
        failed = True
        traceback.print_exc()
        summary("smollm2 cuda prefill", "FAILED (see smollm2.log)")
    summary("smollm2 cuda prefill (short prompt)", f"{short:.1f} tok/s, {len(ids)} tokens")

    if args.reference:
        ref = load("reference", args.max_seq, args.random)
        t0 = time.perf_counter()
        want = greedy(ref, ids, args.tokens)
        print(f"[reference] {args.tokens} tokens in {time.perf_counter() - t0:.1f} s "
              f"({tps(want):.1f} tok/s decode)")
        ref_text = text(want["ids"])
        print(f"[reference] ids  {want['ids']}\n[reference] text {ref_text!r}")
        same = want["ids"] == first["ids"]
        if not same:
            failed = True
            pairs = enumerate(zip(want["ids"], first["ids"], strict=True))
            k = next(i for i, (a, b) in pairs if a != b)
            print(f"MISMATCH: first differing token at {k}: cuda {first['ids'][k]} "
                  f"reference {want['ids'][k]}")
        print(f"greedy {args.tokens} tokens, cuda vs reference: "
              f"{'MATCH' if same else 'MISMATCH'}", flush=True)
        summary(f"smollm2 greedy {args.tokens} tokens cuda == reference",
                "MATCH" if same else "MISMATCH")
        summary("smollm2 cuda text", repr(gpu_text)[:70])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
