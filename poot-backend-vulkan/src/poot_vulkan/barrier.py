"""The pipeline barrier a recorded step puts between two dependent batches, in one of
three forms (for comparing them on a device; every form is correct):

- "narrow" (the default): one global VkMemoryBarrier through vkCmdPipelineBarrier naming
  only the stages and accesses of the two batches (compute shader writes to compute shader
  reads and writes; transfer added only beside a copy).
- "sync2": the same dependency through vkCmdPipelineBarrier2 (VK_KHR_synchronization2),
  whose stage and access bits are finer (shader storage writes to storage reads and
  writes); only where the device has the extension, which the logical device then enables.
- "wide": every stage and access of the step, host included (poot_vulkan.memory's full
  barrier).

An earlier batch's writes were made available by the barrier after it, and each barrier's
visibility operation covers every available write, so none names more than the two batches
beside it. POOT_VULKAN_BARRIER picks the form for the process (read once).
"""
from __future__ import annotations

import functools
import os

from poot.errors import RequestError, UnsupportedOp

from poot_vulkan.device import BACKEND, SYNC2_EXTENSION
from poot_vulkan.memory import full_barrier

FORMS = ("narrow", "sync2", "wide")
FORM_VAR = "POOT_VULKAN_BARRIER"


@functools.cache
def chosen_form() -> str:
    """The form POOT_VULKAN_BARRIER names ("narrow" when unset)."""
    form = os.environ.get(FORM_VAR, "") or "narrow"
    if form not in FORMS:
        raise RequestError(f"{FORM_VAR}={form!r}: the barrier form is one of {FORMS}")
    return form


def check_form(dev, form: str) -> str:
    """`form` where the device can record it, else a typed refusal."""
    if form not in FORMS:
        raise RequestError(f"barrier form {form!r} is not one of {FORMS}")
    if form == "sync2" and dev.barrier2 is None:
        raise UnsupportedOp(f"barrier form sync2 needs {SYNC2_EXTENSION} with its "
                            f"synchronization2 feature, which the device lacks",
                            backend=BACKEND, device=dev.name)
    return form


def _uses(vk, ops, copy_type, sync2: bool, src: bool) -> tuple[int, int]:
    """(stages, accesses) of `ops` as the first (`src`) or second scope of a barrier."""
    stages = accesses = 0
    for op in ops:
        if isinstance(op, copy_type):
            stages |= vk.VK_PIPELINE_STAGE_2_COPY_BIT_KHR if sync2 else \
                vk.VK_PIPELINE_STAGE_TRANSFER_BIT
            accesses |= (vk.VK_ACCESS_TRANSFER_WRITE_BIT if src else
                         vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
        elif sync2:
            stages |= vk.VK_PIPELINE_STAGE_2_COMPUTE_SHADER_BIT_KHR
            accesses |= (vk.VK_ACCESS_2_SHADER_STORAGE_WRITE_BIT_KHR if src else
                         vk.VK_ACCESS_2_SHADER_STORAGE_READ_BIT_KHR
                         | vk.VK_ACCESS_2_SHADER_STORAGE_WRITE_BIT_KHR)
        else:
            stages |= vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
            accesses |= (vk.VK_ACCESS_SHADER_WRITE_BIT if src else
                         vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
    return stages, accesses


def record_barrier(dev, cmd, form: str, before: list, after: list, copy_type) -> None:
    """The barrier of `form` from batch `before` (its writes) to batch `after`;
    `copy_type` is the class of a transfer operation (the rest are dispatches)."""
    vk = dev.vk
    if form == "wide":
        full_barrier(vk, cmd)
        return
    sync2 = form == "sync2"
    src_stage, src_access = _uses(vk, before, copy_type, sync2, src=True)
    dst_stage, dst_access = _uses(vk, after, copy_type, sync2, src=False)
    if sync2:
        barrier = vk.VkMemoryBarrier2(srcStageMask=src_stage, srcAccessMask=src_access,
                                      dstStageMask=dst_stage, dstAccessMask=dst_access)
        info = vk.VkDependencyInfo(memoryBarrierCount=1, pMemoryBarriers=[barrier])
        dev.barrier2(cmd, info)
        return
    barrier = vk.VkMemoryBarrier(srcAccessMask=src_access, dstAccessMask=dst_access)
    vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, [barrier], 0, None, 0, None)


__all__ = ["FORMS", "FORM_VAR", "check_form", "chosen_form", "record_barrier"]
