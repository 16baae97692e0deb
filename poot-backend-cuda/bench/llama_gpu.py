"""Decode at real model sizes on the CUDA backend: Llama-3-8B and Llama-3.2-1B shapes.

Random weights made on the GPU (bench/synthetic.py: seconds for 16 GB, every matrix
distinct), batch-1 decode through the Executor with CUDA graph replay. Prints, from one run:
- the copy ceiling (a 16-byte-per-thread copy kernel over 1 GiB, read + write);
- per shape and weight format (bf16, GGUF Q4_0, Q4_K): tok/s of the replayed step (graph
  alone, and Executor.step with the slot writes and logits read), weight bytes read per
  token, and those bytes over the step time as GB/s and as a fraction of the copy;
- where the step's time goes (`--profile`): each launch of the recorded step timed alone
  (a graph of 20 of it, warm L2 for the small ones), summed per kernel kind and per
  contraction shape, against the step: the difference is time between kernels;
- `--check-layers N`: the 8B shape cut to N layers in bf16, its logits on cuda against the
  reference backend over the same bytes (read back from the device), two positions;
- `--prefill T,...`: prefill steps of T tokens from position 0 instead of decode (the
  head on the last token): tok/s of the replayed step; `--check-prefill T`: the reduced
  check also compares the last token's logits of a prefill step of T tokens;
- `--precision exact,fast`: each step compiled at each precision level (docs/ir.md section
  15: `fast` rounds the activations of 16-bit weights to bf16 and those of packed weights
  to int8 rows), over the same weights in one run; fast rows are labelled "fast".
- `--gguf PATH`: the weights of a GGUF file (random_gguf.py writes one of a real shape)
  instead of synthetic ones, its shape and format from the file, rows labelled "gguf
  FORMAT": the file llama.cpp's llama-bench times (llamacpp_peer.sh); `--smoke BACKEND`:
  no timing, one decode and one prefill step of the file on any backend, logits checked
  finite (the same loading and binding, for a machine without a GPU).
Lines starting with "SUMMARY " are collected by the session script.

    python llama_gpu.py --shapes 8b,1b --formats bf16,Q4_0,Q4_K --profile 8b --check-layers 2
    python llama_gpu.py --variants 'RUN_COLUMNS=1;RUN_COLUMNS=2'   # compare schedules
    python llama_gpu.py --plan --shapes 8b      # no GPU: trace, compile and plan only
    python llama_gpu.py --plan --shapes 8b --formats bf16 --prefill 512 --precision fast
    python llama_gpu.py --shapes 8b --formats Q4_K --prefill 128,512   # prefill steps
    python llama_gpu.py --gguf /tmp/llama8b-q4_0.gguf --prefill 512 --precision exact,fast
    python llama_gpu.py --gguf /tmp/tiny.gguf --smoke cpu --prefill 16
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback

import numpy as np
from bench_gpu import host_ms, scheduled
from synthetic import DeviceFilledWeights, SyntheticWeights, host_arrays, shape_config

POS = 100          # the decode position timed (attention over 101 keys of max_seq 1024)


def summary(key: str, value) -> None:
    print(f"SUMMARY {key} | {value}", flush=True)


class FileWeights:
    """The weights of a GGUF file as the benches read synthetic ones: a WeightSource (the
    checkpoint's, q/k rows reordered and stacked by build_decoder's RowLayout) with the
    stacks it is traced with and the bytes a decode step reads. Uploaded by an ordinary
    WeightCache from the file's memory map (`arrays`, filled as tracing asks)."""

    def __init__(self, path: str, max_seq: int = 1024, stack=(True, True)):
        from poot.models.loader import open_model
        from poot.models.weights import CheckpointWeights

        t0 = time.perf_counter()
        self.checkpoint, self.config = open_model(path, max_seq=max_seq, pull_missing=False)
        self.inner = CheckpointWeights(self.checkpoint, self.config)
        self.arrays = self.inner.arrays
        self.stack, self.stack_ffn = stack
        formats = {str(i.packed.format if i.packed is not None else i.dtype)
                   for n, i in self.checkpoint.tensors.items() if len(i.shape) == 2}
        #: the matrices' format ("Q4_0"), or all of them joined where they differ
        self.format = "+".join(sorted(f.removeprefix("gguf:") for f in formats))
        print(f"  opened {path}: {self.config.layers} layers, dim {self.config.dim}, "
              f"{self.format}, in {time.perf_counter() - t0:.1f} s", flush=True)

    def has(self, name: str) -> bool:
        return self.inner.has(name)

    def spec(self, name: str):
        return self.inner.spec(name)

    def bytes_per_token(self, config) -> int:
        """As SyntheticWeights': every tensor once, the embedding's one row unless tied."""
        sizes = {n: sum(s.nbytes for s in i.sources)
                 for n, i in self.checkpoint.tensors.items()}
        total = sum(sizes.values())
        if not config.tied and "token_embd.weight" in sizes:
            emb = sizes["token_embd.weight"]
            total -= emb - emb // config.vocab
        return total


#: FileWeights by (path, stacks): one open file (and one set of stacks) per run
_FILES: dict[tuple, FileWeights] = {}


def weights_for(shape: str, fmt: str, stack=(True, True), layers: int | None = None):
    """(config, WeightSource) of a shape: "gguf:PATH" a file's, else synthetic in `fmt`."""
    if shape.startswith("gguf:"):
        key = (shape[5:], tuple(stack))
        if key not in _FILES:
            _FILES[key] = FileWeights(shape[5:], stack=stack)
        return _FILES[key].config, _FILES[key]
    config = shape_config(shape, layers)
    return config, source_for(fmt, config, stack=stack)


def shape_label(shape: str) -> str:
    return "gguf" if shape.startswith("gguf:") else shape


def source_for(fmt: str, config, seed: int = 0, stack=(True, True)) -> SyntheticWeights:
    if fmt in ("bf16", "f32"):
        return SyntheticWeights(config, dtype=fmt, seed=seed, stack=stack[0],
                                stack_ffn=stack[1])
    return SyntheticWeights(config, packed=f"gguf:{fmt}", seed=seed, stack=stack[0],
                            stack_ffn=stack[1])


def traced(config, source, backend, device, off: frozenset = frozenset(), tokens: int = 1,
           precision: str = "exact"):
    """The decode step over `source` (with `tokens` > 1: a prefill step of that many
    tokens, the head on the last), compiled at `precision` with the passes `off`
    disabled."""
    import poot
    from poot.compiler import Policy
    from poot.models.llama import build_decoder

    t0 = time.perf_counter()
    step = build_decoder(config, source, tokens=tokens, kv="dense", stack_qkv=source.stack,
                         stack_ffn=source.stack_ffn, logits="all" if tokens == 1 else "last")
    compiled = poot.compile(step.graph, (backend, device), policy=Policy(disable=set(off),
                                                                    precision=precision))
    print(f"  traced and compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    return step, compiled


def parse_variants(text: str) -> list[dict]:
    """"A=1,B=2;A=3" -> [{"A": 1, "B": 2}, {"A": 3}]: the contraction schedule's fields
    (RUN_COLUMNS=1 sets DotSchedule.run_columns) and other schedule constants (`tuning`)
    per variant ("" -> one variant, the defaults); STACK_QKV=0 /
    STACK_FFN=0: the model traced with q, k and v (gate and up) as separate weights
    (build_decoder's stack_qkv / stack_ffn); PROLOGUE=0 / NORM=0 / GATED=0 /
    STACKED_GATE=0 / ROPE_UPDATE=0 / KV_WRITE=0 / ATTENTION_ROWS=0: compiled without the
    prologue / norm_contraction / gated / stacked_gate / rope_update / kv_write /
    attention_rows pass."""
    out = []
    for part in text.split(";") if text else [""]:
        kv = dict(x.split("=") for x in part.split(",") if x)
        out.append({k.strip(): int(v) for k, v in kv.items()})
    return out


def variant_label(v: dict) -> str:
    return " ".join(f"{k}={x}" for k, x in v.items())


def precision_label(precision: str) -> str:
    """What a row's label says of its precision: nothing for exact (the labels of earlier
    sessions), " fast" for fast."""
    return "" if precision == "exact" else f" {precision}"


#: variant keys that change the traced or compiled graph (default 1 each): the stacks the
#: model is traced with, then compile passes
STACKS = ("STACK_QKV", "STACK_FFN")
PASSES = {"PROLOGUE": "prologue", "NORM": "norm_contraction", "GATED": "gated",
          "STACKED_GATE": "stacked_gate", "ROPE_UPDATE": "rope_update", "KV_WRITE": "kv_write",
          "ATTENTION_ROWS": "attention_rows"}


def stacked_groups(variants: list[dict]) -> list[tuple[tuple, list[dict]]]:
    """The variants by ((STACK_QKV, STACK_FFN), passes off), in first-seen order, without
    those keys: each group is traced and compiled once (over its own weights)."""
    groups: dict[tuple, list[dict]] = {}
    for v in variants:
        key = (tuple(bool(v.get(k, 1)) for k in STACKS),
               frozenset(name for k, name in PASSES.items() if not v.get(k, 1)))
        groups.setdefault(key, []).append(
            {k: x for k, x in v.items() if k not in STACKS and k not in PASSES})
    return list(groups.items())


def tuning(variant: dict, features) -> tuple:
    """(the contraction schedule `variant` asks for: the target's default with each field
    it names replaced, RUN_COLUMNS=1 for run_columns, or None where it names none; the
    rest of `variant`, constants of other lowerings for `homes_of`)."""
    from dataclasses import fields, replace

    from poot.codegen.lower.schedule import DotSchedule, dot_schedule

    names = {f.name for f in fields(DotSchedule) if f.type in ("int", "bool")}
    mine = {k.lower(): v for k, v in variant.items() if k.lower() in names}
    rest = {k: v for k, v in variant.items() if k.lower() not in names}
    if not mine:
        return None, rest
    base = dot_schedule(frozenset(features))
    return replace(base, **{k: type(getattr(base, k))(v) for k, v in mine.items()}), rest


def homes_of(variant: dict) -> dict:
    """The modules holding each schedule constant of `variant` (none of the contraction
    schedule's fields, `tuning`): poot.codegen.lower.reduce, attention, planes, wgmma,
    mma, schedule or the modules reading its constants (ROW_HELD, KEYS, PLANE_MIN_ROWS,
    MIN_ROWS, GEMV_MAX_ROWS, ...); a name that several import (MIN_ROWS: mma's, read by
    wgmma too; GEMV_MAX_ROWS: schedule's, read by dot, int_gemv and contraction) is set in
    each."""
    from poot.codegen.lower import (
        attention,
        contraction,
        dot,
        int_gemv,
        mma,
        planes,
        reduce,
        schedule,
        wgmma,
    )

    modules = (reduce, attention, planes, wgmma, mma, schedule, dot, int_gemv, contraction)
    homes = {k: [m for m in modules if hasattr(m, k)] for k in variant}
    unknown = [k for k, m in homes.items() if not m]
    if unknown:
        raise SystemExit(f"unknown schedule constants {unknown}")
    return homes


def planned(compiled, backend, device, variant: dict | None = None):
    """The plan of `compiled` under `variant`: its contraction schedule (`tuning`) on the
    backend, the other constants set where `homes_of` finds them."""
    from poot.plan import plan

    t0 = time.perf_counter()
    schedule, rest = tuning(variant or {}, backend.features(device))
    homes = homes_of(rest)
    defaults = {(k, m): getattr(m, k) for k in rest for m in homes[k]}
    try:
        for k, v in rest.items():
            for m in homes[k]:
                setattr(m, k, v)
        with scheduled(backend, schedule):  # lowerings shared by signature: made anew
            p = plan(compiled, (backend, device))
    finally:
        for (k, m), v in defaults.items():
            setattr(m, k, v)
    print(f"  planned: {len(p.steps)} steps in {time.perf_counter() - t0:.1f} s", flush=True)
    return p


def executor(step, p, source, runtime, cache=None):
    from poot.runtime.executor import Executor
    from poot.runtime.weights import WeightCache

    t0 = time.perf_counter()
    if cache is None:
        cache = DeviceFilledWeights(runtime, source, p.graph) \
            if isinstance(source, SyntheticWeights) else WeightCache(runtime)
    cache.graph = p.graph       # its tensors are found by label in the plan's own graph
    # a file's tensors (source.arrays) under the step's materialized stacks
    ex = Executor(p, {**getattr(source, "arrays", {}), **step.consts}, runtime=runtime,
                  weights=cache)
    if hasattr(runtime, "ctx"):
        runtime.ctx.sync()
    made = getattr(cache, "filled", None)
    print(f"  bound: {cache.uploads if made is None else made} tensors "
          f"{'uploaded' if made is None else 'filled'} on the device "
          f"({cache.bytes() / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s", flush=True)
    return ex, cache


def slots(pos: int, token: int = 1234, tokens: int = 1, vocab: int = 49152) -> dict:
    """A step's slots: `tokens` token ids from `token` on, the first at position `pos`;
    ids wrap below the smallest vocabulary of the synthetic shapes (SmolLM2's), or
    `vocab` where smaller (a small file's)."""
    ids = (token + 7919 * np.arange(tokens)) % min(vocab, 49152)
    return {"tokens": ids.astype(np.int32), "pos": np.array([pos], np.int32)}


def kind_of(name: str) -> str:
    parts = name.split("_")
    return parts[1] + ("_merge" if name.endswith("merge") else "") if len(parts) > 1 else name


def profile(ex, timer, step_ms: float, label: str) -> list[tuple]:
    """Each launch alone, per kind and per launch shape (grid x block), against the step."""
    exe = ex.executable
    per_kind: dict[str, list[float]] = {}
    per_shape: dict[tuple, list[float]] = {}
    for action in exe._actions:
        if action[0] != "launch":
            continue
        launch = action[1]
        kind = kind_of(launch.name)
        ms = timer.graph_ms(lambda launch=launch: launch(exe.rt.ctx), reps=20, trials=3)
        per_kind.setdefault(kind, []).append(ms)
        per_shape.setdefault((kind, launch.grid, launch.block), []).append(ms)
    total = sum(sum(v) for v in per_kind.values())
    launches = sum(len(v) for v in per_kind.values())
    rows = [(f"{label} profile: {launches} launches alone", f"{total * 1e3:9.1f} us",
             f"step {step_ms * 1e3:.0f} us", f"between kernels {(step_ms - total) * 1e3:.0f} us "
             f"({100 * (step_ms - total) / step_ms:.0f}%)", "")]
    summary(f"{label} profile", f"{launches} launches, {total * 1e3:.0f} us alone vs "
            f"{step_ms * 1e3:.0f} us step ({(step_ms - total) * 1e3:.0f} us between kernels)")
    for kind, times in sorted(per_kind.items(), key=lambda kv: -sum(kv[1])):
        rows.append((f"  {kind}", f"{sum(times) * 1e3:9.1f} us", f"{len(times)} launches",
                     f"{100 * sum(times) / step_ms:5.1f}% of step",
                     f"{statistics.mean(times) * 1e3:.1f} us each"))
        summary(f"{label} profile {kind}", f"{sum(times) * 1e3:.0f} us in {len(times)} "
                f"launches ({100 * sum(times) / step_ms:.1f}% of step)")
    ranked = sorted(per_shape.items(), key=lambda kv: -sum(kv[1]))[:12]
    for (kind, grid, block), times in ranked:
        rows.append((f"    {kind} grid {grid[0]}x{grid[1]}x{grid[2]} block {block[0]}",
                     f"{sum(times) * 1e3:9.1f} us", f"{len(times)} launches",
                     f"{statistics.median(times) * 1e3:.1f} us each", ""))
    return rows


def bench_shape(shape: str, fmt: str, variants, runtime, backend, device, timer,
                copy_gbs: float, do_profile: bool, precisions=("exact",)) -> list[tuple]:
    """One shape and format, planned once per precision and schedule variant over the
    same weights."""
    config, _ = weights_for(shape, fmt)
    print(f"== {shape} {fmt}: {config.layers} layers, dim {config.dim}, ffn {config.ffn}, "
          f"vocab {config.vocab}, {'tied' if config.tied else 'untied'} head", flush=True)
    rows = []
    for (stack, off), group in stacked_groups(variants):
        config, source = weights_for(shape, fmt, stack)
        cache = None
        for precision, variant in ((x, v) for x in precisions for v in group):
            if variant is group[0]:
                step, compiled = traced(config, source, backend, device, off,
                                        precision=precision)
            apart = [what for what, on in zip(("q,k,v", "gate,up"), stack) if not on]
            label = f"{shape_label(shape)} {fmt}{precision_label(precision)} " \
                f"{variant_label(variant)}" + (
                f" {' and '.join(apart)} apart" if apart else "") + "".join(
                f" no {name}" for name in sorted(off))
            p = planned(compiled, backend, device, variant)
            ex, cache = executor(step, p, source, runtime, cache)
            rows += bench_variant(label.rstrip(), config, source, ex, timer, copy_gbs,
                                  do_profile)
            ex.executable._graph = None          # the recorded graph goes; the weights stay
    return rows


def bench_prefill(shape: str, fmt: str, tokens: list[int], variants, runtime, backend,
                  device, timer, precisions=("exact",), do_profile=False) -> list[tuple]:
    """Prefill steps of each of `tokens` tokens (from position 0, the head on the last):
    tok/s of the replayed step at each precision and under each schedule variant, over
    the same weights; `do_profile`: each step's launches timed alone, by kind. Every
    variant after the first over the same stacks (passes off, another schedule) also
    gives its logits' relative difference from the first's."""
    rows, first = [], {}
    for (stack, off), group in stacked_groups(variants):
        config, source = weights_for(shape, fmt, stack)
        cache = None
        for t, precision in ((t, x) for t in tokens for x in precisions):
            step, compiled = traced(config, source, backend, device, off, tokens=t,
                                    precision=precision)
            for variant in group:
                label = (f"{shape_label(shape)} {fmt}{precision_label(precision)} prefill {t} "
                         f"{variant_label(variant)}").rstrip()
                label += f" without {','.join(sorted(off))}" if off else ""
                p = planned(compiled, backend, device, variant)
                ex, cache = executor(step, p, source, runtime, cache)
                exe, s = ex.executable, slots(0, tokens=t, vocab=config.vocab)
                exe.replay = True
                out = ex.step(s).result
                if not np.isfinite(out.astype(np.float32)).all():
                    raise AssertionError(f"{label}: non-finite logits")
                got = out.astype(np.float64)
                want = first.setdefault((stack, t, precision), got)
                if want is not got:
                    summary(f"{label} logits vs the first variant", "rel. difference "
                            f"{np.linalg.norm(got - want) / np.linalg.norm(want):.2e}")
                ms = timer.call_ms(exe._graph.launch, reps=5, trials=3)
                kernels = sum(1 for a in exe._actions if a[0] == "launch")
                rows.append((label, f"{ms * 1e3:9.1f} us", f"{t / ms * 1e3:8.1f} tok/s",
                             f"{kernels} kernels", ""))
                summary(label, f"{t / ms * 1e3:.1f} tok/s ({ms:.2f} ms a step, "
                        f"{kernels} kernels)")
                if do_profile and variant is group[0]:
                    rows += profile(ex, timer, ms, label)
                exe._graph = None
                del ex
    return rows


def bench_variant(label: str, config, source, ex, timer, copy_gbs: float,
                  do_profile: bool) -> list[tuple]:
    exe = ex.executable
    kernels = sum(1 for a in exe._actions if a[0] == "launch")
    s = slots(POS, vocab=config.vocab)
    exe.replay = True
    out = ex.step(s).result                                  # records the graph
    if not np.isfinite(out.astype(np.float32)).all():
        raise AssertionError(f"{label}: non-finite logits")
    dev_ms = timer.call_ms(exe._graph.launch, reps=20, trials=5)
    step_ms = host_ms(lambda: ex.step(s), steps=30)
    nbytes = source.bytes_per_token(config)
    gbs = nbytes / dev_ms / 1e6
    rows = [(f"{label} decode (graph alone)", f"{dev_ms * 1e3:9.1f} us",
             f"{1e3 / dev_ms:8.1f} tok/s", f"{gbs:7.0f} GB/s = {100 * gbs / copy_gbs:5.1f}% "
             f"of copy", f"{nbytes / 1e9:.3f} GB/token, {kernels} kernels"),
            (f"{label} decode (Executor.step)", f"{step_ms * 1e3:9.1f} us",
             f"{1e3 / step_ms:8.1f} tok/s", "incl. slot writes + logits read", "")]
    summary(f"{label} decode", f"{1e3 / dev_ms:.1f} tok/s graph ({1e3 / step_ms:.1f} "
            f"Executor.step), {nbytes / 1e9:.3f} GB/token, {gbs:.0f} GB/s = "
            f"{100 * gbs / copy_gbs:.1f}% of copy, {kernels} kernels")
    if do_profile:
        rows += profile(ex, timer, dev_ms, label)
    return rows


def check_reduced(layers: int, runtime, backend, device, prefill: int = 0) -> bool:
    """The 8B shape cut to `layers` layers, bf16: cuda logits vs the reference backend's
    over the same weight bytes, at positions 0 and 1; with `prefill`, also the last
    token's of a prefill step of that many tokens."""
    import poot
    from poot.plan import plan
    from poot.plugin import get_backend
    from poot.runtime.executor import Executor

    config = shape_config("8b", layers)
    source = source_for("bf16", config, seed=7)
    step, compiled = traced(config, source, backend, device)
    ex, cache = executor(step, planned(compiled, backend, device), source, runtime)
    t0 = time.perf_counter()
    arrays = host_arrays(runtime, cache)
    ref_backend = get_backend("reference")
    rdev = ref_backend.default_device()
    rp = plan(poot.compile(step.graph, (ref_backend, rdev)), (ref_backend, rdev))
    ref = Executor(rp, {**arrays, **step.consts})
    print(f"  reference bound in {time.perf_counter() - t0:.1f} s", flush=True)
    ok = True
    for pos, tok in ((0, 128000), (1, 9906)):
        got = ex.step(slots(pos, tok)).result.astype(np.float64)
        t0 = time.perf_counter()
        want = ref.step(slots(pos, tok)).result.astype(np.float64)
        ok &= compare(got, want, layers, f"pos {pos}", t0)
    if prefill:      # a prefill step: contractions of `prefill` rows (planes, tensor cores)
        step, compiled = traced(config, source, backend, device, tokens=prefill)
        ex, _ = executor(step, planned(compiled, backend, device), source, runtime, cache)
        rp = plan(poot.compile(step.graph, (ref_backend, rdev)), (ref_backend, rdev))
        ref = Executor(rp, {**arrays, **step.consts})
        s = slots(0, 128000, prefill)
        got = ex.step(s).result.astype(np.float64)
        t0 = time.perf_counter()
        ok &= compare(got, ref.step(s).result.astype(np.float64), layers,
                      f"prefill {prefill} tokens", t0)
    return ok


def compare(got, want, layers: int, what: str, t0: float) -> bool:
    """Logits of cuda against the reference's (relative error under 1e-2, all finite),
    printed and summarized; `t0` when the reference step started."""
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    same = int(np.argmax(got)) == int(np.argmax(want))
    good = bool(np.isfinite(got).all() and err < 1e-2)
    print(f"  {what}: relative error {err:.2e}, argmax cuda {int(np.argmax(got))} "
          f"reference {int(np.argmax(want))} ({'same' if same else 'DIFFERENT'}); "
          f"reference step {time.perf_counter() - t0:.1f} s", flush=True)
    summary(f"8b-shape {layers}-layer bf16 logits cuda vs reference, {what}",
            f"rel. error {err:.2e} ({'OK' if good else 'FAIL'}), argmax "
            f"{'same' if same else 'different'}")
    return good


def plan_only(pairs, variants, check_layers: int, prefill=(),
              precisions=("exact",), layers: int | None = None) -> None:
    """Trace, compile and plan (NVRTC fills its disk cache) for a compile-only device of
    the architecture a 9.0 GPU's kernels are built for (sm_90a): the decode step, or the
    prefill steps of `prefill` tokens, at each of `precisions` (`layers`: the shapes cut
    to that many layers); prints the kernels of each distinct contraction signature
    (`contraction_kernels`)."""
    from bench_gpu import ARCH
    from poot_cuda.backend import CudaBackend

    backend = CudaBackend()
    device = backend.compile_only_device(ARCH)
    todo = [(shape, layers, fmt, variants) for shape, fmt in pairs]
    if check_layers:
        todo.insert(0, ("8b", check_layers, "bf16", [{}]))
    for shape, layers, fmt, values in todo:
        print(f"== {shape} {fmt}" + (f" ({layers} layers)" if layers else ""), flush=True)
        steps = [(t, x) for t in prefill or [1] for x in precisions]
        for (stack, off), group in stacked_groups(values):
            config, source = weights_for(shape, fmt, stack, layers)
            for tokens, precision in steps:
                print(f"-- {tokens} token{'s' if tokens > 1 else ''}, {precision}", flush=True)
                _, compiled = traced(config, source, backend, device, off, tokens=tokens,
                                     precision=precision)
                for variant in group:
                    contraction_kernels(planned(compiled, backend, device, variant))


def contraction_kernels(p) -> None:
    """Each distinct contraction signature of plan `p` once: its op, operand types and the
    kernels it lowered to (name, grid, workgroup): which schedule a shape takes."""
    seen = set()
    for s in p.steps:
        if "Contraction" not in s.eqn.op.name:
            continue
        types = tuple(str(p.graph.type_of(x.id)) for x in s.eqn.inputs if hasattr(x, "id"))
        if (s.eqn.op.name, types) in seen:
            continue
        seen.add((s.eqn.op.name, types))
        prog = s.lowering.program
        kernels = getattr(prog, "program", prog).kernels
        print(f"  {s.eqn.op.name}({', '.join(types[:2])}): " + "; ".join(
            f"{k.name} grid {'x'.join(map(str, k.grid))} x {k.workgroup[0]}"
            for k in kernels), flush=True)


def smoke(shape: str, backend_name: str, prefill, precisions) -> bool:
    """A file's decode step (at POS) and prefill steps of `prefill` tokens at each of
    `precisions` on `backend_name`, through the timed path's loading and binding (no
    timing): each step's logits finite."""
    from poot.plan import plan
    from poot.plugin import get_backend

    backend = get_backend(backend_name)
    device = backend.default_device()
    runtime = backend.runtime(device)
    config, source = weights_for(shape, "")
    ok, cache = True, None
    for t, precision in ((t, x) for t in [1, *prefill] for x in precisions):
        step, compiled = traced(config, source, backend, device, tokens=t,
                                precision=precision)
        ex, cache = executor(step, plan(compiled, (backend, device)), source, runtime, cache)
        out = ex.step(slots(POS if t == 1 else 0, tokens=t, vocab=config.vocab)).result
        out = np.asarray(out, np.float64)
        good = bool(np.isfinite(out).all())
        ok &= good
        summary(f"gguf {source.format}{precision_label(precision)} "
                f"{'decode' if t == 1 else f'prefill {t}'} on {backend_name}",
                f"logits {out.shape} {'finite' if good else 'NOT FINITE'}, std "
                f"{out.std():.3g}, argmax {int(out.reshape(-1, out.shape[-1])[-1].argmax())}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8b,1b")
    ap.add_argument("--formats", default="bf16,Q4_0,Q4_K")
    ap.add_argument("--profile", default="8b",
                    help="shapes whose step (decode, or each --prefill step) is profiled")
    ap.add_argument("--check-layers", type=int, default=2,
                    help="layers of the reduced 8B shape checked against the reference (0: no)")
    ap.add_argument("--variants", default="",
                    help="GEMV schedule constants to compare, e.g. "
                         "'RUN_COLUMNS=1;RUN_COLUMNS=2,SHARED_BYTES=32768'")
    ap.add_argument("--prefill", default="",
                    help="token counts of prefill steps timed instead of decode, e.g. "
                         "'128,512'")
    ap.add_argument("--decode", action="store_true",
                    help="with --prefill: the decode step too (one process, one load)")
    ap.add_argument("--check-prefill", type=int, default=0,
                    help="the reduced check also checks a prefill step of this many tokens")
    ap.add_argument("--precision", default="exact",
                    help="precision levels each step is compiled at, e.g. 'exact,fast'")
    ap.add_argument("--layers", type=int, default=None,
                    help="with --plan: the shapes cut to this many layers")
    ap.add_argument("--plan", action="store_true", help="no GPU: trace, compile, plan only")
    ap.add_argument("--gguf", default="",
                    help="GGUF files whose weights are timed instead of synthetic ones "
                         "(their shape and format; replaces --shapes and --formats)")
    ap.add_argument("--smoke", default="",
                    help="with --gguf: no timing, each step once on this backend (cpu, "
                         "reference), logits checked finite")
    args = ap.parse_args()
    prefill = [int(t) for t in args.prefill.split(",") if t]
    shapes, formats = args.shapes.split(","), args.formats.split(",")
    if args.gguf:
        files = [f"gguf:{path}" for path in args.gguf.split(",")]
        if args.smoke:
            ok = all([smoke(f, args.smoke, prefill, tuple(args.precision.split(",")))
                      for f in files])
            return 0 if ok else 1
    # (shape, format) pairs timed: every shape in every format, or each file in its own
    pairs = [(f, weights_for(f, "")[1].format) for f in files] if args.gguf else \
        [(shape, fmt) for shape in shapes for fmt in formats]
    variants = parse_variants(args.variants)
    precisions = tuple(args.precision.split(","))
    if args.plan:
        plan_only(pairs, variants, args.check_layers, prefill, precisions, args.layers)
        return 0
    from bench_gpu import Timer, copy_bandwidths, print_rows
    from poot_cuda.backend import CudaBackend

    backend = CudaBackend()
    device = backend.probe()[0]
    print(device, flush=True)
    runtime = backend.runtime(device)
    timer = Timer(runtime.ctx)
    copies = copy_bandwidths(runtime.ctx, timer)
    copy_gbs = max(copies.values())
    summary("copy ceiling", f"{copy_gbs:.0f} GB/s ({max(copies, key=copies.get)})")
    rows = [(f"copy 1 GiB: {k}", "", f"{v:8.1f} GB/s", "", "") for k, v in copies.items()]
    failed = False
    if args.check_layers:
        try:
            failed |= not check_reduced(args.check_layers, runtime, backend, device,
                                        args.check_prefill)
        except Exception:  # noqa: BLE001 - the timings still run
            traceback.print_exc()
            failed = True
            summary("8b-shape reduced logits check", "FAILED (see log)")
    for shape, fmt in pairs:
        try:
            if prefill:
                rows += bench_prefill(shape, fmt, prefill, variants, runtime, backend, device,
                                      timer, precisions, shape in args.profile.split(","))
            if not prefill or args.decode:
                rows += bench_shape(shape, fmt, variants, runtime, backend, device, timer,
                                    copy_gbs, shape in args.profile.split(","), precisions)
        except Exception as e:  # noqa: BLE001 - one broken variant must not hide others
            traceback.print_exc()
            failed = True
            label = f"{shape_label(shape)} {fmt}"
            rows.append((label, "FAILED", f"{type(e).__name__}: {e}"[:160], "", ""))
            summary(f"{label} {'prefill' if prefill else 'decode'}", "FAILED")
    print_rows(rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
