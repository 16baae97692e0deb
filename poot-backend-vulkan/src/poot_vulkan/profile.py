"""The profile mode of a recorded step: a GPU timestamp after every operation.

`profile(step)` records the step once more, into a command buffer of its own, with a
timestamp (vkCmdWriteTimestamp at the bottom of the pipe, into a timestamp query pool)
at its start and after every upload, dispatch and copy, runs it a few times and, from
the run of median span, gives each operation the GPU time from the timestamp before it
to its own: its barrier, its
launch and its run. Operations of one batch (no barrier between them) may overlap, and
then each gets the time between completions; the times always sum to the GPU span of
the step (first timestamp to last), which the host's wall time per submit exceeds by
the submit, the fence wait and the last barrier. Ticks become nanoseconds through the
device's timestampPeriod; a device whose compute queue writes no timestamps is refused.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from poot.errors import UnsupportedOp

from poot_vulkan.device import BACKEND
from poot_vulkan.step import Copy, RecordedStep


@dataclass(frozen=True)
class OpTime:
    kind: str        # the kernel's name, "copy" or "upload"
    ns: float        # in the run of median span
    barrier: bool    # a barrier was recorded before it


@dataclass(frozen=True)
class KindTime:
    kind: str
    count: int
    ns: float        # summed over its operations
    barriers: int    # of its operations, those that waited on a barrier


@dataclass(frozen=True)
class StepProfile:
    ops: tuple[OpTime, ...]
    span_ns: float   # GPU span of the median run, first timestamp to last

    def by_kind(self) -> list[KindTime]:
        """Operations grouped by kind, the most time first."""
        acc: dict[str, list] = defaultdict(lambda: [0, 0.0, 0])
        for op in self.ops:
            a = acc[op.kind]
            a[0] += 1
            a[1] += op.ns
            a[2] += op.barrier
        rows = [KindTime(k, c, ns, b) for k, (c, ns, b) in acc.items()]
        return sorted(rows, key=lambda r: -r.ns)

    def table(self) -> str:
        total = sum(op.ns for op in self.ops)
        lines = [f"{'kind':44s} {'count':>5s} {'barriers':>8s} {'total us':>9s} "
                 f"{'mean us':>8s} {'share':>6s}"]
        for r in self.by_kind():
            lines.append(f"{r.kind[:44]:44s} {r.count:5d} {r.barriers:8d} {r.ns / 1e3:9.1f} "
                         f"{r.ns / r.count / 1e3:8.2f} {r.ns / total:6.1%}")
        lines.append(f"{'sum':44s} {len(self.ops):5d} {sum(o.barrier for o in self.ops):8d} "
                     f"{total / 1e3:9.1f}   (GPU span {self.span_ns / 1e3:.1f} us)")
        return "\n".join(lines)


def profile(step: RecordedStep, runs: int = 5) -> StepProfile:
    """Per-operation GPU times of `step` in the run of median span of `runs` (the step's
    effects happen `runs` times more)."""
    dev, vk = step.dev, step.vk
    period = dev.facts.timestamp_period
    if not period or not dev.timestamp_bits:
        raise UnsupportedOp(f"the Vulkan device {dev.name} writes no timestamps on its "
                            f"compute queue: no step profile", backend=BACKEND,
                            device=dev.name)
    ops = [op for batch in step.batches for op in batch]
    n = len(ops) + 1
    info = vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=n)
    pool = vk.vkCreateQueryPool(dev.device, info, None)
    cmd = dev.command_buffer()
    written = [0]

    def stamp(cmd, start: bool = False) -> None:
        if start:
            vk.vkCmdResetQueryPool(cmd, pool, 0, n)
        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, written[0])
        written[0] += 1

    try:
        step.record(cmd, stamp)
        ticks = vk.ffi.new("uint64_t[]", n)
        mask = np.uint64((1 << min(dev.timestamp_bits, 64)) - 1)
        runs_ns = []
        for _ in range(runs):
            dev.submit_and_wait(cmd)
            vk.vkGetQueryPoolResults(dev.device, pool, 0, n, 8 * n, ticks, 8,
                                     vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
            t = np.frombuffer(vk.ffi.buffer(ticks), np.uint64)
            runs_ns.append(((t[1:] - t[:-1]) & mask).astype(np.float64) * period)  # wraps
    finally:
        vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cmd])
        vk.vkDestroyQueryPool(dev.device, pool, None)
    per_op = sorted(runs_ns, key=lambda r: r.sum())[len(runs_ns) // 2]  # the median run
    uploads = {id(u) for u in step.uploads}
    firsts = {id(batch[0]) for batch in step.batches[1:]}
    times = tuple(OpTime(_kind(op, uploads), float(ns), id(op) in firsts)
                  for op, ns in zip(ops, per_op, strict=True))
    return StepProfile(times, float(per_op.sum()))


def _kind(op, uploads: set[int]) -> str:
    if isinstance(op, Copy):
        return "upload" if id(op) in uploads else "copy"
    return op.pipeline.name


__all__ = ["KindTime", "OpTime", "StepProfile", "profile"]
