"""Device memory of one plan: regions laid out once in arena buffers, at stable offsets.

A plan's tensors are regions of as few arena buffers as the adapter allows
(`max-buffer-size` each); a kernel binds each region it touches as its own
storage binding (offset, size), so a region must fit `max-storage-buffer-binding-size`
and start at `min-storage-buffer-offset-alignment`. Consts are written once, slots are
rewritten in place with `queue.write_buffer` (ordered before the next submit), and
results are read back with `queue.read_buffer`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from poot.errors import BindError, LimitExceeded

from poot_wgpu.device import WgpuDevice

BACKEND = "wgpu"
_WORD = 4


@dataclass(frozen=True)
class Region:
    """A named byte range of one arena buffer; `size` is padded to whole 32-bit words."""

    name: str
    arena: int
    offset: int
    size: int
    nbytes: int  # the tensor's own byte count (before padding)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class Arena:
    """Lays out named regions, allocates the arena buffers, reads and writes regions."""

    def __init__(self, dev: WgpuDevice, sizes: dict[str, int], label: str = "poot-plan"):
        import wgpu

        self.dev = dev
        align = dev.limit("min-storage-buffer-offset-alignment")
        max_buffer = dev.limit("max-buffer-size")
        self.regions: dict[str, Region] = {}
        arena_sizes: list[int] = [0]
        for name, nbytes in sizes.items():
            size = max(_align(int(nbytes), _WORD), _WORD)  # storage bindings: whole words
            if size > max_buffer:
                raise LimitExceeded(
                    f"tensor {name!r} needs {size} bytes, over the adapter's max-buffer-size "
                    f"{max_buffer}", backend=BACKEND, device=dev.name)
            offset = _align(arena_sizes[-1], align)
            if offset + size > max_buffer:  # start the next arena buffer
                arena_sizes.append(0)
                offset = 0
            self.regions[name] = Region(name, len(arena_sizes) - 1, offset, size, int(nbytes))
            arena_sizes[-1] = offset + size
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        self.buffers = [dev.device.create_buffer(label=f"{label}/{i}", size=max(s, _WORD),
                                                 usage=usage)
                        for i, s in enumerate(arena_sizes)]

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def region(self, name: str) -> Region:
        try:
            return self.regions[name]
        except KeyError:
            raise BindError(f"no buffer named {name!r} in this plan's arena") from None

    def binding(self, name: str) -> dict:
        """The bind-group resource for a region; refuses one over the binding limit."""
        r = self.region(name)
        limit = self.dev.limit("max-storage-buffer-binding-size")
        if r.size > limit:
            raise LimitExceeded(
                f"tensor {name!r} is {r.size} bytes, over the adapter's "
                f"max-storage-buffer-binding-size {limit}; a kernel cannot bind it whole",
                backend=BACKEND, device=self.dev.name)
        return {"buffer": self.buffers[r.arena], "offset": r.offset, "size": r.size}

    def write(self, name: str, data: np.ndarray) -> None:
        """Write a tensor's bytes in place (ordered before the next queue submit)."""
        r = self.region(name)
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if raw.size != r.nbytes:
            raise BindError(f"buffer {name!r} holds {r.nbytes} bytes, got {raw.size}")
        pad = (-raw.size) % _WORD  # write_buffer moves whole words
        if pad:
            raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
        self.dev.queue.write_buffer(self.buffers[r.arena], r.offset, raw)

    def read(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """Copy a region back to the host (waits for the queue)."""
        r = self.region(name)
        raw = self.dev.queue.read_buffer(self.buffers[r.arena], r.offset, r.size)
        return np.frombuffer(raw, np.uint8)[:r.nbytes].view(dtype).reshape(shape).copy()
