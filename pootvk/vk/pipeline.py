"""Compute pipelines: shader module + descriptor set layout + pipeline layout + pipeline.

Contract every generated kernel follows: entry point ``main``, descriptor set 0, storage
buffers at bindings 0..n-1, no push constants (per-step values live in bound buffers so one
recording stays valid for every step). A Device caches pipelines per (sha256(spirv), n).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import vulkan as vk

from .instance import call, release_handles

if TYPE_CHECKING:
    from .device import Device

ENTRY_POINT = "main"


def pipeline_key(spirv: bytes, n_bindings: int) -> tuple[str, int]:
    return hashlib.sha256(spirv).hexdigest(), n_bindings


class Pipeline:
    """Owns its VkShaderModule, VkDescriptorSetLayout, VkPipelineLayout and VkPipeline."""

    def __init__(self, device: Device, spirv: bytes, n_bindings: int) -> None:
        if n_bindings < 1:
            raise ValueError(f"a compute pipeline needs at least one binding, got {n_bindings}")
        if len(spirv) % 4 or len(spirv) < 20 or spirv[:4] != b"\x03\x02\x23\x07":
            raise ValueError(f"not a SPIR-V module ({len(spirv)} bytes)")
        self.device = device
        self.n_bindings = n_bindings
        self.key = pipeline_key(spirv, n_bindings)
        self.shader_module: Any = None
        self.set_layout: Any = None
        self.layout: Any = None
        self.handle: Any = None
        dev = device.handle
        try:
            code = bytes(spirv)  # keep alive: the binding casts it to uint32_t*
            smi = vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code)
            self.shader_module = call(vk.vkCreateShaderModule, dev, smi, None)
            device._track(1)
            bindings = [
                vk.VkDescriptorSetLayoutBinding(
                    binding=i,
                    descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                    descriptorCount=1,
                    stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT,
                )
                for i in range(n_bindings)
            ]
            dsli = vk.VkDescriptorSetLayoutCreateInfo(bindingCount=n_bindings, pBindings=bindings)
            self.set_layout = call(vk.vkCreateDescriptorSetLayout, dev, dsli, None)
            device._track(1)
            layouts = [self.set_layout]
            pli = vk.VkPipelineLayoutCreateInfo(setLayoutCount=1, pSetLayouts=layouts)
            self.layout = call(vk.vkCreatePipelineLayout, dev, pli, None)
            device._track(1)
            # The stage struct and its pName string must outlive vkCreateComputePipelines:
            # the binding frees nested data whose Python owner was collected.
            name = ENTRY_POINT
            stage = vk.VkPipelineShaderStageCreateInfo(
                stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.shader_module, pName=name
            )
            cpi = vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)
            infos = [cpi]
            self.handle = call(
                vk.vkCreateComputePipelines, dev, vk.VK_NULL_HANDLE, 1, infos, None
            )[0]
            device._track(1)
            del stage, cpi, infos, name, smi, dsli, pli, bindings, layouts, code
        except BaseException:
            self._release()
            raise
        device._adopt(self)

    @property
    def destroyed(self) -> bool:
        return self.handle is None and self.shader_module is None

    def __repr__(self) -> str:
        return f"Pipeline({self.key[0][:12]}, n_bindings={self.n_bindings})"

    def _release(self) -> None:
        release_handles(self, self.device, (
            ("handle", vk.vkDestroyPipeline),
            ("layout", vk.vkDestroyPipelineLayout),
            ("set_layout", vk.vkDestroyDescriptorSetLayout),
            ("shader_module", vk.vkDestroyShaderModule),
        ))

    def destroy(self) -> None:
        """Destroy the Vulkan objects (idempotent); recordings using it must be gone."""
        if self.destroyed:
            return
        self._release()
        self.device._disown(self)
