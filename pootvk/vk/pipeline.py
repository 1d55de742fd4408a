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

from .instance import call
from .owned import Owned

if TYPE_CHECKING:
    from .device import Device

ENTRY_POINT = "main"


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
        cpi = vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)
        infos = [cpi]
        self._own(
            "handle",
            call(vk.vkCreateComputePipelines, dev, self.device.pipeline_cache or vk.VK_NULL_HANDLE,
                 1, infos, None)[0],
        )
        del stage, cpi, infos, name, smi, dsli, pli, bindings, layouts, code, ranges

    def __repr__(self) -> str:
        return f"Pipeline({self.key[0][:12]}, n_bindings={self.n_bindings})"
