"""The one wgpu adapter and device of this process, opened on first use.

Setting up a wgpu device costs about a second on lavapipe, and every plan of a
process can share it, so it is opened once and cached. The device is requested
with the adapter's own limits (wgpu's defaults are lower: 16 KiB workgroup
storage, 256 MiB buffers) and with the optional features poot can use.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field

from poot.codegen.target import DOT4, WIDE_WORKGROUPS
from poot.errors import DeviceUnavailable, MissingPackage
from poot.optional import require

from poot_wgpu import env

#: optional features the kernels use when the adapter has them
WANTED_FEATURES = ("shader-f16", "subgroup")

#: WGSL language features the kernels use where the implementation has them
DOT4_LANGUAGE_FEATURE = "packed_4x8_integer_dot_product"
#: a module only an implementation with that feature compiles (wgpu-native reports no
#: language features, so where the list lacks it the device is asked to compile this)
DOT4_PROBE = ("@compute @workgroup_size(1) fn main() "
              "{ _ = dot4I8Packed(0x01020304u, 0x05060708u); }")

#: the limits the planner and the printer check; requested at the adapter's maximum
LIMIT_NAMES = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-workgroups-per-dimension",
    "min-storage-buffer-offset-alignment",
)


@dataclass(frozen=True)
class AdapterInfo:
    """What the adapter says about itself, in a form that needs no wgpu import to read."""

    name: str
    vendor: str
    backend_type: str
    adapter_type: str
    driver: str
    features: frozenset[str] = field(default_factory=frozenset)
    limits: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        return (f"{self.name} ({self.vendor}, {self.adapter_type}, {self.backend_type}; "
                f"{self.driver})")


class WgpuDevice:
    """A wgpu device and its queue, with the adapter facts the backend decides by."""

    def __init__(self, adapter, device, info: AdapterInfo):
        self.adapter, self.device, self.queue, self.info = adapter, device, device.queue, info
        self.features = frozenset(str(f) for f in device.features)
        self.limits = {name: int(device.limits[name]) for name in LIMIT_NAMES}
        self.language_features = language_features(device)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def is_software(self) -> bool:
        """A CPU adapter (Mesa llvmpipe/lavapipe), as `poot.contract.Device.is_software`."""
        return self.info.adapter_type.lower() == "cpu"

    def has(self, feature: str) -> bool:
        return feature in self.features

    def limit(self, name: str) -> int:
        return self.limits[name]

    def __repr__(self) -> str:
        return f"WgpuDevice({self.info.describe()})"


def target_features(dev: WgpuDevice) -> frozenset[str]:
    """The optional statement families (poot.codegen.target) printed for `dev`: DOT4
    where the implementation has WGSL's packed 4 x 8-bit dot products; WIDE_WORKGROUPS
    where a GPU adapter launches 1024 invocations (`wide_workgroups`)."""
    dot4 = {DOT4} if DOT4_LANGUAGE_FEATURE in dev.language_features else set()
    return frozenset(dot4 | ({WIDE_WORKGROUPS} if wide_workgroups(dev) else set()))


def wide_workgroups(dev: WgpuDevice) -> bool:
    """A GPU adapter whose workgroups take 1024 invocations: decode attention then walks a
    cache of up to 1024 keys in one dispatch instead of splits and a merge dispatch that
    waits for them. Not on a CPU adapter (its workgroup barriers cost by the invocation),
    nor with POOT_LEVEL_CUTS=off (`poot_wgpu.env.level_cuts`)."""
    return (not dev.is_software and env.level_cuts()
            and dev.limit("max-compute-invocations-per-workgroup") >= 1024
            and dev.limit("max-compute-workgroup-size-x") >= 1024)


def language_features(device) -> frozenset[str]:
    """The WGSL language features of the implementation behind `device` that poot uses:
    those it reports, and dot4I8Packed where it compiles the probe."""
    wgpu = require("wgpu")
    reported = frozenset(str(f) for f in getattr(wgpu.gpu, "wgsl_language_features", ()))
    if DOT4_LANGUAGE_FEATURE in reported:
        return reported
    try:
        device.create_shader_module(code=DOT4_PROBE)
    except Exception:  # wgpu raises its validation errors as several exception types
        return reported
    return reported | {DOT4_LANGUAGE_FEATURE}


_lock = threading.Lock()


def _import_wgpu():
    wanted = env.configure()
    try:
        wgpu = require("wgpu")
    except MissingPackage as e:
        raise DeviceUnavailable(f"no wgpu device: {e}") from None
    env.quiet_pinned_backend_notice()
    return wgpu, wanted


def adapter_info(adapter) -> AdapterInfo:
    info = adapter.info
    return AdapterInfo(
        name=str(info.get("device", "")) or "unknown adapter",
        vendor=str(info.get("vendor", "")),
        backend_type=str(info.get("backend_type", "")),
        adapter_type=str(info.get("adapter_type", "")),
        driver=str(info.get("description", "")),
        features=frozenset(str(f) for f in adapter.features),
        limits={k: int(v) for k, v in dict(adapter.limits).items() if isinstance(v, int)},
    )


def _open_adapter():
    wgpu, wanted = _import_wgpu()
    if wanted not in env.ACCEPTED_BACKENDS:
        raise DeviceUnavailable(
            f"no wgpu device: {env.BACKEND_VAR}={wanted} is not a compute backend poot runs "
            f"on (accepted: {', '.join(env.ACCEPTED_BACKENDS)})")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # wgpu-native raises plain RuntimeErrors when no driver loads
        raise DeviceUnavailable(
            f"no wgpu device: no {wanted} adapter ({type(e).__name__}: {e}); on Linux without "
            f"a GPU install Mesa lavapipe (scripts/install-lavapipe.sh)") from e
    if adapter is None:
        raise DeviceUnavailable(f"no wgpu device: wgpu found no {wanted} adapter")
    info = adapter_info(adapter)
    if info.backend_type != wanted:  # the silent OpenGL fallback
        raise DeviceUnavailable(
            f"no wgpu device: asked for a {wanted} adapter, wgpu gave {info.describe()}; "
            f"refusing the fallback")
    return adapter, info


@functools.cache
def _open() -> WgpuDevice:
    adapter, info = _open_adapter()
    features = [f for f in WANTED_FEATURES if f in info.features]
    limits = {name: info.limits[name] for name in LIMIT_NAMES if name in info.limits}
    try:
        device = adapter.request_device_sync(
            label="poot", required_features=features, required_limits=limits)
    except Exception as e:
        raise DeviceUnavailable(
            f"no wgpu device: {info.describe()} refused a device ({type(e).__name__}: {e})"
        ) from e
    return WgpuDevice(adapter, device, info)


def open_device() -> WgpuDevice:
    """The process's device; raises DeviceUnavailable (cached: the reason does not change)."""
    with _lock:
        return _cached_or_raise()


_failure: DeviceUnavailable | None = None


def _cached_or_raise() -> WgpuDevice:
    global _failure
    if _failure is not None:
        raise _failure
    try:
        return _open()
    except DeviceUnavailable as e:
        _failure = e
        raise
