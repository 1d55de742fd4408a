"""Physical devices: enumeration, the queried DeviceProfile, and selection.

Why a profile: the planner must know the limits of the device it plans for (workgroup
memory, grid, binding range, alignment...). Everything here is read-only queries; nothing is
created, so listing devices never leaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import vulkan as vk

from pootvk.errors import DeviceNotFound
from pootvk.plan.profile import DeviceProfile

from .instance import instance, version_string

ffi = vk.ffi

DEVICE_TYPES = {
    vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: "discrete",
    vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: "integrated",
    vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: "virtual",
    vk.VK_PHYSICAL_DEVICE_TYPE_CPU: "cpu",
}
#: Default preference when no selector is given: best kind first.
TYPE_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}


@dataclass(frozen=True)
class PhysicalDeviceInfo:
    """One Vulkan physical device as pootvk sees it (index in enumeration order)."""

    index: int
    name: str
    device_type: str
    profile: DeviceProfile
    handle: Any = field(repr=False, compare=False, default=None)
    extensions: frozenset[str] = field(repr=False, compare=False, default=frozenset())


def struct_chain(*structs: tuple[str, int, dict[str, Any]]) -> list[Any]:
    """ffi-allocate structs (``(ctype, sType, fields)``) linked through pNext, the first
    one the head; the caller keeps the list alive."""
    out: list[Any] = []
    nxt: Any = ffi.NULL
    for ctype, stype, init in reversed(structs):
        p = ffi.new(ctype + "*", {"sType": stype, "pNext": nxt, **init})
        out.append(p)
        nxt = p
    out.reverse()
    return out


def device_extensions(handle: Any) -> frozenset[str]:
    return frozenset(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(handle, None))


def features_16bit(handle: Any, api: int, exts: frozenset[str]) -> tuple[bool, bool]:
    """(storageBuffer16BitAccess, shaderFloat16) through vkGetPhysicalDeviceFeatures2."""
    structs = [
        (
            "VkPhysicalDeviceFeatures2",
            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
            {},
        ),
        (
            "VkPhysicalDevice16BitStorageFeatures",
            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
            {},
        ),
    ]
    has_f16 = api >= vk.VK_MAKE_VERSION(1, 2, 0) or "VK_KHR_shader_float16_int8" in exts
    if has_f16:
        structs.append(
            (
                "VkPhysicalDeviceShaderFloat16Int8Features",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
                {},
            )
        )
    chain = struct_chain(*structs)
    vk.lib.vkGetPhysicalDeviceFeatures2(handle, chain[0])
    storage16 = bool(chain[1].storageBuffer16BitAccess)
    float16 = bool(chain[2].shaderFloat16) if has_f16 else False
    return storage16, float16


PIPELINE_EXECUTABLE_EXT = "VK_KHR_pipeline_executable_properties"


def pipeline_executable_info(handle: Any, exts: frozenset[str]) -> bool:
    """Whether the device exposes VK_KHR_pipeline_executable_properties *and* its
    pipelineExecutableInfo feature: then a pipeline created with CAPTURE_STATISTICS reports
    the driver's per-executable statistics (registers, spills, instructions...)."""
    if PIPELINE_EXECUTABLE_EXT not in exts:
        return False
    chain = struct_chain(
        ("VkPhysicalDeviceFeatures2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, {}),
        (
            "VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR",
            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
            {},
        ),
    )
    vk.lib.vkGetPhysicalDeviceFeatures2(handle, chain[0])
    return bool(chain[1].pipelineExecutableInfo)


COOPMAT_EXT = "VK_KHR_cooperative_matrix"
_COMPONENT = {
    vk.VK_COMPONENT_TYPE_FLOAT16_KHR: "f16",
    vk.VK_COMPONENT_TYPE_FLOAT32_KHR: "f32",
}


def cooperative_matrix_shapes(handle: Any, exts: frozenset[str]) -> list[str]:
    """The subgroup-scope cooperative-matrix shapes of VK_KHR_cooperative_matrix with float
    operands, as ``"MxNxK A B C R"`` strings (e.g. ``"16x16x16 f16 f16 f32 f32"``); empty when
    the extension or its cooperativeMatrix feature is missing. The decode planner picks its
    tensor-core kernel from these (``pootvk.plan.decode_schedule.COOPMAT_SHAPE``)."""
    if COOPMAT_EXT not in exts:
        return []
    chain = struct_chain(
        ("VkPhysicalDeviceFeatures2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, {}),
        (
            "VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR,
            {},
        ),
        (
            "VkPhysicalDeviceVulkanMemoryModelFeatures",
            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES,
            {},
        ),
    )
    vk.lib.vkGetPhysicalDeviceFeatures2(handle, chain[0])
    # glslang compiles a cooperative-matrix shader under the Vulkan memory model, so the
    # device needs vulkanMemoryModel (and device scope for the fused combine's coherent
    # partials) as well
    vmm = chain[2]
    if not (chain[1].cooperativeMatrix and vmm.vulkanMemoryModel
            and vmm.vulkanMemoryModelDeviceScope):
        return []
    name = b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"
    ptr = vk.lib.vkGetInstanceProcAddr(instance().handle, name)
    if ptr == ffi.NULL:
        return []
    fn = ffi.cast("PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", ptr)
    count = ffi.new("uint32_t*")
    if fn(handle, count, ffi.NULL) != vk.VK_SUCCESS or not count[0]:
        return []
    props = ffi.new("VkCooperativeMatrixPropertiesKHR[]", count[0])
    for i in range(count[0]):
        props[i].sType = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
    if fn(handle, count, props) not in (vk.VK_SUCCESS, vk.VK_INCOMPLETE):
        return []
    out = []
    for i in range(count[0]):
        c = props[i]
        types = [_COMPONENT.get(t) for t in (c.AType, c.BType, c.CType, c.ResultType)]
        if None in types or c.scope != vk.VK_SCOPE_SUBGROUP_KHR or c.saturatingAccumulation:
            continue
        out.append(f"{c.MSize}x{c.NSize}x{c.KSize} " + " ".join(types))  # type: ignore[arg-type]
    return sorted(set(out))


SHUFFLE_OPS = vk.VK_SUBGROUP_FEATURE_BASIC_BIT | vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT


def query_profile(handle: Any, exts: frozenset[str]) -> DeviceProfile:
    """Read every limit the planner uses from a physical device."""
    base = vk.vkGetPhysicalDeviceProperties(handle)
    api = base.apiVersion
    structs: list[tuple[str, int, dict[str, Any]]] = [
        ("VkPhysicalDeviceProperties2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, {}),
        (
            "VkPhysicalDeviceSubgroupProperties",
            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
            {},
        ),
        (
            "VkPhysicalDeviceMaintenance3Properties",
            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES,
            {},
        ),
    ]
    if api >= vk.VK_MAKE_VERSION(1, 2, 0) or "VK_KHR_driver_properties" in exts:
        structs.append(
            (
                "VkPhysicalDeviceDriverProperties",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES,
                {},
            )
        )
    if "VK_NV_shader_sm_builtins" in exts:
        structs.append(
            (
                "VkPhysicalDeviceShaderSMBuiltinsPropertiesNV",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV,
                {},
            )
        )
    if "VK_ARM_shader_core_builtins" in exts:
        structs.append(
            (
                "VkPhysicalDeviceShaderCoreBuiltinsPropertiesARM",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_BUILTINS_PROPERTIES_ARM,
                {},
            )
        )
    if "VK_AMD_shader_core_properties" in exts:
        structs.append(
            (
                "VkPhysicalDeviceShaderCorePropertiesAMD",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD,
                {},
            )
        )
    names = [s[0] for s in structs]
    chain = struct_chain(*structs)
    vk.lib.vkGetPhysicalDeviceProperties2(handle, chain[0])
    got = dict(zip(names, chain, strict=True))
    p = chain[0].properties
    lim = p.limits
    sub = got["VkPhysicalDeviceSubgroupProperties"]
    m3 = got["VkPhysicalDeviceMaintenance3Properties"]
    driver = ""
    driver_info = ""
    if "VkPhysicalDeviceDriverProperties" in got:
        d = got["VkPhysicalDeviceDriverProperties"]
        driver = ffi.string(d.driverName).decode("utf-8", "replace")
        driver_info = ffi.string(d.driverInfo).decode("utf-8", "replace")
    compute_units: int | None = None
    if "VkPhysicalDeviceShaderSMBuiltinsPropertiesNV" in got:
        compute_units = int(got["VkPhysicalDeviceShaderSMBuiltinsPropertiesNV"].shaderSMCount)
    elif "VkPhysicalDeviceShaderCoreBuiltinsPropertiesARM" in got:
        compute_units = int(got["VkPhysicalDeviceShaderCoreBuiltinsPropertiesARM"].shaderCoreCount)
    elif "VkPhysicalDeviceShaderCorePropertiesAMD" in got:
        a = got["VkPhysicalDeviceShaderCorePropertiesAMD"]
        compute_units = int(
            a.shaderEngineCount * a.shaderArraysPerEngineCount * a.computeUnitsPerShaderArray
        )
    storage16, float16 = features_16bit(handle, api, exts)
    coopmat = cooperative_matrix_shapes(handle, exts)
    name = ffi.string(p.deviceName).decode("utf-8", "replace")
    return DeviceProfile(
        name=name,
        vendor_id=int(p.vendorID),
        device_type=DEVICE_TYPES.get(p.deviceType, "other"),
        driver=driver,
        api_version=version_string(api),
        max_workgroup_memory=int(lim.maxComputeSharedMemorySize),
        max_grid=tuple(int(x) for x in lim.maxComputeWorkGroupCount),  # type: ignore[arg-type]
        max_invocations=int(lim.maxComputeWorkGroupInvocations),
        max_workgroup_size=tuple(int(x) for x in lim.maxComputeWorkGroupSize),  # type: ignore[arg-type]
        max_storage_buffer_range=int(lim.maxStorageBufferRange),
        max_allocation=int(m3.maxMemoryAllocationSize),
        min_storage_offset_alignment=int(lim.minStorageBufferOffsetAlignment),
        subgroup_size=int(sub.subgroupSize),
        subgroup_shuffle=bool(sub.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT)
        and (sub.supportedOperations & SHUFFLE_OPS) == SHUFFLE_OPS,
        supports_16bit=storage16 and float16,
        compute_units=compute_units,
        timestamp_period_ns=float(lim.timestampPeriod),
        extra={
            "device_id": int(p.deviceID),
            "driver_info": driver_info,
            "storage_buffer_16bit": storage16,
            "shader_float16": float16,
            **({"coopmat": coopmat} if coopmat else {}),
        },
    )


def physical_devices() -> list[PhysicalDeviceInfo]:
    """Every physical device of the process-wide instance, with its queried profile."""
    out = []
    for i, h in enumerate(instance().physical_device_handles()):
        exts = device_extensions(h)
        prof = query_profile(h, exts)
        out.append(PhysicalDeviceInfo(i, prof.name, prof.device_type, prof, h, exts))
    return out


def select(selector: int | str | None, devices: list[PhysicalDeviceInfo]) -> PhysicalDeviceInfo:
    """Pick by index, by case-insensitive name substring, or (None) the best kind.

    Raises DeviceNotFound(selector, names) when nothing matches.
    """
    names = [d.name for d in devices]
    original = selector
    if not devices:
        raise DeviceNotFound(selector, names)
    if selector is None:
        return min(devices, key=lambda d: (TYPE_RANK.get(d.device_type, 9), d.index))
    if isinstance(selector, str) and selector.strip().isdigit():
        selector = int(selector.strip())
    if isinstance(selector, int):
        if 0 <= selector < len(devices):
            return devices[selector]
        raise DeviceNotFound(original, names)
    want = selector.lower()
    for d in devices:
        if want in d.name.lower():
            return d
    raise DeviceNotFound(selector, names)
