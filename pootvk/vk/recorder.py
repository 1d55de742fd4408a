"""Recording: a list of dispatches turned into ONE primary command buffer, replayed per step.

Why record once: a decode step is the same sequence of kernels every time; only the bytes in
bound buffers change. Recording once and resubmitting avoids re-encoding descriptor sets and
commands each step (submit+wait of a recorded buffer is ~50 us on an H200 from Python).

Every binding is validated before any Vulkan call, so a bad plan raises a typed error and
leaves nothing half-built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import vulkan as vk

from pootvk.errors import (
    BindingRange,
    Closed,
    DeviceTimeout,
    GridLimit,
    InvalidBinding,
    VulkanError,
)

from .hazards import Access, barriers_before, level_order
from .instance import call
from .memory import Buffer
from .owned import Owned
from .pipeline import Pipeline

if TYPE_CHECKING:
    from .device import Device

FENCE_TIMEOUT_NS = 600 * 1_000_000_000


def _check(result: int, what: str) -> None:
    if result != vk.VK_SUCCESS:
        raise VulkanError(f"{what} returned VkResult {result}")


@dataclass(frozen=True)
class BufferRange:
    """``size`` bytes of ``buffer`` from ``offset``; size None = the rest of the buffer (an
    explicit size is always passed to Vulkan: VK_WHOLE_SIZE is broken in the binding)."""

    buffer: Buffer
    offset: int = 0
    size: int | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer.size - self.offset if self.size is None else self.size


@dataclass(frozen=True)
class Dispatch:
    """One vkCmdDispatch of ``pipeline`` over ``groups`` workgroups with set-0 bindings.

    ``access`` says, per binding, whether the kernel reads or writes it; the recorder places
    barriers from it. None (for callers that do not say) means every binding READ_WRITE:
    never a missed hazard, only barriers that might not be needed. ``push`` holds the
    pipeline's push-constant words (uint32), recorded with the dispatch.
    """

    pipeline: Pipeline
    bindings: tuple[BufferRange, ...]
    groups: tuple[int, int, int]
    label: str = ""
    access: tuple[Access, ...] | None = None
    push: tuple[int, ...] = ()

    @property
    def accesses(self) -> tuple[Access, ...]:
        """One Access per binding (the conservative default filled in)."""
        if self.access is None:
            return (Access.READ_WRITE,) * len(self.bindings)
        return self.access


def validate_dispatch(device: Device, d: Dispatch, index: int) -> None:
    """Raise InvalidBinding / BindingRange / GridLimit if ``d`` cannot run on ``device``."""
    prof = device.profile
    label = d.label or f"#{index}"
    if d.pipeline.device is not device or d.pipeline.destroyed:
        raise InvalidBinding(label, -1, "pipeline belongs to another device or was destroyed")
    if len(d.push) != d.pipeline.push_words or any(not 0 <= int(w) < 1 << 32 for w in d.push):
        raise InvalidBinding(
            label, -1, f"push constants {d.push} do not fit the pipeline's "
            f"{d.pipeline.push_words} uint32 words"
        )
    if len(d.bindings) != d.pipeline.n_bindings:
        raise InvalidBinding(
            label, -1, f"{len(d.bindings)} bindings given, pipeline has {d.pipeline.n_bindings}"
        )
    if d.access is not None and (
        len(d.access) != len(d.bindings) or not all(isinstance(a, Access) for a in d.access)
    ):
        raise InvalidBinding(
            label, -1, f"access {d.access} must be one Access per binding ({len(d.bindings)})"
        )
    for i, r in enumerate(d.bindings):
        buf = r.buffer
        if buf.device is not device or buf.destroyed:
            raise InvalidBinding(label, i, f"buffer {buf.name!r} is foreign or destroyed")
        align = prof.min_storage_offset_alignment
        if r.offset < 0 or r.offset % align:
            raise InvalidBinding(
                label, i, f"offset {r.offset} is not a multiple of {align} "
                "(minStorageBufferOffsetAlignment)"
            )
        n = r.nbytes
        if n <= 0 or r.offset + n > buf.size:
            raise InvalidBinding(
                label, i, f"bytes [{r.offset}, {r.offset + n}) outside buffer {buf.name!r} "
                f"of {buf.size} bytes"
            )
        if n > prof.max_storage_buffer_range:
            raise BindingRange(f"{label}[{i}]:{buf.name}", n, prof.max_storage_buffer_range)
    g = tuple(int(x) for x in d.groups)
    mx = prof.max_grid
    if len(g) != 3 or any(x < 0 for x in g):
        raise InvalidBinding(label, -1, f"groups {d.groups} must be three non-negative ints")
    if any(x > m for x, m in zip(g, mx, strict=True)):
        raise GridLimit(g[0] * g[1] * g[2], mx[0], mx[1])


#: A recording's timestamps: True (after every dispatch), "bounds" (first and last only) or
#: False (none).
Timestamps = bool | Literal["bounds"]


class Recorder:
    """Builds Recordings on one device."""

    def __init__(self, device: Device) -> None:
        self.device = device

    def record(
        self,
        dispatches: list[Dispatch],
        *,
        timestamps: Timestamps = False,
        uploads: list[tuple[Buffer, Buffer, int]] = (),  # type: ignore[assignment]
        program_order: bool | None = None,
    ) -> Recording:
        """Validate every dispatch, then record them into one command buffer.

        ``timestamps``: True, a timestamp after every dispatch (per-dispatch times, at a
        cost of their own); ``"bounds"``, one before the first and one after the last (the
        step's GPU time as it runs untimed); False, none.

        Dispatches are recorded level by level (:func:`~pootvk.vk.hazards.level_order`:
        fewest barriers, same results) unless ``program_order`` (None: the device config's
        ``program_order``, POOTVK_PROGRAM_ORDER) keeps the order given.

        ``uploads`` are (host staging, device buffer, bytes) copies recorded before the first
        dispatch: per-step inputs land in device memory each replay, so kernels never read
        host memory across the bus. They run before the first timestamp, so per-dispatch
        times measure kernels alone.
        """
        self.device._require_open()
        for i, d in enumerate(dispatches):
            validate_dispatch(self.device, d, i)
        for src, dst, n in uploads:
            for buf in (src, dst):
                if buf.device is not self.device or buf.destroyed or n > buf.size or n <= 0:
                    raise InvalidBinding("upload", -1, f"cannot copy {n} bytes via {buf.name!r}")
        if program_order is None:
            program_order = self.device.config.program_order
        return Recording(self.device, list(dispatches), timestamps, list(uploads),
                         program_order=program_order)


class Recording(Owned):
    """Owns a descriptor pool (one set per dispatch), a command pool + primary command
    buffer, a fence and, with timestamps, a query pool. Replay with :meth:`submit`.

    ``dispatches`` is the order the caller gave (the plan's); ``order`` the order recorded
    (indices into ``dispatches``: level order, or ``range`` with ``program_order``).
    Everything else per dispatch is indexed like ``dispatches``: ``barrier_before[i]`` says
    whether a compute->compute barrier was recorded right before ``dispatches[i]`` (only
    where it touches what an earlier recorded dispatch since the last barrier wrote, or
    writes what one read; see :func:`~pootvk.vk.hazards.barriers_before`), and
    :meth:`dispatch_times_ns` gives ``dispatches[i]``'s time at ``[i]``, so a caller's
    labels stay with their times whatever the recorded order.

    The other commands keep their places, none depends on the dispatch order: the uploads
    go before the first dispatch behind their own barriers, the timestamp pool is reset
    before it, one timestamp follows every recorded dispatch, and one barrier closes the
    buffer for the host. Validation witnesses are cleared by the host before each submit.
    """

    HANDLES = (
        ("query_pool", vk.vkDestroyQueryPool),
        ("fence", vk.vkDestroyFence),
        ("command_pool", vk.vkDestroyCommandPool),  # frees the command buffer
        ("descriptor_pool", vk.vkDestroyDescriptorPool),  # frees the sets
    )
    CLOSE_RANK = 0
    query_pool: Any
    fence: Any
    command_pool: Any
    descriptor_pool: Any

    def __init__(
        self,
        device: Device,
        dispatches: list[Dispatch],
        timestamps: Timestamps,
        uploads: list[tuple[Buffer, Buffer, int]] | None = None,
        *,
        program_order: bool = False,
    ) -> None:
        self.dispatches = dispatches
        self.uploads = uploads or []
        self.timestamps = bool(timestamps) and device.timestamp_valid_bits > 0
        self.bounds_only = timestamps == "bounds"  # no timestamp between dispatches
        self.program_order = program_order
        self.order: tuple[int, ...] = (
            tuple(range(len(dispatches))) if program_order else level_order(dispatches)
        )
        placed = barriers_before([dispatches[i] for i in self.order])
        before = [False] * len(dispatches)
        for i, b in zip(self.order, placed, strict=True):
            before[i] = b
        self.barrier_before: tuple[bool, ...] = tuple(before)
        self._pending = False
        self._submitted = False
        #: What DeviceTimeout names: the dispatches' labels.
        self.label = "+".join(d.label or f"#{i}" for i, d in enumerate(dispatches)) or "empty"
        self._n_queries = 2 if self.bounds_only else len(dispatches) + 1
        super().__init__(device)

    @property
    def recorded(self) -> list[Dispatch]:
        """The dispatches in the order they were recorded."""
        return [self.dispatches[i] for i in self.order]

    @property
    def barriers(self) -> int:
        """Compute->compute barriers between dispatches (what a step's chain pays for)."""
        return sum(self.barrier_before)

    # --- construction --------------------------------------------------------------------

    def _create(self, dev: Any) -> None:
        self._create_objects(dev)
        self._record()

    def _create_objects(self, dev: Any) -> None:
        n_sets = max(1, len(self.dispatches))
        n_desc = max(1, sum(d.pipeline.n_bindings for d in self.dispatches))
        sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                         descriptorCount=n_desc)]
        dpi = vk.VkDescriptorPoolCreateInfo(maxSets=n_sets, poolSizeCount=1, pPoolSizes=sizes)
        self._own("descriptor_pool", call(vk.vkCreateDescriptorPool, dev, dpi, None))
        cpi = vk.VkCommandPoolCreateInfo(queueFamilyIndex=self.device.queue_family)
        self._own("command_pool", call(vk.vkCreateCommandPool, dev, cpi, None))
        self._own("fence", call(vk.vkCreateFence, dev, vk.VkFenceCreateInfo(), None))
        if self.timestamps:
            qpi = vk.VkQueryPoolCreateInfo(
                queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=self._n_queries
            )
            self._own("query_pool", call(vk.vkCreateQueryPool, dev, qpi, None))
        self.sets: list[Any] = []
        if self.dispatches:
            layouts = [d.pipeline.set_layout for d in self.dispatches]
            ai = vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self.descriptor_pool,
                descriptorSetCount=len(layouts),
                pSetLayouts=layouts,
            )
            arr = call(vk.vkAllocateDescriptorSets, dev, ai)
            self.sets = [arr[i] for i in range(len(layouts))]
            keep: list[Any] = []
            writes = []
            for s, d in zip(self.sets, self.dispatches, strict=True):
                for i, r in enumerate(d.bindings):
                    info = [vk.VkDescriptorBufferInfo(
                        buffer=r.buffer.handle, offset=r.offset, range=r.nbytes
                    )]
                    keep.append(info)
                    writes.append(vk.VkWriteDescriptorSet(
                        dstSet=s, dstBinding=i, dstArrayElement=0, descriptorCount=1,
                        descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=info,
                    ))
            vk.vkUpdateDescriptorSets(dev, len(writes), writes, 0, None)
            del keep, writes
        ai2 = vk.VkCommandBufferAllocateInfo(
            commandPool=self.command_pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            commandBufferCount=1,
        )
        self._cb_array = call(vk.vkAllocateCommandBuffers, dev, ai2)
        self.command_buffer = self._cb_array[0]
        # Built once, reused by every submit (they reference _cb_array / the fence).
        self._fence_arr = vk.ffi.new("VkFence[1]", [self.fence])
        self._submit_info = vk.ffi.new(
            "VkSubmitInfo[1]",
            [{"sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
              "pCommandBuffers": self._cb_array}],
        )

    def _barrier(self, src_stage: int, dst_stage: int, src: int, dst: int) -> None:
        barrier = vk.VkMemoryBarrier(srcAccessMask=src, dstAccessMask=dst)
        barriers = [barrier]
        vk.vkCmdPipelineBarrier(
            self.command_buffer, src_stage, dst_stage, 0, 1, barriers, 0, None, 0, None
        )

    def _record(self) -> None:
        cb = self.command_buffer
        call(vk.vkBeginCommandBuffer, cb, vk.VkCommandBufferBeginInfo())
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        if self.uploads:
            # The previous replay's kernels may still read these buffers' old contents.
            self._barrier(compute, vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                          vk.VK_ACCESS_SHADER_READ_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT)
            for src, dst, n in self.uploads:
                regions = [vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=n)]
                vk.vkCmdCopyBuffer(cb, src.handle, dst.handle, 1, regions)
            self._barrier(vk.VK_PIPELINE_STAGE_TRANSFER_BIT, compute,
                          vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_ACCESS_SHADER_READ_BIT)
        if self.timestamps:
            vk.vkCmdResetQueryPool(cb, self.query_pool, 0, self._n_queries)
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, self.query_pool, 0)
        # Host writes are made visible by the submit itself; transfers (staging uploads)
        # carry their own trailing barrier. Between dispatches, a barrier only on a hazard.
        for n, i in enumerate(self.order):
            s, d = self.sets[i], self.dispatches[i]
            if self.barrier_before[i]:
                self._barrier(
                    compute, compute, vk.VK_ACCESS_SHADER_WRITE_BIT,
                    vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
                )
            vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline.handle)
            sets = [s]
            vk.vkCmdBindDescriptorSets(
                cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline.layout, 0, 1, sets, 0, None
            )
            if d.push:
                words = vk.ffi.new("uint32_t[]", [int(w) for w in d.push])
                vk.vkCmdPushConstants(cb, d.pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                      0, 4 * len(d.push), words)
            gx, gy, gz = (int(x) for x in d.groups)
            vk.vkCmdDispatch(cb, gx, gy, gz)
            if self.timestamps and not self.bounds_only:
                vk.vkCmdWriteTimestamp(
                    cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.query_pool, n + 1
                )
        if self.timestamps and self.bounds_only:
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                   self.query_pool, 1)
        # Results must be visible to host reads and to staging copies after the fence.
        self._barrier(
            compute, vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
            vk.VK_ACCESS_SHADER_WRITE_BIT,
            vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT,
        )
        call(vk.vkEndCommandBuffer, cb)

    # --- replay --------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self.command_pool is None:
            raise Closed(f"recording {self.label!r}")
        self.device._require_open()

    def submit(self, wait: bool = True) -> None:
        """Submit the recorded command buffer; with ``wait`` block until it finished.

        A previous unfinished submit is waited on first (the command buffer is not
        simultaneous-use), so callers may submit any number of times. This is the per-step
        hot path: it calls the loader directly with structs built once at record time.
        """
        self._check_alive()
        if self._pending and self._timed_out:
            # A submit that timed out: never block on it again; go on only once it finished.
            if vk.lib.vkGetFenceStatus(self.device.handle, self.fence) != vk.VK_SUCCESS:
                raise DeviceTimeout(self.label, self.device.config.fence_timeout_s, True)
            self._pending = self._timed_out = False
        self.wait()
        lib, dev = vk.lib, self.device.handle
        _check(lib.vkResetFences(dev, 1, self._fence_arr), "vkResetFences")
        with self.device.queue_lock:  # VkQueue access must be externally synchronised
            r = lib.vkQueueSubmit(self.device.queue, 1, self._submit_info, self.fence)
        _check(r, "vkQueueSubmit")
        self._pending = True
        self._submitted = True
        if wait:
            self.wait()

    _timed_out = False

    def wait(self, timeout_ns: int | None = None) -> None:
        """Block until the last submit finished (no-op when none is in flight).

        Past ``timeout_ns`` (default the device's POOTVK_FENCE_TIMEOUT_S) raise
        DeviceTimeout naming this recording; the submit is then marked timed out, so the
        next ``submit`` checks the fence without blocking instead of hanging again.
        """
        if not self._pending:
            return
        limit = self.device.fence_timeout_ns if timeout_ns is None else timeout_ns
        spin = min(self.device.spin_ns, limit)
        if spin:  # poll first (Device.spin_ns: a blocking wait's wake-up costs ~tens of us)
            lib, dev, fence = vk.lib, self.device.handle, self.fence
            end = time.perf_counter_ns() + spin
            r = lib.vkGetFenceStatus(dev, fence)
            while r == vk.VK_NOT_READY and time.perf_counter_ns() < end:
                r = lib.vkGetFenceStatus(dev, fence)
            if r == vk.VK_SUCCESS:
                self._pending = self._timed_out = False
                return  # else still running (block below) or an error (reported below)
        r = vk.lib.vkWaitForFences(self.device.handle, 1, self._fence_arr, vk.VK_TRUE,
                                   limit - spin)
        if r == vk.VK_TIMEOUT:
            self._timed_out = True
            raise DeviceTimeout(self.label, limit / 1e9)
        _check(r, "vkWaitForFences")
        self._pending = self._timed_out = False

    def _timestamps(self) -> list[int] | None:
        if not self.timestamps or not self._submitted:
            return None
        self.wait()
        n = self._n_queries
        data = vk.ffi.new("uint64_t[]", n)
        call(
            vk.vkGetQueryPoolResults, self.device.handle, self.query_pool, 0, n, n * 8, data, 8,
            vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT,
        )
        bits = self.device.timestamp_valid_bits
        mask = (1 << bits) - 1 if bits < 64 else (1 << 64) - 1
        return [int(data[i]) & mask for i in range(n)]

    def gpu_time_ns(self) -> float | None:
        """Device time of the last submit, first to last timestamp (None without them)."""
        ts = self._timestamps()
        if ts is None:
            return None
        return (ts[-1] - ts[0]) * self.device.profile.timestamp_period_ns

    def dispatch_times_ns(self) -> list[float] | None:
        """Per-dispatch device time of the last submit, indexed like ``dispatches`` (None
        without per-dispatch timestamps): the time from the timestamp before a dispatch in
        the recorded order to the one after it. Dispatches that overlap (no barrier between
        them) split their time this way too; the sum is the submit's first-to-last time."""
        ts = self._timestamps()
        if ts is None or self.bounds_only:
            return None
        period = self.device.profile.timestamp_period_ns
        out = [0.0] * len(self.dispatches)
        for n, i in enumerate(self.order):
            out[i] = (ts[n + 1] - ts[n]) * period
        return out

    # --- lifetime ------------------------------------------------------------------------

    def _before_release(self) -> None:
        # A submit in flight still uses the command buffer, the sets and the fence.
        if self._pending:
            try:
                self.wait(FENCE_TIMEOUT_NS)  # even past a DeviceTimeout: it must finish
            except VulkanError:
                pass
