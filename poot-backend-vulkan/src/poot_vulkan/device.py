"""The Vulkan instance, the physical devices it finds, and one logical device per index.

Devices are ranked discrete GPU > integrated GPU > virtual GPU > CPU (Mesa lavapipe):
`probe` lists them in that order, and poot picks a software (CPU) device only when the
backend is named (`poot.plugin.select_backend` skips `Device.is_software`). What each
device can do is read once into `DeviceFacts` (features, subgroup properties, limits,
extensions, memory types): the capability table and the printer decide from it.

The `vulkan` binding (cffi) frees a nested struct built inline before the call runs, so
every create-info that holds pointers is kept in a local variable until its call returns.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import threading
from dataclasses import dataclass, field

from poot.errors import DeviceUnavailable, MissingPackage
from poot.optional import require
from poot.paths import private_runtime_dir

BACKEND = "vulkan"
API_VERSION = (1, 2)  # Vulkan12Features/Vulkan11Features and SPIR-V 1.5
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
VALIDATION_VAR = "POOT_VULKAN_VALIDATION"
#: "off" compiles as before issue 56's level cuts (wide workgroups, attention over the
#: fresh keys): the A/B switch of the device benches
LEVEL_CUTS_VAR = "POOT_LEVEL_CUTS"

#: device types by preference (VkPhysicalDeviceType values)
TYPE_NAMES = {2: "discrete", 1: "integrated", 3: "virtual", 4: "cpu", 0: "other"}
RANK = {2: 0, 1: 1, 3: 2, 0: 3, 4: 4}

#: subgroup operation bits (VkSubgroupFeatureFlagBits)
SUBGROUP_OPS = {"basic": 0x1, "vote": 0x2, "arithmetic": 0x4, "ballot": 0x8, "shuffle": 0x10,
                "shuffle_relative": 0x20, "clustered": 0x40, "quad": 0x80}

#: device extensions that add what poot declares (enabled when present)
BF16_EXTENSION = "VK_KHR_shader_bfloat16"
COOPMAT_EXTENSION = "VK_KHR_cooperative_matrix"
#: a pipeline may require its subgroup size (core in 1.3; poot's instance asks for 1.2)
SUBGROUP_SIZE_EXTENSION = "VK_EXT_subgroup_size_control"
#: packed 4 x 8-bit integer dot products (SPIR-V SUDot; core in 1.3, an extension to 1.2)
INTEGER_DOT_EXTENSION = "VK_KHR_shader_integer_dot_product"
#: the driver runs SUDot on packed words as fast as (or faster than) its plain arithmetic
SUDOT_ACCELERATED = "integerDotProduct4x8BitPackedMixedSignednessAccelerated"
#: vkCmdPipelineBarrier2 (core in 1.3): a barrier form to compare (poot_vulkan.barrier)
SYNC2_EXTENSION = "VK_KHR_synchronization2"


@dataclass(frozen=True)
class DeviceFacts:
    """What one physical device reports, in plain Python (no cffi objects)."""

    index: int                   # position in poot's ranked list
    name: str
    device_type: str             # discrete, integrated, virtual, cpu, other
    vendor_id: int
    driver: str
    api_version: tuple[int, int, int]
    features: frozenset[str]     # shaderFloat16, shaderInt8, shaderInt16, ...
    subgroup_size: int
    subgroup_ops: frozenset[str]
    extensions: frozenset[str] = field(default_factory=frozenset)
    limits: dict[str, int] = field(default_factory=dict)
    #: nanoseconds per timestamp tick (VkPhysicalDeviceLimits.timestampPeriod); 0 where
    #: compute queues write no timestamps (timestampComputeAndGraphics off)
    timestamp_period: float = 0.0

    def has(self, feature: str) -> bool:
        return feature in self.features

    def limit(self, name: str) -> int:
        return self.limits[name]

    @property
    def is_software(self) -> bool:
        return self.device_type == "cpu"

    def describe(self) -> str:
        major, minor, patch = self.api_version
        return (f"{self.name} ({self.device_type}, Vulkan {major}.{minor}.{patch}, "
                f"{self.driver}, subgroup {self.subgroup_size})")


def import_vulkan():
    private_runtime_dir("vulkan")
    try:
        vk = require("vulkan")
    except MissingPackage as e:
        raise DeviceUnavailable(f"no Vulkan device: {e}") from None
    except OSError as e:  # the binding found no libvulkan loader
        raise DeviceUnavailable(f"no Vulkan device: the Vulkan loader is missing "
                                f"({type(e).__name__}: {e}); on Debian install "
                                f"libvulkan1 and a driver (mesa-vulkan-drivers)") from e
    return vk


def level_cuts() -> bool:
    """Whether the level cuts are on (POOT_LEVEL_CUTS is not "off")."""
    return os.environ.get(LEVEL_CUTS_VAR, "") != "off"


def validation_wanted(vk) -> bool:
    """Validation layers: on when POOT_VULKAN_VALIDATION=1 and the layer is installed."""
    if os.environ.get(VALIDATION_VAR, "") not in ("1", "true", "yes"):
        return False
    names = {p.layerName for p in vk.vkEnumerateInstanceLayerProperties()}
    return VALIDATION_LAYER in names


class Instance:
    """The process's VkInstance (one per process; created on first use)."""

    def __init__(self):
        vk = self.vk = import_vulkan()
        self.layers = [VALIDATION_LAYER] if validation_wanted(vk) else []
        extensions = ["VK_EXT_debug_utils"] if self.layers else []
        #: validation warnings and errors, in order (tests assert there are none)
        self.validation_messages: list[str] = []
        app = vk.VkApplicationInfo(pApplicationName="poot", applicationVersion=1,
                                   pEngineName="poot", engineVersion=1,
                                   apiVersion=vk.VK_MAKE_VERSION(*API_VERSION, 0))
        info = vk.VkInstanceCreateInfo(pApplicationInfo=app, enabledLayerCount=len(self.layers),
                                       ppEnabledLayerNames=self.layers or None,
                                       enabledExtensionCount=len(extensions),
                                       ppEnabledExtensionNames=extensions or None)
        try:
            self.handle = vk.vkCreateInstance(info, None)
        except Exception as e:  # VkErrorIncompatibleDriver etc.: no driver at all
            raise DeviceUnavailable(f"no Vulkan device: vkCreateInstance failed "
                                    f"({type(e).__name__}: {e}); install a Vulkan driver "
                                    f"(mesa-vulkan-drivers gives lavapipe)") from e
        if self.layers:
            self._messenger = self._listen()
        physical = list(vk.vkEnumeratePhysicalDevices(self.handle))
        facts = [(read_facts(vk, pd, i), pd) for i, pd in enumerate(physical)]
        facts = [(f, pd) for f, pd in facts if f.api_version[:2] >= API_VERSION]
        facts.sort(key=lambda fp: (RANK.get(_type_code(fp[0].device_type), 9), fp[0].index))
        self.devices = [(_reindex(f, i), pd) for i, (f, pd) in enumerate(facts)]


    def _listen(self):
        vk = self.vk

        def collect(severity, kinds, data, user):
            self.validation_messages.append(vk.ffi.string(data.pMessage).decode())
            return 0

        self._callback = collect  # the binding calls it through a cffi callback
        info = vk.VkDebugUtilsMessengerCreateInfoEXT(
            messageSeverity=vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            messageType=vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT,
            pfnUserCallback=collect)
        create = vk.vkGetInstanceProcAddr(self.handle, "vkCreateDebugUtilsMessengerEXT")
        return create(self.handle, info, None)


def _type_code(name: str) -> int:
    return next(k for k, v in TYPE_NAMES.items() if v == name)


def _reindex(f: DeviceFacts, i: int) -> DeviceFacts:
    return dataclasses.replace(f, index=i)


def read_facts(vk, pd, index: int) -> DeviceFacts:
    props = vk.vkGetPhysicalDeviceProperties(pd)
    v = props.apiVersion
    api = (v >> 22, (v >> 12) & 0x3FF, v & 0xFFF)
    extensions = frozenset(e.extensionName for e in
                           vk.vkEnumerateDeviceExtensionProperties(pd, None))
    features: set[str] = set()
    sizes: dict[str, int] = {}
    subgroup_size, ops = 1, frozenset()
    driver = ""
    if api[:2] >= API_VERSION:
        v12 = vk.VkPhysicalDeviceVulkan12Features()
        v11 = vk.VkPhysicalDeviceVulkan11Features(pNext=v12)
        f2 = vk.VkPhysicalDeviceFeatures2(pNext=v11)
        vk.vkGetPhysicalDeviceFeatures2(pd, f2)
        for name in ("shaderFloat16", "shaderInt8", "storageBuffer8BitAccess",
                     "timelineSemaphore", "bufferDeviceAddress"):
            if getattr(v12, name):
                features.add(name)
        if v11.storageBuffer16BitAccess:
            features.add("storageBuffer16BitAccess")
        for name in ("shaderInt16", "shaderInt64", "shaderFloat64"):
            if getattr(f2.features, name):
                features.add(name)
        sub = vk.VkPhysicalDeviceSubgroupProperties()
        drv = vk.VkPhysicalDeviceDriverProperties(pNext=sub)
        p2 = vk.VkPhysicalDeviceProperties2(pNext=drv)
        vk.vkGetPhysicalDeviceProperties2(pd, p2)
        compute = bool(sub.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT)
        if SUBGROUP_SIZE_EXTENSION in extensions:
            features |= _subgroup_size_control(vk, pd, sizes)
        if INTEGER_DOT_EXTENSION in extensions:
            dot = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures()
            vk.vkGetPhysicalDeviceFeatures2(pd, vk.VkPhysicalDeviceFeatures2(pNext=dot))
            if dot.shaderIntegerDotProduct:
                features.add("shaderIntegerDotProduct")
                speed = vk.VkPhysicalDeviceShaderIntegerDotProductProperties()
                vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=speed))
                if speed.integerDotProduct4x8BitPackedMixedSignednessAccelerated:
                    features.add(SUDOT_ACCELERATED)
        if SYNC2_EXTENSION in extensions:
            sync2 = vk.VkPhysicalDeviceSynchronization2Features()
            vk.vkGetPhysicalDeviceFeatures2(pd, vk.VkPhysicalDeviceFeatures2(pNext=sync2))
            if sync2.synchronization2:
                features.add("synchronization2")
        subgroup_size = int(sub.subgroupSize)
        ops = frozenset(k for k, bit in SUBGROUP_OPS.items()
                        if compute and sub.supportedOperations & bit)
        driver = " ".join(vk.ffi.string(x).decode() for x in (drv.driverName, drv.driverInfo))
    if BF16_EXTENSION in extensions:
        features.add("shaderBFloat16")
    if COOPMAT_EXTENSION in extensions:
        features.add("cooperativeMatrix")
    lim = props.limits
    memory = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    device_heap = max((memory.memoryHeaps[i].size for i in range(memory.memoryHeapCount)
                       if memory.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT),
                      default=0)
    limits = {
        "maxStorageBufferRange": int(lim.maxStorageBufferRange),
        "minStorageBufferOffsetAlignment": int(lim.minStorageBufferOffsetAlignment),
        "maxComputeSharedMemorySize": int(lim.maxComputeSharedMemorySize),
        "maxComputeWorkGroupInvocations": int(lim.maxComputeWorkGroupInvocations),
        **{f"maxComputeWorkGroupSize.{a}": int(lim.maxComputeWorkGroupSize[i])
           for i, a in enumerate("xyz")},
        **{f"maxComputeWorkGroupCount.{a}": int(lim.maxComputeWorkGroupCount[i])
           for i, a in enumerate("xyz")},
        "maxPerStageDescriptorStorageBuffers": int(lim.maxPerStageDescriptorStorageBuffers),
        "maxPushConstantsSize": int(lim.maxPushConstantsSize),
        "maxMemoryAllocationCount": int(lim.maxMemoryAllocationCount),
        "nonCoherentAtomSize": int(lim.nonCoherentAtomSize),
        "deviceLocalHeapBytes": int(device_heap),
        **sizes,
    }
    return DeviceFacts(
        index=index, name=str(props.deviceName),
        device_type=TYPE_NAMES.get(int(props.deviceType), "other"),
        vendor_id=int(props.vendorID), driver=driver.strip(), api_version=api,
        features=frozenset(features), subgroup_size=subgroup_size, subgroup_ops=ops,
        extensions=extensions, limits=limits,
        timestamp_period=float(lim.timestampPeriod) if lim.timestampComputeAndGraphics else 0.0)


def _subgroup_size_control(vk, pd, sizes: dict) -> set[str]:
    """subgroupSizeControl (where compute pipelines may require a subgroup size) and
    computeFullSubgroups; the size range and maxComputeWorkgroupSubgroups into `sizes`."""
    want = vk.VkPhysicalDeviceSubgroupSizeControlFeatures()
    f2 = vk.VkPhysicalDeviceFeatures2(pNext=want)
    vk.vkGetPhysicalDeviceFeatures2(pd, f2)
    props = vk.VkPhysicalDeviceSubgroupSizeControlProperties()
    p2 = vk.VkPhysicalDeviceProperties2(pNext=props)
    vk.vkGetPhysicalDeviceProperties2(pd, p2)
    sizes.update(minSubgroupSize=int(props.minSubgroupSize),
                 maxSubgroupSize=int(props.maxSubgroupSize),
                 maxComputeWorkgroupSubgroups=int(props.maxComputeWorkgroupSubgroups))
    out = set()
    if want.subgroupSizeControl and props.requiredSubgroupSizeStages & \
            vk.VK_SHADER_STAGE_COMPUTE_BIT:
        out.add("subgroupSizeControl")
    if want.computeFullSubgroups:
        out.add("computeFullSubgroups")
    return out


_lock = threading.RLock()
_failure: DeviceUnavailable | None = None


@functools.cache
def _instance() -> Instance:
    return Instance()


def instance() -> Instance:
    """The process's instance; raises DeviceUnavailable (cached: the reason stays)."""
    global _failure
    with _lock:
        if _failure is not None:
            raise _failure
        try:
            return _instance()
        except DeviceUnavailable as e:
            _failure = e
            raise


def physical_devices() -> list[DeviceFacts]:
    """Every usable device, ranked; devices under Vulkan 1.2 are left out."""
    return [f for f, _ in instance().devices]


@functools.cache
def _open(index: int):
    from poot_vulkan.context import VulkanDevice

    inst = instance()
    if not 0 <= index < len(inst.devices):
        raise DeviceUnavailable(f"backend vulkan has no device {index} "
                                f"({len(inst.devices)} found)")
    facts, pd = inst.devices[index]
    return VulkanDevice(inst, pd, facts)


def open_device(index: int = 0):
    """The logical device of ranked device `index` (opened once per process)."""
    with _lock:
        return _open(index)
