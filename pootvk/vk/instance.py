"""The one process-wide VkInstance, its debug messenger, and the call wrapper.

Why one instance: the validation messenger is attached to it and every Device shares it.
It is created lazily (first Device or physical_devices() call) and torn down at exit after
every live Device is closed, so the validation layer never sees a leaked child at
vkDestroyInstance and no Python callback runs during interpreter shutdown.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from typing import Any

import vulkan as vk

from pootvk.config import config
from pootvk.errors import DeviceNotFound, VulkanError

from . import validation

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"

_lock = threading.RLock()
_instance: Instance | None = None
#: Devices that are still open, closed at exit before the instance is destroyed.
live_devices: weakref.WeakSet[Any] = weakref.WeakSet()


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a binding function and turn its result-code exceptions into VulkanError."""
    try:
        return fn(*args)
    except (vk.VkError, vk.VkException) as e:
        raise VulkanError(f"{getattr(fn, '__name__', fn)} failed: {type(e).__name__}") from e


def version_string(v: int) -> str:
    return f"{vk.VK_VERSION_MAJOR(v)}.{vk.VK_VERSION_MINOR(v)}.{vk.VK_VERSION_PATCH(v)}"


class Instance:
    """Owns the VkInstance and (when validating) the VkDebugUtilsMessengerEXT."""

    def __init__(self, validate: bool) -> None:
        try:
            loader_version = vk.vkEnumerateInstanceVersion()
        except Exception:  # a 1.0 loader has no vkEnumerateInstanceVersion
            loader_version = vk.VK_MAKE_VERSION(1, 0, 0)
        if loader_version < vk.VK_MAKE_VERSION(1, 1, 0):
            raise VulkanError(f"Vulkan loader {version_string(loader_version)} < 1.1")
        self.api_version = min(loader_version, vk.VK_MAKE_VERSION(1, 3, 0))
        available = {e.extensionName for e in vk.vkEnumerateInstanceExtensionProperties(None)}
        #: name -> spec version of every installed layer
        layers_available = {lay.layerName: int(lay.specVersion)
                            for lay in vk.vkEnumerateInstanceLayerProperties()}
        extensions: list[str] = []
        layers: list[str] = []
        flags = 0
        if "VK_KHR_portability_enumeration" in available:
            extensions.append("VK_KHR_portability_enumeration")
            flags |= vk.VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR
        if validate:
            if VALIDATION_LAYER not in layers_available:
                raise VulkanError(
                    f"POOTVK_VALIDATION=1 but {VALIDATION_LAYER} is not installed "
                    "(apt-get install vulkan-validationlayers, or unset POOTVK_VALIDATION)"
                )
            if "VK_EXT_debug_utils" not in available:
                raise VulkanError("validation requested but VK_EXT_debug_utils is missing")
            layers.append(VALIDATION_LAYER)
            extensions.append("VK_EXT_debug_utils")
            spec = layers_available[VALIDATION_LAYER]
            validation.set_layer_version(
                (vk.VK_VERSION_MAJOR(spec), vk.VK_VERSION_MINOR(spec), vk.VK_VERSION_PATCH(spec)))
        self.validation = validate
        self.extensions = tuple(extensions)
        # Keep every nested struct referenced until vkCreateInstance returns.
        app = vk.VkApplicationInfo(
            pApplicationName="pootvk",
            applicationVersion=1,
            pEngineName="pootvk",
            engineVersion=1,
            apiVersion=self.api_version,
        )
        messenger_info = validation.messenger_create_info() if validate else None
        info = vk.VkInstanceCreateInfo(
            pNext=messenger_info,  # also reports problems inside create/destroy instance
            flags=flags,
            pApplicationInfo=app,
            ppEnabledLayerNames=layers or None,
            ppEnabledExtensionNames=extensions or None,
        )
        try:
            self.handle = vk.vkCreateInstance(info, None)
        except (vk.VkErrorIncompatibleDriver, vk.VkErrorInitializationFailed) as e:
            raise DeviceNotFound(None, [], f"vkCreateInstance: {type(e).__name__}") from e
        except (vk.VkError, vk.VkException) as e:
            raise VulkanError(f"vkCreateInstance failed: {type(e).__name__}") from e
        del info, app
        self._messenger = None
        self._destroy_messenger: Callable[..., Any] | None = None
        if validate:
            create = vk.vkGetInstanceProcAddr(self.handle, "vkCreateDebugUtilsMessengerEXT")
            self._destroy_messenger = vk.vkGetInstanceProcAddr(
                self.handle, "vkDestroyDebugUtilsMessengerEXT"
            )
            self._messenger_info = validation.messenger_create_info()
            self._messenger = call(create, self.handle, self._messenger_info, None)

    def physical_device_handles(self) -> list[Any]:
        return list(call(vk.vkEnumeratePhysicalDevices, self.handle))

    def destroy(self) -> None:
        if self.handle is None:
            return
        if self._messenger is not None and self._destroy_messenger is not None:
            self._destroy_messenger(self.handle, self._messenger, None)
            self._messenger = None
        vk.vkDestroyInstance(self.handle, None)
        self.handle = None


def instance(validate: bool | None = None) -> Instance:
    """The process-wide Instance; ``validate`` (default config().validation) only matters
    on the first call, which creates it."""
    global _instance
    with _lock:
        if _instance is None:
            _instance = Instance(config().validation if validate is None else validate)
        return _instance


def validation_active() -> bool:
    """True when the live instance runs with VK_LAYER_KHRONOS_validation and a messenger."""
    return _instance is not None and _instance.validation and _instance._messenger is not None


@atexit.register
def _shutdown() -> None:
    global _instance
    for dev in list(live_devices):
        try:
            dev.close()
        except Exception:
            pass
    if _instance is not None:
        _instance.destroy()
        _instance = None
