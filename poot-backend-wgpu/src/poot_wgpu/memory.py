"""Device buffers and host transfers on wgpu, within the adapter's limits.

Buffers are created once at their full size (stable for the life of a plan) with
STORAGE | COPY_SRC | COPY_DST usage. wgpu moves bytes in whole 32-bit words at
word-aligned offsets; `write` and `read` accept any byte range and merge the
partial words at its ends, so a 2-byte slot or an odd bf16 tensor never clobbers
its neighbours. A kernel binds a byte range of a buffer (`storage_binding`), which
must fit `max-storage-buffer-binding-size` and start at
`min-storage-buffer-offset-alignment`; otherwise a typed LimitExceeded.
"""
from __future__ import annotations

import numpy as np
from poot.errors import BindError, CapacityError, LimitExceeded
from poot.optional import require

from poot_wgpu.device import WgpuDevice

BACKEND = "wgpu"
WORD = 4


def align(n: int, a: int = WORD) -> int:
    return (n + a - 1) // a * a


class WgpuBuffer:
    """A device buffer (the poot.runtime Buffer protocol): `nbytes`, `label`, `gpu`."""

    def __init__(self, dev: WgpuDevice, nbytes: int, label: str):
        wgpu = require("wgpu")

        size = max(align(nbytes), WORD)
        cap = dev.limit("max-buffer-size")
        if size > cap:
            raise LimitExceeded(f"buffer {label!r} needs {size} bytes, over the adapter's "
                                f"max-buffer-size {cap}", backend=BACKEND, device=dev.name)
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        try:
            self.gpu = dev.device.create_buffer(label=label, size=size, usage=usage)
        except wgpu.GPUError as e:  # out of memory (or a driver refusal) at this size
            raise CapacityError(f"wgpu could not allocate {size} bytes for {label!r} on "
                                f"{dev.name}: {e}") from e
        self.nbytes, self.label = int(nbytes), label

    def __repr__(self) -> str:
        return f"WgpuBuffer({self.label!r}, {self.nbytes} bytes)"


def _check_range(buf: WgpuBuffer, offset: int, nbytes: int) -> None:
    if offset < 0 or offset + nbytes > buf.gpu.size:
        raise BindError(f"{nbytes} bytes at {offset} do not fit buffer {buf.label!r} "
                        f"({buf.nbytes} bytes)")


def write(dev: WgpuDevice, buf: WgpuBuffer, offset: int, array: np.ndarray) -> None:
    """Copy `array`'s bytes into `buf` at byte `offset` (ordered before the next submit)."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    _check_range(buf, offset, raw.size)
    start, end = offset - offset % WORD, align(offset + raw.size)
    if (start, end) != (offset, offset + raw.size):  # keep the bytes around a partial word
        window = read(dev, buf, start, end - start)
        window[offset - start:offset - start + raw.size] = raw
        raw = window
    if raw.size:
        dev.queue.write_buffer(buf.gpu, start, raw)


def read(dev: WgpuDevice, buf: WgpuBuffer, offset: int, nbytes: int) -> np.ndarray:
    """`nbytes` bytes of `buf` from `offset` as a fresh uint8 array (waits for the queue)."""
    _check_range(buf, offset, nbytes)
    start, end = offset - offset % WORD, align(offset + nbytes)
    if end == start:
        return np.zeros(0, np.uint8)
    raw = np.frombuffer(dev.queue.read_buffer(buf.gpu, start, end - start), np.uint8)
    return raw[offset - start:offset - start + nbytes].copy()


def storage_binding(dev: WgpuDevice, buf: WgpuBuffer, offset: int, size: int,
                    what: str) -> dict:
    """The bind-group resource of `size` bytes of `buf` at `offset`, checked against the
    adapter's limits (the size is rounded up to whole words: storage arrays hold words)."""
    size = max(align(size), WORD)
    limit = dev.limit("max-storage-buffer-binding-size")
    if size > limit:
        raise LimitExceeded(
            f"tensor {what!r} is {size} bytes, over the adapter's "
            f"max-storage-buffer-binding-size {limit}; a kernel cannot bind it whole",
            backend=BACKEND, device=dev.name)
    alignment = dev.limit("min-storage-buffer-offset-alignment")
    if offset % alignment:
        raise LimitExceeded(f"tensor {what!r} starts at byte {offset}, not a multiple of the "
                            f"adapter's min-storage-buffer-offset-alignment {alignment}",
                            backend=BACKEND, device=dev.name)
    if offset + size > buf.gpu.size:
        raise BindError(f"tensor {what!r} ({size} bytes at {offset}) runs past the end of "
                        f"buffer {buf.label!r} ({buf.gpu.size} bytes)")
    return {"buffer": buf.gpu, "offset": offset, "size": size}
