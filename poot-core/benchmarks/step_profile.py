"""The decode step of a real model (SmolLM2 Q4_1 by default) as each backend plans it:
kernel launches, barriers (dependent batches), kernels by kind, and the host time a step
spends encoding or recording its work; then greedy tok/s and the text, per backend.

    python poot-core/benchmarks/step_profile.py [--backends cpu,wgpu,vulkan,cuda]
        [--model smollm2] [--tokens 8] [--encodes 20] [--kinds 12]

Every count is read from the loaded plan's own objects (the decode plan `poot run` uses:
dense KV, one token, the argmax sampled in the graph):
- cpu: the step function's source (`poot_cpu.step.StepSource`): one call per kernel, a
  barrier only between dependent calls; nothing is encoded per step (one C call).
- vulkan: the recorded step (`poot_vulkan.step.RecordedStep`): its dispatches and copies
  cut into hazard batches, a pipeline barrier between two batches. The command buffer is
  recorded once at load and resubmitted; the record time is timed once more here.
- wgpu: the recorded step (`poot_wgpu.step.RecordedStep`): its dispatch list, encoded
  into a new command buffer every step (WebGPU command buffers are single-use); the
  encode and the submit are timed on their own. WebGPU puts no barriers in the API: wgpu
  tracks each buffer's use per dispatch as a whole, so a dispatch that binds a buffer an
  earlier one bound waits unless both bound it read-only; "barriers" counts those
  dispatches (poot_wgpu.step.implicit_barriers), "dependent batches" the batches the
  vulkan backend's byte-range hazard rule would cut them into.
- cuda: the step's queued actions (`poot.runtime.stream.StreamExecutable`): one stream, so
  each waits for the one before (on sm_90 a launch may start early and wait inside the
  kernel); replayed as one CUDA graph, whose launch is timed. Only where a CUDA device is
  present.
A backend without a device is reported as such and skipped.
"""
from __future__ import annotations

import argparse
import collections
import platform
import re
import statistics
import time

PROMPT = "The capital of France is"
#: a kernel name's parts that vary by shape or variant, dropped to group kernels by kind
VARIANT = re.compile(r"_[0-9a-f]{8,}(?=_|$)|(_\d+)+$")


def kind_of(name: str) -> str:
    return VARIANT.sub("", name)


class _Accesses:
    """An operation for poot_vulkan.step.batches: its (buffer, start, end, writes)."""

    def __init__(self, accesses: list):
        self._accesses = accesses

    def accesses(self) -> list:
        return self._accesses


def hazard_batches(accesses: list) -> int | str:
    """How many batches the vulkan backend's hazard rule cuts these operations into (each a
    list of (buffer, start, end, writes)); "n/a" without poot_vulkan."""
    try:
        from poot_vulkan.step import batches
    except ImportError:
        return "n/a"
    return len(batches([_Accesses(a) for a in accesses]))


def profile_cpu(ex) -> dict:
    step = ex.executable.step
    calls = re.findall(r"^    (\w+)\(.*\);  /\* step \d+ \*/$", step.source, re.M)
    return dict(launches=step.calls, barriers=step.barriers, batches=step.barriers + 1,
                kinds=collections.Counter(kind_of(c) for c in calls),
                encode="none (the step is one call of its compiled function)")


def profile_vulkan(ex, repeat: int) -> dict:
    from poot_vulkan.step import Copy

    step = ex.executable.step
    ops = [op for op in step.ops]
    kinds = collections.Counter("copy" if isinstance(op, Copy) else kind_of(op.pipeline.name)
                                for op in ops)
    dev, vk = step.dev, step.vk
    times = []
    for _ in range(repeat):
        cmd = dev.command_buffer()
        try:
            t0 = time.perf_counter()
            step.record(cmd)
            times.append(time.perf_counter() - t0)
        finally:
            vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cmd])
    return dict(launches=ex.executable.dispatches, copies=kinds.get("copy", 0),
                barriers=step.barriers, batches=len(step.batches), kinds=kinds,
                encode=f"0 per step (replayed); recording it once: "
                       f"{1e3 * min(times):.2f} ms")


def profile_wgpu(ex, repeat: int) -> dict:
    step = ex.executable.step
    kinds = collections.Counter(kind_of(d.kernel.label) for d in step.dispatches)
    accesses = [[(r["buffer"], r["offset"], r["offset"] + r["size"], w)
                 for r, w in zip(d.resources, d.writes, strict=True)]
                for d in step.dispatches]
    from poot_wgpu.step import implicit_barriers

    synced = implicit_barriers(step.dispatches)
    encodes, submits = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        commands = step.encode()
        t1 = time.perf_counter()
        # the last decode step once more (same slots: it writes what it wrote), to time
        # the submit; the read waits for it
        step.dev.queue.submit([commands])
        submits.append(time.perf_counter() - t1)
        encodes.append(t1 - t0)
        place = ex.plan.outputs[0][1]
        ex.runtime.read(ex.buffers[place.region], place.offset, 4)
    ahead = "encoded ahead, while the device runs the step before" if step.ahead else \
        "encoded before its submit"
    return dict(launches=len(step.dispatches), copies=len(step.copies), barriers=synced,
                batches=hazard_batches(accesses), kinds=kinds,
                encode=f"encode {1e3 * min(encodes):.3f} ms (median "
                       f"{1e3 * statistics.median(encodes):.3f}; "
                       f"{1e6 * min(encodes) / max(len(step.dispatches), 1):.2f} us a "
                       f"dispatch; {ahead}), submit {1e3 * min(submits):.3f} ms (median "
                       f"{1e3 * statistics.median(submits):.3f}), over {repeat} steps")


def profile_cuda(ex, repeat: int) -> dict:
    executable = ex.executable
    actions = executable._actions
    launches = [a for a in actions if a[0] == "launch"]
    kinds = collections.Counter(kind_of(getattr(a[1], "name", "kernel")) for a in launches)
    graph, times = executable._graph, []
    for _ in range(repeat if graph is not None else 0):
        t0 = time.perf_counter()
        graph.launch()            # the last decode step once more: it writes what it wrote
        times.append(time.perf_counter() - t0)
        executable.rt.ctx.sync()
    encode = f"one CUDA graph launch per step, {1e3 * min(times):.3f} ms on the host " \
             f"(min of {repeat})" if times else "every kernel launched per step (no graph)"
    return dict(launches=len(launches), copies=len(actions) - len(launches),
                barriers=f"{len(actions) - 1} (stream order)", batches=len(actions),
                kinds=kinds, encode=encode)


def run_backend(name: str, args) -> None:
    import poot
    from poot.errors import DeviceUnavailable, UnknownBackend
    from poot.models.sampling import Sampler

    t0 = time.perf_counter()
    try:
        model = poot.load(args.model, name, max_seq=args.max_seq)
    except (DeviceUnavailable, UnknownBackend) as e:
        print(f"\n== {name}: skipped ({e})")
        return
    session = model.session()
    mode = model.sample_mode([Sampler()])
    ids = model.prompt_ids(PROMPT)
    model.prepare(session, prompt_tokens=len(ids), sample=mode)
    ex = session.executor(1, 1, mode if model.device_sampling else None)
    setup = time.perf_counter() - t0
    text = model.generate(PROMPT, max_tokens=args.tokens)
    stats = model.stats
    prof = {"cpu": lambda: profile_cpu(ex),
            "vulkan": lambda: profile_vulkan(ex, args.encodes),
            "wgpu": lambda: profile_wgpu(ex, args.encodes),
            "cuda": lambda: profile_cuda(ex, args.encodes)}.get(name)
    print(f"\n== {name} on {model.device}: setup {setup:.1f} s; decode "
          f"{stats.decode_tps:.2f} tok/s ({stats.generated_tokens} tokens), "
          f"prefill {stats.prefill_tps:.2f} tok/s | {text!r}")
    if prof is None:
        print("   (no plan reader for this backend)")
        return
    p = prof()
    print(f"   per decode step: {p['launches']} kernel launches, {p.get('copies', 0)} copies, "
          f"{p['barriers']} barriers, {p['batches']} dependent batches")
    print(f"   host encode/record: {p['encode']}")
    print(f"   kernels by kind ({len(p['kinds'])} kinds, the {args.kinds} most):")
    for k, n in p["kinds"].most_common(args.kinds):
        print(f"     {n:5d}  {k}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="cpu,wgpu,vulkan,cuda")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=8, help="greedy tokens to time")
    ap.add_argument("--max-seq", type=int, default=64)
    ap.add_argument("--encodes", type=int, default=20,
                    help="times to encode (wgpu) or record (vulkan) the step on its own")
    ap.add_argument("--kinds", type=int, default=12, help="kernel kinds to list")
    args = ap.parse_args()
    print(f"{args.model}, decode step, prompt {PROMPT!r}; host "
          f"{platform.processor() or platform.machine()}")
    for name in args.backends.split(","):
        run_backend(name, args)


if __name__ == "__main__":
    main()
