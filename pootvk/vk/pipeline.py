"""Compute pipelines: shader module + descriptor set layout + pipeline layout + pipeline.

Contract every generated kernel follows: entry point ``main``, descriptor set 0, storage
buffers at bindings 0..n-1, and optionally ``push_words`` uint32 push constants for shape
values that are fixed for a recording but must not be baked into the source (a sequence
length): one SPIR-V module and one driver pipeline then serve every length. Values that
change per step never go there (they live in bound buffers, so one recording stays valid
for every step). A Device caches pipelines per (sha256(spirv), n, push_words).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import vulkan as vk

from pootvk.errors import PipelineStatisticsUnavailable, VulkanError

from .instance import call
from .owned import Owned

if TYPE_CHECKING:
    from .device import Device

ENTRY_POINT = "main"
#: VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR (VK_KHR_pipeline_executable_properties).
CAPTURE_STATISTICS_BIT = 0x40
#: One statistic's value by its VkPipelineExecutableStatisticFormatKHR.
_STAT_VALUE = {
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: lambda v: bool(v.b32),
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: lambda v: int(v.i64),
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: lambda v: int(v.u64),
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: lambda v: float(v.f64),
}


def pipeline_key(spirv: bytes, n_bindings: int, push_words: int = 0) -> tuple[str, int, int]:
    return hashlib.sha256(spirv).hexdigest(), n_bindings, push_words


class Pipeline(Owned):
    """Owns its VkShaderModule, VkDescriptorSetLayout, VkPipelineLayout and VkPipeline.
    Recordings that use it must be destroyed first."""

    HANDLES = (
        ("handle", vk.vkDestroyPipeline),
        ("layout", vk.vkDestroyPipelineLayout),
        ("set_layout", vk.vkDestroyDescriptorSetLayout),
        ("shader_module", vk.vkDestroyShaderModule),
    )
    CLOSE_RANK = 1
    handle: Any
    layout: Any
    set_layout: Any
    shader_module: Any

    def __init__(
        self, device: Device, spirv: bytes, n_bindings: int, push_words: int = 0
    ) -> None:
        if n_bindings < 1:
            raise ValueError(f"a compute pipeline needs at least one binding, got {n_bindings}")
        if len(spirv) % 4 or len(spirv) < 20 or spirv[:4] != b"\x03\x02\x23\x07":
            raise ValueError(f"not a SPIR-V module ({len(spirv)} bytes)")
        if not 0 <= push_words <= 32:  # 128 bytes: the least maxPushConstantsSize allows
            raise ValueError(f"{push_words} push-constant words (at most 32)")
        self.n_bindings = n_bindings
        self.push_words = push_words
        self.key = pipeline_key(spirv, n_bindings, push_words)
        #: Created with CAPTURE_STATISTICS (device support + POOTVK_PIPELINE_STATS=1).
        self.captures_statistics = bool(device.captures_pipeline_statistics)
        self._spirv = bytes(spirv)
        super().__init__(device)
        del self._spirv

    def _create(self, dev: Any) -> None:
        code = self._spirv  # keep alive: the binding casts it to uint32_t*
        smi = vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code)
        self._own("shader_module", call(vk.vkCreateShaderModule, dev, smi, None))
        bindings = [
            vk.VkDescriptorSetLayoutBinding(
                binding=i,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                descriptorCount=1,
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            )
            for i in range(self.n_bindings)
        ]
        dsli = vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=self.n_bindings, pBindings=bindings
        )
        self._own("set_layout", call(vk.vkCreateDescriptorSetLayout, dev, dsli, None))
        layouts = [self.set_layout]
        ranges = [vk.VkPushConstantRange(
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=4 * self.push_words
        )] if self.push_words else []
        pli = vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=layouts,
            pushConstantRangeCount=len(ranges), pPushConstantRanges=ranges or None,
        )
        self._own("layout", call(vk.vkCreatePipelineLayout, dev, pli, None))
        # The stage struct and its pName string must outlive vkCreateComputePipelines:
        # the binding frees nested data whose Python owner was collected.
        name = ENTRY_POINT
        stage = vk.VkPipelineShaderStageCreateInfo(
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.shader_module, pName=name
        )
        cpi = vk.VkComputePipelineCreateInfo(
            flags=CAPTURE_STATISTICS_BIT if self.captures_statistics else 0,
            stage=stage, layout=self.layout,
        )
        infos = [cpi]
        self._own(
            "handle",
            call(vk.vkCreateComputePipelines, dev, self.device.pipeline_cache or vk.VK_NULL_HANDLE,
                 1, infos, None)[0],
        )
        del stage, cpi, infos, name, smi, dsli, pli, bindings, layouts, code, ranges

    def statistics(self) -> dict[str, int | float | bool]:
        """The driver's statistics of this pipeline's executables, names as the driver
        gives them (NVIDIA: register count, spills, local memory, instructions...).

        A compute pipeline usually has one executable; when a driver reports several, the
        names of the second and later ones are prefixed ``"<executable name>: "``. Raises
        PipelineStatisticsUnavailable naming what is missing: the extension, its feature,
        or POOTVK_PIPELINE_STATS=1 when this pipeline was created.
        """
        dev = self.device
        dev._require_open()
        if self.destroyed:
            raise VulkanError(f"{self!r} was destroyed")
        if not self.captures_statistics:
            missing = []
            if not dev.pipeline_executable_info:
                missing.append(
                    "VK_KHR_pipeline_executable_properties with its pipelineExecutableInfo "
                    "feature (not exposed by this driver)"
                )
            else:
                missing.append(
                    "POOTVK_PIPELINE_STATS=1 when the pipeline was created (it was created "
                    "without VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR)"
                )
            raise PipelineStatisticsUnavailable(dev.name, missing)
        ffi = vk.ffi
        get_execs = dev.proc("vkGetPipelineExecutablePropertiesKHR")
        get_stats = dev.proc("vkGetPipelineExecutableStatisticsKHR")
        pinfo = ffi.new("VkPipelineInfoKHR*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, "pipeline": self.handle,
        })
        count = ffi.new("uint32_t*")
        _check(get_execs(dev.handle, pinfo, count, ffi.NULL), "executable properties")
        execs = ffi.new("VkPipelineExecutablePropertiesKHR[]", count[0])
        for e in execs:
            e.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR
        _check(get_execs(dev.handle, pinfo, count, execs), "executable properties")
        out: dict[str, int | float | bool] = {}
        for index in range(count[0]):
            prefix = "" if index == 0 else ffi.string(execs[index].name).decode() + ": "
            einfo = ffi.new("VkPipelineExecutableInfoKHR*", {
                "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
                "pipeline": self.handle, "executableIndex": index,
            })
            n = ffi.new("uint32_t*")
            _check(get_stats(dev.handle, einfo, n, ffi.NULL), "executable statistics")
            stats = ffi.new("VkPipelineExecutableStatisticKHR[]", n[0])
            for st in stats:
                st.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR
            _check(get_stats(dev.handle, einfo, n, stats), "executable statistics")
            for st in stats[0:n[0]]:
                name = prefix + ffi.string(st.name).decode("utf-8", "replace")
                read = _STAT_VALUE.get(st.format)
                if read is not None:
                    out[name] = read(st.value)
        return out

    def __repr__(self) -> str:
        return f"Pipeline({self.key[0][:12]}, n_bindings={self.n_bindings})"


def _check(result: int, what: str) -> None:
    """VK_INCOMPLETE cannot happen here (counts were queried first); anything but
    VK_SUCCESS is a driver failure."""
    if result != vk.VK_SUCCESS:
        raise VulkanError(f"vkGetPipelineExecutable* ({what}) returned VkResult {result}")
