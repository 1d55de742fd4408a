"""The logical Device: one compute queue, and the owner of every object made through it.

Why one owner: a plan creates buffers, pipelines and recordings; closing the Device
destroys all of them in dependency order (recordings, pipelines, buffers, internal pools,
then the VkDevice), so neither tests nor the validation layer ever see a leak.
``live_objects()`` counts the Vulkan handles currently owned, for leak tests.
"""

from __future__ import annotations

import logging
import numbers
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import vulkan as vk

from pootvk.config import Config, config
from pootvk.errors import Closed, DeviceTimeout, InvalidDevice, VulkanError
from pootvk.plan.profile import DeviceProfile

from . import pipeline_cache
from .instance import call, instance, live_devices
from .memory import Buffer, MemoryTypes
from .owned import Owned
from .physical import (
    COOPMAT_EXT,
    PIPELINE_EXECUTABLE_EXT,
    PhysicalDeviceInfo,
    physical_devices,
    pipeline_executable_info,
    select,
    struct_chain,
)
from .pipeline import Pipeline, pipeline_key

log = logging.getLogger("pootvk.vk")

FENCE_TIMEOUT_NS = 600 * 1_000_000_000  # a step that takes 10 minutes is a hang
#: Compiled pipelines kept per Device when no recording uses them (LRU beyond that).
MAX_CACHED_PIPELINES = 64


#: default fence polling before a blocking wait on a GPU (see Device.spin_ns)
SPIN_US = 2000.0
#: enabled only on request (Config.shader_clock): the clocks of probe kernels
SHADER_CLOCK_EXT = "VK_KHR_shader_clock"
SM_BUILTINS_EXT = "VK_NV_shader_sm_builtins"


class Device:
    """A VkDevice with one compute queue on the selected physical device.

    selector: an index, a case-insensitive name substring, or None (then
    ``config.device`` / POOTVK_DEVICE, then the first discrete, integrated, virtual, cpu
    device). No match raises DeviceNotFound(selector, names).
    """

    def __init__(self, selector: int | str | None = None, config: Config | None = None) -> None:
        from pootvk.config import config as global_config

        self.config = config if config is not None else global_config()
        self.handle: Any = None
        self.pipeline_cache: Any = None
        self._live = 0
        self._owned: dict[int, Owned] = {}  # id -> Buffer | Pipeline | Recording, creation order
        self._pipelines: OrderedDict[tuple[str, int], Pipeline] = OrderedDict()
        self._pipeline_users: dict[tuple[str, int], int] = {}
        self.max_cached_pipelines = MAX_CACHED_PIPELINES
        self._lock = threading.RLock()
        #: Vulkan requires external synchronisation of a VkQueue: every vkQueueSubmit on
        #: this device's queue (recordings and one-shot transfers) holds this lock.
        self.queue_lock = threading.Lock()
        instance(self.config.validation)
        chosen: PhysicalDeviceInfo = select(
            selector if selector is not None else self.config.device, physical_devices()
        )
        self.physical = chosen
        self.physical_handle = chosen.handle
        self.profile: DeviceProfile = chosen.profile
        self.name: str = chosen.name
        self.memory_types = MemoryTypes(chosen.handle)
        #: Map device-local memory directly when its type is host-visible (tests turn it
        #: off to exercise the staging path on lavapipe).
        self.allow_mapped_device_memory = True
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(chosen.handle)
        family = next(
            (i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), None
        )
        if family is None:
            raise VulkanError(f"{self.name} has no compute queue family")
        self.queue_family = family
        self.timestamp_valid_bits = int(families[family].timestampValidBits)
        self._procs: dict[str, Any] = {}
        self._create_device(chosen)
        live_devices.add(self)
        if self.profile.extra.get("coopmat"):
            self._probe_coopmat_layout()

    def _probe_coopmat_layout(self) -> None:
        """Record the element layout of the device's cooperative matrices in its profile
        (``extra["coopmat_layout"]``, see ``coopmat_layout``): the register-fed decode
        kernel is planned only on the layout it is written for. A probe that fails leaves
        "unprobed: <why>", which no kernel takes."""
        from dataclasses import replace

        from .coopmat_layout import probe_coopmat_layout

        try:
            layout = probe_coopmat_layout(self)
        except Exception as e:  # noqa: BLE001  # any failure: the kernel is not planned
            log.warning("%s: cooperative-matrix layout probe failed: %s", self.name, e)
            layout = f"unprobed: {type(e).__name__}"
        self.profile = replace(self.profile, extra={**self.profile.extra,
                                                    "coopmat_layout": layout})

    def _create_device(self, chosen: PhysicalDeviceInfo) -> None:
        priorities = [1.0]
        qci = vk.VkDeviceQueueCreateInfo(
            queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=priorities
        )
        qcis = [qci]
        # Enable the features the profile reports that generated kernels use (16-bit types,
        # cooperative matrices) and pipeline statistics where the driver has them.
        extra = chosen.profile.extra
        features: list[tuple[str, int, dict[str, Any]]] = []  # chained into pNext
        if extra.get("shader_float16"):
            features.append(("VkPhysicalDeviceShaderFloat16Int8Features",
                             vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
                             {"shaderFloat16": 1}))
        if extra.get("storage_buffer_16bit"):
            features.append(("VkPhysicalDevice16BitStorageFeatures",
                             vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
                             {"storageBuffer16BitAccess": 1}))
        #: VK_KHR_pipeline_executable_properties with pipelineExecutableInfo enabled: a
        #: pipeline can capture the driver's statistics (see Pipeline.statistics()).
        self.pipeline_executable_info = pipeline_executable_info(
            chosen.handle, chosen.extensions
        )
        if self.pipeline_executable_info:
            features.append(
                ("VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR",
                 vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
                 {"pipelineExecutableInfo": 1}))
        exts: list[str] = []
        if extra.get("coopmat"):
            # the tensor-core decode kernel (GL_KHR_cooperative_matrix), which glslang
            # compiles under the Vulkan memory model
            features.append(("VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
                             vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR,
                             {"cooperativeMatrix": 1}))
            features.append(("VkPhysicalDeviceVulkanMemoryModelFeatures",
                             vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES,
                             {"vulkanMemoryModel": 1, "vulkanMemoryModelDeviceScope": 1}))
            exts.append(COOPMAT_EXT)
        #: VK_KHR_shader_clock enabled (POOTVK_SHADER_CLOCK=1 and the device has it): probe
        #: kernels may read the subgroup and device clocks
        self.shader_clock = self.config.shader_clock and SHADER_CLOCK_EXT in chosen.extensions
        self.sm_builtins = self.shader_clock and SM_BUILTINS_EXT in chosen.extensions
        if self.shader_clock:
            features.append(("VkPhysicalDeviceShaderClockFeaturesKHR",
                             vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR,
                             {"shaderSubgroupClock": 1, "shaderDeviceClock": 1}))
            exts.append(SHADER_CLOCK_EXT)
            if self.sm_builtins:  # gl_SMIDNV: which SM ran a workgroup
                features.append(("VkPhysicalDeviceShaderSMBuiltinsFeaturesNV",
                                 vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_FEATURES_NV,
                                 {"shaderSMBuiltins": 1}))
                exts.append(SM_BUILTINS_EXT)
        keep = struct_chain(*features)  # alive until vkCreateDevice returns
        if self.pipeline_executable_info:
            exts.append(PIPELINE_EXECUTABLE_EXT)
        if (
            "VK_KHR_shader_float16_int8" in chosen.extensions
            and extra.get("shader_float16")
            and tuple(int(x) for x in chosen.profile.api_version.split(".")[:2]) < (1, 2)
        ):
            exts.append("VK_KHR_shader_float16_int8")
        if "VK_KHR_portability_subset" in chosen.extensions:
            exts.append("VK_KHR_portability_subset")  # required when present (MoltenVK)
        dci = vk.VkDeviceCreateInfo(
            pNext=keep[0] if keep else None,
            queueCreateInfoCount=1,
            pQueueCreateInfos=qcis,
            ppEnabledExtensionNames=exts or None,
        )
        self.handle = call(vk.vkCreateDevice, chosen.handle, dci, None)
        del dci, qcis, qci, priorities
        keep.clear()
        self.queue = vk.vkGetDeviceQueue(self.handle, self.queue_family, 0)
        pool_info = vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_TRANSIENT_BIT
            | vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            queueFamilyIndex=self.queue_family,
        )
        self._transfer_pool = call(vk.vkCreateCommandPool, self.handle, pool_info, None)
        self._track(1)
        self._transfer_fence = call(vk.vkCreateFence, self.handle, vk.VkFenceCreateInfo(), None)
        self._track(1)
        self._open_pipeline_cache(chosen)

    def proc(self, name: str) -> Any:
        """The device-level function ``name`` (an extension's entry point) as a raw cffi
        function pointer from vkGetDeviceProcAddr, cached. Raw, not the binding's wrapper:
        the wrapper allocates output arrays without their sType, which the spec forbids."""
        fn = self._procs.get(name)
        if fn is None:
            self._require_open()
            ptr = vk.lib.vkGetDeviceProcAddr(self.handle, name.encode())
            if ptr == vk.ffi.NULL:
                raise VulkanError(f"vkGetDeviceProcAddr({name!r}) returned NULL on {self.name}")
            fn = self._procs[name] = vk.ffi.cast("PFN_" + name, ptr)
        return fn

    @property
    def captures_pipeline_statistics(self) -> bool:
        """New compute pipelines are created with CAPTURE_STATISTICS: the device supports it
        and ``config.pipeline_stats`` (POOTVK_PIPELINE_STATS=1) asks for it."""
        return self.pipeline_executable_info and self.config.pipeline_stats

    def _open_pipeline_cache(self, chosen: PhysicalDeviceInfo) -> None:
        """The VkPipelineCache every pipeline of this device is created through, seeded from
        ``pipeline_cache_path`` (a bad file warns and starts empty; see pipeline_cache)."""
        identity = pipeline_cache.cache_identity(chosen.handle)
        #: <cache_dir>/pipelines/<vendor>-<device>-<driverVersion>-<pipelineCacheUUID>.bin
        self.pipeline_cache_path = pipeline_cache.cache_path(self.config.cache_dir, identity)
        self.pipeline_cache, self._pipeline_cache_seed = pipeline_cache.create(
            self.handle, self.pipeline_cache_path, identity
        )
        self._track(1)

    def save_pipeline_cache(self) -> bool:
        """Write the pipeline cache's data to ``pipeline_cache_path`` now (atomically) when
        it changed since it was loaded or last saved; close() does this too."""
        with self._lock:
            if self.handle is None or self.pipeline_cache is None:
                return False
            data = pipeline_cache.get_data(self.handle, self.pipeline_cache)
            if data == self._pipeline_cache_seed:
                return False
            saved = pipeline_cache.save(
                self.pipeline_cache_path, data, self.config.cache_max_bytes
            )
            if saved:
                self._pipeline_cache_seed = data
            return saved

    # --- ownership (called by Owned only) -------------------------------------------------

    def _track(self, delta: int) -> None:
        self._live += delta

    def _adopt(self, obj: Owned) -> None:
        self._owned[id(obj)] = obj

    def _disown(self, obj: Owned) -> None:
        with self._lock:
            self._owned.pop(id(obj), None)
            if isinstance(obj, Pipeline) and self._pipelines.get(obj.key) is obj:
                self._pipelines.pop(obj.key, None)
                self._pipeline_users.pop(obj.key, None)

    def live_objects(self) -> int:
        """Vulkan handles currently owned through this Device (buffers, memories, pipeline
        parts, pools, fences, query pools...), not counting the VkDevice itself."""
        return self._live

    @property
    def closed(self) -> bool:
        return self.handle is None

    def _require_open(self) -> None:
        if self.handle is None:
            raise Closed(f"device {self.name!r}")

    @property
    def fence_timeout_ns(self) -> int:
        """config.fence_timeout_s (POOTVK_FENCE_TIMEOUT_S) in nanoseconds."""
        return max(0, int(self.config.fence_timeout_s * 1e9))

    @property
    def spin_ns(self) -> int:
        """How long a fence wait polls before it blocks (config.spin_us, POOTVK_SPIN_US).

        Why: a blocking vkWaitForFences wakes the thread through the kernel, which costs
        tens of microseconds per step on top of a ~1-2 ms decode step; polling the fence
        answers within a microsecond of completion (CUDA's default sync spins too). Default
        SPIN_US on a GPU, 0 on a CPU device (lavapipe's own threads need the cores)."""
        us = self.config.spin_us
        if us is None:
            us = 0.0 if self.profile.device_type == "cpu" else SPIN_US
        return max(0, int(us * 1e3))

    # --- factories -----------------------------------------------------------------------

    def create_buffer(self, nbytes: int, *, host_visible: bool = False, name: str = "") -> Buffer:
        """A storage buffer of ``max(4, round_up(nbytes, 4))`` bytes owned by this device."""
        self._require_open()
        return Buffer(self, nbytes, host_visible=host_visible, name=name)

    def compute_pipeline(
        self, spirv: bytes, n_bindings: int, push_words: int = 0, *, hold: bool = False
    ) -> Pipeline:
        """The pipeline for (spirv, n_bindings, push-constant words), created once and cached
        on this device.

        The cache is an LRU of ``max_cached_pipelines`` entries: beyond that the least
        recently used pipeline that nobody holds is destroyed. ``hold=True`` marks it in use
        (never evicted) until :meth:`release_pipeline`; a Replay holds its pipelines.
        """
        self._require_open()
        key = pipeline_key(spirv, n_bindings, push_words)
        with self._lock:
            p = self._pipelines.get(key)
            if p is None or p.destroyed:
                p = Pipeline(self, spirv, n_bindings, push_words)
                self._pipelines[key] = p
            self._pipelines.move_to_end(key)
            if hold:
                self._pipeline_users[key] = self._pipeline_users.get(key, 0) + 1
            self._trim_pipelines(keep=key)
            return p

    def release_pipeline(self, p: Pipeline) -> None:
        """Undo one ``compute_pipeline(..., hold=True)``."""
        with self._lock:
            n = self._pipeline_users.get(p.key, 0) - 1
            if n > 0:
                self._pipeline_users[p.key] = n
            else:
                self._pipeline_users.pop(p.key, None)
            self._trim_pipelines()

    def _trim_pipelines(self, keep: tuple[str, int] | None = None) -> None:
        over = len(self._pipelines) - self.max_cached_pipelines
        if over <= 0 or self.handle is None:
            return
        for key in list(self._pipelines):
            if over <= 0:
                break
            if key == keep or self._pipeline_users.get(key, 0) > 0:
                continue
            self._pipelines[key].destroy()  # _disown drops it from the map
            over -= 1

    # --- one-shot transfers (staging path) -----------------------------------------------

    def _one_shot(self, record: Callable[[Any], None]) -> None:
        """Record, submit and wait for a throwaway command buffer."""
        self._require_open()
        with self._lock:
            info = vk.VkCommandBufferAllocateInfo(
                commandPool=self._transfer_pool,
                level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                commandBufferCount=1,
            )
            cbs = call(vk.vkAllocateCommandBuffers, self.handle, info)
            cb = cbs[0]
            try:
                begin = vk.VkCommandBufferBeginInfo(
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT
                )
                call(vk.vkBeginCommandBuffer, cb, begin)
                record(cb)
                # Make the transfer visible to later compute work and to host reads.
                barrier = vk.VkMemoryBarrier(
                    srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                    dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT
                    | vk.VK_ACCESS_SHADER_WRITE_BIT
                    | vk.VK_ACCESS_HOST_READ_BIT,
                )
                barriers = [barrier]
                vk.vkCmdPipelineBarrier(
                    cb,
                    vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                    vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_HOST_BIT,
                    0, 1, barriers, 0, None, 0, None,
                )
                call(vk.vkEndCommandBuffer, cb)
                cb_list = [cb]
                submit = vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=cb_list)
                submits = [submit]
                fences = [self._transfer_fence]
                with self.queue_lock:
                    call(vk.vkQueueSubmit, self.queue, 1, submits, self._transfer_fence)
                r = vk.lib.vkWaitForFences(self.handle, 1, fences, vk.VK_TRUE,
                                           self.fence_timeout_ns)
                if r == vk.VK_TIMEOUT:
                    # The copy still runs: wait it out before freeing its command buffer,
                    # then report (a copy is never expected to be this slow).
                    vk.lib.vkWaitForFences(self.handle, 1, fences, vk.VK_TRUE, FENCE_TIMEOUT_NS)
                    call(vk.vkResetFences, self.handle, 1, fences)
                    raise DeviceTimeout("one-shot transfer", self.config.fence_timeout_s)
                if r != vk.VK_SUCCESS:
                    raise VulkanError(f"vkWaitForFences returned VkResult {r}")
                call(vk.vkResetFences, self.handle, 1, fences)
            finally:
                vk.vkFreeCommandBuffers(self.handle, self._transfer_pool, 1, cbs)

    def _copy(self, src: Buffer, src_off: int, dst: Buffer, dst_off: int, n: int) -> None:
        region = vk.VkBufferCopy(srcOffset=src_off, dstOffset=dst_off, size=n)
        regions = [region]
        self._one_shot(lambda cb: vk.vkCmdCopyBuffer(cb, src.handle, dst.handle, 1, regions))

    def _fill(self, buf: Buffer, offset: int, n: int, word: int) -> None:
        self._one_shot(lambda cb: vk.vkCmdFillBuffer(cb, buf.handle, offset, n, word))

    def wait_idle(self) -> None:
        self._require_open()
        call(vk.vkDeviceWaitIdle, self.handle)

    # --- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Destroy everything this device owns, then the VkDevice (idempotent)."""
        if self.handle is None:
            return
        try:
            vk.vkDeviceWaitIdle(self.handle)
        except Exception:  # a lost device still has to release its handles
            log.exception("vkDeviceWaitIdle failed during close")
        # Recordings, then pipelines, then buffers (Owned.CLOSE_RANK); creation order within.
        with self._lock:
            owned = sorted(list(self._owned.values()), key=lambda o: o.CLOSE_RANK)
        for obj in owned:
            obj.destroy()
        with self._lock:
            self._pipelines.clear()
            self._pipeline_users.clear()
            self._owned.clear()
        if self.pipeline_cache is not None:
            try:
                self.save_pipeline_cache()
            except Exception:  # a cache that cannot be saved costs a cold compile, no more
                log.exception("saving the pipeline cache %s failed", self.pipeline_cache_path)
            vk.vkDestroyPipelineCache(self.handle, self.pipeline_cache, None)
            self.pipeline_cache = None
            self._track(-1)
        vk.vkDestroyFence(self.handle, self._transfer_fence, None)
        vk.vkDestroyCommandPool(self.handle, self._transfer_pool, None)
        self._track(-2)
        vk.vkDestroyDevice(self.handle, None)
        self.handle = None
        self._procs.clear()
        live_devices.discard(self)

    def __del__(self) -> None:
        # Not weakref.finalize: every Owned refers to its Device and the Device to them
        # (a cycle), so a finalizer holding what close() needs would keep the Device alive
        # forever. The cycle collector runs __del__ (PEP 442) while the owned objects are
        # still intact, so close() destroys them all in order.
        try:
            if getattr(self, "handle", None) is not None:
                self.close()
        except Exception:  # never raise from the collector
            log.exception("closing a garbage-collected Device failed")

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._live} live handles"
        return f"Device({self.name!r}, {self.profile.device_type}, {state})"


_shared: dict[int, Device] = {}  # physical-device index -> the shared Device
_default_lock = threading.RLock()


def physical_index(selector: object) -> int:
    """The physical-device index a selector names (None: ``config().device``, then the best
    kind). Refuses a selector of the wrong type with InvalidDevice (``1.5``, ``True``...)."""
    if isinstance(selector, bool) or not (
        selector is None or isinstance(selector, (str, numbers.Integral))
    ):
        raise InvalidDevice(selector)
    if isinstance(selector, numbers.Integral):
        selector = int(selector)
        if selector < 0:
            raise InvalidDevice(selector)
    instance(config().validation)
    sel = selector if selector is not None else config().device
    return select(sel, physical_devices()).index


def shared_device(selector: object = None) -> Device:
    """The one process-wide Device of the physical device ``selector`` names: ``0``, ``"0"``,
    a name substring and the default all give the same object when they name the same
    physical device. Re-created if it was closed."""
    index = physical_index(selector)
    with _default_lock:
        d = _shared.get(index)
        if d is None or d.closed:
            d = _shared[index] = Device(index, config())
        return d


def default_device() -> Device:
    """The process-wide Device, created on first call from ``config()`` (re-created if it
    was closed)."""
    return shared_device(None)
