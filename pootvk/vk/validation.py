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
