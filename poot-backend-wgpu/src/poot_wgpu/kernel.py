"""Compiled WGSL kernels and the dispatches that bind them to a plan's regions.

A kernel is a shader module and compute pipeline, cached per device by its source
(naga compiles on the first use of a source only). The printer declares every binding
`var<storage, read_write>`; a dispatch binds read-only (`var<storage, read>`, a
read-only-storage layout entry) each buffer the kernel only reads there. wgpu tracks
usage per buffer, per dispatch: a dispatch waits for the last one that bound a buffer it
binds unless both bound it read-only, so a weight, a slot or a value that several
dispatches read does not order them. A buffer the dispatch also writes through another
binding stays read_write (read-only beside read_write of one buffer in one dispatch is a
usage conflict).
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.errors import LimitExceeded, LoweringError
from poot.optional import require

from poot_wgpu.device import WgpuDevice
from poot_wgpu.memory import BACKEND


def read_only(resources, writes) -> tuple[bool, ...]:
    """Per binding of a dispatch: whether it can be bound read-only (the kernel does not
    write it, nor any range of its buffer through another binding)."""
    written = {id(r["buffer"]) for r, w in zip(resources, writes, strict=True) if w}
    return tuple(not w and id(r["buffer"]) not in written
                 for r, w in zip(resources, writes, strict=True))


def with_read_only(source: str, readonly: tuple[bool, ...], label: str) -> str:
    """`source` with the bindings `readonly` marks declared `var<storage, read>`."""
    for i, ro in enumerate(readonly):
        if not ro:
            continue
        decl = f"@group(0) @binding({i}) var<storage, read_write> "
        if source.count(decl) != 1:
            raise LoweringError(f"kernel {label!r}: binding {i} is not declared as "
                                f"{decl.strip()!r}; cannot bind it read-only",
                                backend=BACKEND)
        source = source.replace(decl, f"@group(0) @binding({i}) var<storage, read> ")
    return source


class Kernel:
    """One compiled WGSL entry point with `n_bindings` storage bindings in group 0, those
    `readonly` marks bound read-only."""

    def __init__(self, dev: WgpuDevice, source: str, n_bindings: int, entry: str = "main",
                 label: str = "kernel", readonly: tuple[bool, ...] = ()):
        wgpu = require("wgpu")

        limit = dev.limit("max-storage-buffers-per-shader-stage")
        if n_bindings > limit:
            raise LimitExceeded(
                f"kernel {label!r} binds {n_bindings} buffers, over the adapter's "
                f"max-storage-buffers-per-shader-stage {limit}", backend=BACKEND,
                device=dev.name)
        readonly = readonly or (False,) * n_bindings
        source = with_read_only(source, readonly, label)
        self.dev, self.source, self.label, self.n_bindings = dev, source, label, n_bindings
        self.readonly = readonly
        kinds = (wgpu.BufferBindingType.storage, wgpu.BufferBindingType.read_only_storage)
        try:
            module = dev.device.create_shader_module(label=label, code=source)
            entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": kinds[ro]}} for i, ro in enumerate(readonly)]
            self.layout = dev.device.create_bind_group_layout(entries=entries)
            pipeline_layout = dev.device.create_pipeline_layout(
                bind_group_layouts=[self.layout])
            self.pipeline = dev.device.create_compute_pipeline(
                label=label, layout=pipeline_layout,
                compute={"module": module, "entry_point": entry})
        except wgpu.GPUError as e:  # naga or pipeline validation: a printer bug or a limit
            raise LoweringError(f"wgpu rejected kernel {label!r}: {e}\n--- source ---\n"
                                f"{source}", backend=BACKEND, device=dev.name) from e

    def bind(self, resources: list[dict]):
        """A bind group of this kernel over buffer ranges ({buffer, offset, size}), in
        binding order."""
        if len(resources) != self.n_bindings:
            raise LoweringError(f"kernel {self.label!r} has {self.n_bindings} bindings, "
                                f"got {len(resources)} buffers", backend=BACKEND,
                                device=self.dev.name)
        entries = [{"binding": i, "resource": r} for i, r in enumerate(resources)]
        return self.dev.device.create_bind_group(layout=self.layout, entries=entries)


class KernelCache:
    """Kernels by (source, bindings, entry, read-only bindings), per device; the key is
    the printed source."""

    def __init__(self, dev: WgpuDevice):
        self.dev = dev
        self._kernels: dict[tuple, Kernel] = {}

    def get(self, source: str, n_bindings: int, entry: str = "main",
            label: str = "kernel", readonly: tuple[bool, ...] = ()) -> Kernel:
        key = (source, n_bindings, entry, readonly if any(readonly) else ())
        if key not in self._kernels:
            self._kernels[key] = Kernel(self.dev, source, n_bindings, entry, label, key[3])
        return self._kernels[key]

    def __len__(self) -> int:
        return len(self._kernels)


def dispatches_for(cache: KernelCache, printed, resolve) -> list[Dispatch]:
    """Compile (or reuse) each printed kernel and bind its buffers; `resolve(BufferParam)` gives
    the bind-group resource of one of the kernel's buffer parameters."""
    return [bind(cache, p, [resolve(b) for b in p.buffers],
                 tuple(b.access.writable for b in p.buffers)) for p in printed]


def bind(cache: KernelCache, printed, resources: list[dict], writes: tuple[bool, ...]):
    """The dispatch of printed kernel `printed` over `resources` (one per buffer parameter),
    of which it writes those `writes` marks; the others are bound read-only where
    `read_only` allows."""
    kernel = cache.get(printed.source, len(printed.buffers), label=printed.name,
                       readonly=read_only(resources, writes))
    return Dispatch(kernel, kernel.bind(list(resources)), printed.groups, tuple(resources),
                    writes)


@dataclass(frozen=True)
class Dispatch:
    """One recorded dispatch: pipeline, bind group and workgroup counts (x, y, z); for
    readers of the plan, the bound ranges ({buffer, offset, size} per binding) and which
    of them the kernel writes (the others are bound read-only where `read_only` allows)."""

    kernel: Kernel
    bind_group: object
    groups: tuple[int, int, int]
    resources: tuple[dict, ...] = ()
    writes: tuple[bool, ...] = ()


def workgroup_grid(dev: WgpuDevice, n_groups: int) -> tuple[int, int, int]:
    """Spread `n_groups` workgroups over x and y within max-compute-workgroups-per-dimension.

    A kernel reads its linear group id as `wid.x + wid.y * nwg.x` and returns early
    when that id is >= n_groups (x * y can exceed n_groups by less than one row).
    """
    cap = dev.limit("max-compute-workgroups-per-dimension")
    if n_groups <= cap:
        return (max(n_groups, 1), 1, 1)
    y = -(-n_groups // cap)
    if y > cap:
        raise LimitExceeded(f"{n_groups} workgroups exceed {cap} x {cap}", backend=BACKEND,
                            device=dev.name)
    return (-(-n_groups // y), y, 1)


def dispatch_groups(kernel, dev: WgpuDevice) -> tuple[int, int, int]:
    """The workgroup counts a kernel program is dispatched with: its grid, or the grid
    folded by `workgroup_grid` when an axis is over the adapter's limit."""
    if max(kernel.grid3()) > dev.limit("max-compute-workgroups-per-dimension"):
        return workgroup_grid(dev, kernel.groups)
    return kernel.grid3()


def check_limits(k, dev: WgpuDevice) -> None:
    """LimitExceeded when kernel program `k` does not fit the adapter's limits."""
    lim = dev.limits

    def over(msg: str):
        raise LimitExceeded(f"kernel {k.name}: {msg}", backend=BACKEND, device=dev.name)

    for axis, size in zip("xyz", k.workgroup3(), strict=True):
        if size > lim[f"max-compute-workgroup-size-{axis}"]:
            over(f"workgroup {k.workgroup} is over max-compute-workgroup-size-{axis} "
                 f"{lim[f'max-compute-workgroup-size-{axis}']}")
    cap = lim["max-compute-invocations-per-workgroup"]
    if k.threads_per_group > cap:
        over(f"{k.threads_per_group} threads per workgroup, over "
             f"max-compute-invocations-per-workgroup {cap}")
    cap = lim["max-storage-buffer-binding-size"]
    for b in k.buffers:
        if b.nbytes > cap:
            over(f"buffer {b.name!r} is {b.nbytes} bytes, over "
                 f"max-storage-buffer-binding-size {cap}")
    shared = sum(a.count * a.dtype.itemsize for a in k.shared)
    if k.reductions():
        shared += 4 * k.threads_per_group * len({s.value.dtype for s in k.reductions()})
    cap = lim["max-compute-workgroup-storage-size"]
    if shared > cap:
        over(f"{shared} bytes of workgroup memory, over "
             f"max-compute-workgroup-storage-size {cap}")
    cap = lim["max-storage-buffers-per-shader-stage"]
    if len(k.buffers) > cap:
        over(f"{len(k.buffers)} buffers, over max-storage-buffers-per-shader-stage {cap}")
