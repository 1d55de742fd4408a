"""Buffers: one VkBuffer + one VkDeviceMemory each, mapped when the memory allows it.

Why this shape: plans allocate few, large arena buffers plus small per-step input/output
buffers, so one allocation per buffer costs nothing and keeps ownership obvious. Host-visible
buffers are mapped once for their lifetime (per-step writes are a memcpy); device buffers
are mapped too when their memory type is host-visible (lavapipe, UMA, ReBAR) and otherwise
go through a temporary staging buffer and a one-shot copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import vulkan as vk

from pootvk.errors import VulkanError

from .instance import call
from .owned import Owned

if TYPE_CHECKING:
    from .device import Device

HOST_VISIBLE = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
HOST_COHERENT = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
HOST_CACHED = vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
DEVICE_LOCAL = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
#: Most bytes ``Buffer.read`` takes straight from mapped memory the CPU does not cache
#: (~40 us a KiB on the H200's ReBAR window); larger reads go through a staging copy.
UNCACHED_READ_MAX = 1024
USAGE = (
    vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
    | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
    | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
)


def _as_bytes(data: Any) -> memoryview:
    if isinstance(data, np.ndarray):
        return memoryview(np.ascontiguousarray(data)).cast("B")
    return memoryview(data).cast("B")


class MemoryTypes:
    """The device's memory types and the choice rules for host-visible / device buffers."""

    def __init__(self, physical: Any) -> None:
        props = vk.vkGetPhysicalDeviceMemoryProperties(physical)
        self.flags = [int(props.memoryTypes[i].propertyFlags) for i in range(props.memoryTypeCount)]
        self.heap_of = [int(props.memoryTypes[i].heapIndex) for i in range(props.memoryTypeCount)]
        self.heap_size = [int(props.memoryHeaps[i].size) for i in range(props.memoryHeapCount)]

    def choose(self, type_bits: int, host_visible: bool, allow_mapped_device: bool) -> int:
        """Index of the memory type to allocate from.

        host_visible: HOST_VISIBLE|HOST_COHERENT required, HOST_CACHED preferred (outputs are
        read back). Device: DEVICE_LOCAL required; a DEVICE_LOCAL|HOST_VISIBLE|HOST_COHERENT
        type is preferred only when its heap is as large as the biggest device-local heap
        (UMA, lavapipe, ReBAR), never a 256 MiB BAR window.
        """
        ok = [i for i in range(len(self.flags)) if type_bits & (1 << i)]
        if host_visible:
            cands = [i for i in ok if self.flags[i] & (HOST_VISIBLE | HOST_COHERENT) == (
                HOST_VISIBLE | HOST_COHERENT
            )]
            cands.sort(key=lambda i: (not self.flags[i] & HOST_CACHED, i))
        else:
            local = [i for i in ok if self.flags[i] & DEVICE_LOCAL]
            biggest = max((self.heap_size[self.heap_of[i]] for i in local), default=0)
            mapped = [
                i
                for i in local
                if allow_mapped_device
                and self.flags[i] & (HOST_VISIBLE | HOST_COHERENT) == (HOST_VISIBLE | HOST_COHERENT)
                and self.heap_size[self.heap_of[i]] >= biggest
            ]
            plain = [i for i in local if not self.flags[i] & HOST_VISIBLE]
            cands = mapped + plain + [i for i in local if i not in mapped and i not in plain]
            if not cands:  # no device-local type at all: any type will do
                cands = ok
        if not cands:
            raise VulkanError(
                f"no memory type for host_visible={host_visible} among bits {type_bits:#x}"
            )
        return cands[0]

    def mappable(self, index: int) -> bool:
        return self.flags[index] & (HOST_VISIBLE | HOST_COHERENT) == (HOST_VISIBLE | HOST_COHERENT)


class Buffer(Owned):
    """A storage buffer owned by a Device (usage STORAGE | TRANSFER_SRC | TRANSFER_DST).

    ``size`` is the requested byte count rounded up to a multiple of 4 (at least 4), the
    bytes a BufferRange may cover. Reads and writes are bounds-checked.
    """

    HANDLES = (("handle", vk.vkDestroyBuffer), ("memory", vk.vkFreeMemory))
    CLOSE_RANK = 2
    handle: Any  # VkBuffer
    memory: Any  # VkDeviceMemory

    def __init__(
        self, device: Device, nbytes: int, *, host_visible: bool = False, name: str = ""
    ) -> None:
        if nbytes < 0:
            raise ValueError(f"buffer {name!r}: negative size {nbytes}")
        self.name = name
        self.host_visible = host_visible
        self.size = max(4, (int(nbytes) + 3) // 4 * 4)
        limit = device.profile.max_allocation
        if self.size > limit:
            raise VulkanError(
                f"buffer {name!r} of {self.size} bytes exceeds maxMemoryAllocationSize {limit}"
            )
        self._mapped: np.ndarray | None = None
        super().__init__(device)

    def _create(self, dev: Any) -> None:
        device = self.device
        info = vk.VkBufferCreateInfo(
            size=self.size, usage=USAGE, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE
        )
        self._own("handle", call(vk.vkCreateBuffer, dev, info, None))
        req = vk.vkGetBufferMemoryRequirements(dev, self.handle)
        mtype = device.memory_types.choose(
            int(req.memoryTypeBits), self.host_visible, device.allow_mapped_device_memory
        )
        self.memory_type = mtype  # index into device.memory_types
        alloc = vk.VkMemoryAllocateInfo(allocationSize=int(req.size), memoryTypeIndex=mtype)
        self._own("memory", call(vk.vkAllocateMemory, dev, alloc, None))
        call(vk.vkBindBufferMemory, dev, self.handle, self.memory, 0)
        if device.memory_types.mappable(mtype) and (
            self.host_visible or device.allow_mapped_device_memory
        ):
            raw = call(vk.vkMapMemory, dev, self.memory, 0, self.size, 0)
            self._mapped = np.frombuffer(raw, dtype=np.uint8, count=self.size)

    # --- state ---------------------------------------------------------------------------

    @property
    def mapped(self) -> bool:
        """True when the memory is mapped: writes are direct memcpys into it, and so are
        reads of host memory, of cached device memory, or of at most UNCACHED_READ_MAX
        bytes (``read``)."""
        return self._mapped is not None

    def __repr__(self) -> str:
        where = "mapped" if self.mapped else "staged"
        return f"Buffer({self.name!r}, {self.size} bytes, {where})"

    def _check(self, offset: int, nbytes: int) -> None:
        if self.handle is None:
            raise VulkanError(f"buffer {self.name!r} was destroyed")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(
                f"buffer {self.name!r}: bytes [{offset}, {offset + nbytes}) "
                f"outside [0, {self.size})"
            )

    # --- data ----------------------------------------------------------------------------

    def write(self, offset: int, data: Any) -> None:
        """Copy ``data`` (numpy array, bytes, any buffer) to ``[offset, offset+len)``."""
        src = _as_bytes(data)
        n = src.nbytes
        self._check(offset, n)
        if n == 0:
            return
        if self._mapped is not None:
            self._mapped[offset : offset + n] = np.frombuffer(src, dtype=np.uint8)
            return
        staging = Buffer(self.device, n, host_visible=True, name=f"{self.name}:upload")
        try:
            staging.write(0, src)
            self.device._copy(staging, 0, self, offset, n)
        finally:
            staging.destroy()

    def view(self, offset: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
        """A typed numpy view of mapped memory ``[offset, offset + size)``, or None when the
        buffer is not mapped. The view is valid until the buffer is destroyed: the per-step
        path of a Replay writes inputs and reads outputs through such views (no staging
        copies, no per-step allocation)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        self._check(offset, n)
        if self._mapped is None:
            return None
        return self._mapped[offset : offset + n].view(dt).reshape(shape)

    def read(self, offset: int, nbytes: int) -> bytes:
        """The bytes ``[offset, offset+nbytes)`` (after any submit was waited on).

        Device memory mapped through a window the CPU does not cache (a discrete GPU's
        ReBAR) is read directly only up to UNCACHED_READ_MAX bytes, else through a staging
        copy: every uncached CPU load is a bus round trip (H200: 16 KiB in 631 us, 26 MB/s,
        against 0.54 us from host memory), where the copy is one submit. Host memory
        (``host_visible``, the staging buffers too) is always read directly: there is no
        better copy of it."""
        self._check(offset, nbytes)
        if nbytes == 0:
            return b""
        if self._mapped is not None and (
                self.host_visible or nbytes <= UNCACHED_READ_MAX
                or self.device.memory_types.flags[self.memory_type] & HOST_CACHED):
            return self._mapped[offset : offset + nbytes].tobytes()
        staging = Buffer(self.device, nbytes, host_visible=True, name=f"{self.name}:download")
        try:
            self.device._copy(self, offset, staging, 0, nbytes)
            return staging.read(0, nbytes)
        finally:
            staging.destroy()

    def read_array(self, offset: int, shape: tuple[int, ...] | int, dtype: Any) -> np.ndarray:
        """A fresh numpy array (a copy, never a view of mapped memory)."""
        dt = np.dtype(dtype)
        shp = (shape,) if isinstance(shape, int) else tuple(shape)
        count = int(np.prod(shp, dtype=np.int64))
        raw = self.read(offset, count * dt.itemsize)
        return np.frombuffer(raw, dtype=dt, count=count).reshape(shp).copy()

    def zero(self) -> None:
        """Fill the whole buffer with zero bytes."""
        self._check(0, 0)
        if self._mapped is not None:
            self._mapped[:] = 0
        else:
            self.device._fill(self, 0, self.size, 0)

    # --- lifetime ------------------------------------------------------------------------

    def _before_release(self) -> None:
        # Unmap before vkFreeMemory; the numpy view must not outlive the mapping.
        if self._mapped is not None:
            self._mapped = None
            vk.vkUnmapMemory(self.device.handle, self.memory)
