"""The validation channel: messages from VK_LAYER_KHRONOS_validation, collected in-process.

Why: every test runs under the Khronos validation layer and must fail on any message, so
the messages are appended to a list a test can read and clear (the layer would otherwise only
print them). The list is process-wide because the debug messenger belongs to the one
process-wide VkInstance.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import vulkan as vk

log = logging.getLogger("pootvk.vk")

_lock = threading.Lock()
_messages: list[str] = []

#: Severities delivered to the callback: warnings and errors only (no INFO / VERBOSE).
SEVERITIES = (
    vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
    | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT
)
#: Message types: validation (spec violations) and general (layer/loader problems).
TYPES = (
    vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
    | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
)


#: VK_KHR_cooperative_matrix arrived in Vulkan 1.3.255. A validation layer older than that
#: (Debian bookworm's is 1.3.239) does not know it: it reports the extension and its feature
#: struct (1000506000) at device creation, and the SPIR-V capability (6022,
#: CooperativeMatrixKHR), the SPIR-V extension and the module built on them as invalid,
#: though the device lists the extension and pootvk enables it. Those
#: messages, and only those, are not counted while the layer predates the extension; with
#: a newer layer every message counts again.
COOPMAT_LAYER_VERSION = (1, 3, 255)
COOPMAT_FALSE_ALARMS = (
    # vkCreateDevice: the extension's feature struct and the extension itself
    "pNext chain includes a structure with unknown VkStructureType (1000506000)",
    "Device Extension VK_KHR_cooperative_matrix is not supported by this layer",
    # vkCreateShaderModule: a shader using it
    "Invalid capability operand: 6022",
    "(SPV_KHR_cooperative_matrix) was declared that is not supported by Vulkan",
    "A SPIR-V Capability (Unhandled OpCapability) was declared that is not supported",
)
_layer_version: tuple[int, int, int] | None = None


def set_layer_version(version: tuple[int, int, int]) -> None:
    """The enabled validation layer's spec version (the instance reports it)."""
    global _layer_version
    _layer_version = version


def layer_predates_coopmat() -> bool:
    return _layer_version is not None and _layer_version < COOPMAT_LAYER_VERSION


def is_false_alarm(msg: str) -> bool:
    """A message the enabled layer gives only because it predates VK_KHR_cooperative_matrix."""
    return layer_predates_coopmat() and any(a in msg for a in COOPMAT_FALSE_ALARMS)


def validation_messages() -> list[str]:
    """A copy of every validation message received since the last clear."""
    with _lock:
        return list(_messages)


def clear_validation_messages() -> None:
    """Forget the messages received so far (tests call it before each test)."""
    with _lock:
        _messages.clear()


def _callback(severity: int, types: int, data: Any, user: Any) -> int:
    """VkDebugUtilsMessengerCallbackEXT: record the text, never abort the call (VK_FALSE)."""
    try:
        text = vk.ffi.string(data.pMessage).decode("utf-8", "replace") if data.pMessage else ""
        ident = vk.ffi.string(data.pMessageIdName).decode("utf-8", "replace") if (
            data.pMessageIdName
        ) else ""
        msg = f"[{ident}] {text}" if ident else text
        if is_false_alarm(msg):
            log.debug("validation layer %s predates VK_KHR_cooperative_matrix: %s",
                      _layer_version, msg)
            return vk.VK_FALSE
        with _lock:
            _messages.append(msg)
        if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT:
            log.error("vulkan validation: %s", msg)
        else:
            log.warning("vulkan validation: %s", msg)
    except Exception:  # a raising callback would be swallowed by cffi with a stderr dump
        log.exception("validation callback failed")
    return vk.VK_FALSE


def messenger_create_info() -> Any:
    """The VkDebugUtilsMessengerCreateInfoEXT routing messages to :func:`_callback`."""
    return vk.VkDebugUtilsMessengerCreateInfoEXT(
        messageSeverity=SEVERITIES, messageType=TYPES, pfnUserCallback=_callback
    )
