"""Raw Vulkan through the ``vulkan`` cffi binding: devices, buffers, pipelines, recordings.

Every handle has exactly one owner that destroys it (an ``Owned``: Buffer, Pipeline,
Recording); a Device owns everything made through it and destroys it all on ``close()``.
"""

from .device import Device, default_device, physical_index, shared_device
from .hazards import Access, barriers_before
from .instance import validation_active
from .memory import Buffer
from .owned import Owned
from .physical import PhysicalDeviceInfo, physical_devices
from .pipeline import Pipeline
from .recorder import BufferRange, Dispatch, InvalidBinding, Recorder, Recording, Timestamps
from .validation import clear_validation_messages, validation_messages

__all__ = [
    "Access",
    "Buffer",
    "BufferRange",
    "Device",
    "Dispatch",
    "InvalidBinding",
    "Owned",
    "PhysicalDeviceInfo",
    "Pipeline",
    "Recorder",
    "Recording",
    "Timestamps",
    "barriers_before",
    "clear_validation_messages",
    "default_device",
    "physical_devices",
    "physical_index",
    "shared_device",
    "validation_active",
    "validation_messages",
]
