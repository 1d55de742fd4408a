"""The per-device VkPipelineCache, persisted across processes in the cache folder.

Why: the driver's compile of SPIR-V to machine code is the slow part of a first call (the
SPIR-V itself is already cached on disk by ``shaders.compiler``). A Device creates one
VkPipelineCache when it opens, seeded from
``<cache_dir>/pipelines/<vendorID>-<deviceID>-<driverVersion>-<pipelineCacheUUID>.bin``,
passes it to every vkCreateComputePipelines, and writes its data back (temp file +
``os.replace``) when it closes.

A file is ``MAGIC + sha256(data) + data``, ``data`` being what vkGetPipelineCacheData
returned. A file that is truncated, fails its digest, carries another driver's Vulkan cache
header, or that the driver refuses never breaks device creation: it is discarded with a
:class:`~pootvk.errors.CacheCorrupt` warning naming the file and the Device starts from an
empty cache (written back on close).
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile
import warnings
from pathlib import Path
from typing import Any

import vulkan as vk

from pootvk.errors import CacheCorrupt, VulkanError

from .instance import call

log = logging.getLogger("pootvk.vk")

MAGIC = b"POOTVKPC1\0"
DIGEST_BYTES = 32
#: VkPipelineCacheHeaderVersionOne: headerSize, headerVersion, vendorID, deviceID, UUID.
VK_HEADER = struct.Struct("<IIII16s")


def cache_identity(physical_handle: Any) -> tuple[int, int, int, bytes]:
    """(vendorID, deviceID, driverVersion, pipelineCacheUUID) of a physical device."""
    p = vk.vkGetPhysicalDeviceProperties(physical_handle)
    uuid = bytes(vk.ffi.buffer(p.pipelineCacheUUID, 16))
    return int(p.vendorID), int(p.deviceID), int(p.driverVersion), uuid


def cache_path(cache_dir: Path, identity: tuple[int, int, int, bytes]) -> Path:
    vendor, device, driver, uuid = identity
    name = f"{vendor:04x}-{device:04x}-{driver:08x}-{uuid.hex()}.bin"
    return Path(cache_dir) / "pipelines" / name


def encode(data: bytes) -> bytes:
    return MAGIC + hashlib.sha256(data).digest() + data


def decode(blob: bytes, identity: tuple[int, int, int, bytes]) -> tuple[bytes | None, str]:
    """(the driver data in a file, "") or (None, why it is refused)."""
    m = len(MAGIC)
    if len(blob) < m + DIGEST_BYTES + VK_HEADER.size or not blob.startswith(MAGIC):
        return None, f"not a pootvk pipeline cache ({len(blob)} bytes)"
    digest, data = blob[m : m + DIGEST_BYTES], blob[m + DIGEST_BYTES :]
    if hashlib.sha256(data).digest() != digest:
        return None, f"digest mismatch ({len(blob)} bytes: truncated or damaged)"
    size, version, vendor, device, uuid = VK_HEADER.unpack_from(data)
    if (
        size < VK_HEADER.size
        or size > len(data)
        or version != vk.VK_PIPELINE_CACHE_HEADER_VERSION_ONE
        or (vendor, device, uuid) != (identity[0], identity[1], identity[3])
    ):
        return None, "its Vulkan header names another driver or version"
    return data, ""


def _discard(path: Path, why: str) -> None:
    warnings.warn(
        f"pootvk: discarding pipeline cache {path}: {why}; starting from an empty cache",
        CacheCorrupt,
        stacklevel=4,
    )
    log.warning("discarding pipeline cache %s: %s", path, why)
    try:
        path.unlink()
    except OSError:
        pass


def load(path: Path, identity: tuple[int, int, int, bytes]) -> bytes:
    """The verified driver data in ``path``, or b"" (missing, or discarded with a warning)."""
    try:
        blob = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return b""
    except OSError as e:
        _discard(path, f"unreadable ({e})")
        return b""
    data, why = decode(blob, identity)
    if data is None:
        _discard(path, why)
        return b""
    return data


def _create(dev: Any, data: bytes) -> Any:
    # The initial data must stay referenced until vkCreatePipelineCache returns.
    buf = vk.ffi.new("char[]", data) if data else None
    info = vk.VkPipelineCacheCreateInfo(initialDataSize=len(data), pInitialData=buf)
    handle = call(vk.vkCreatePipelineCache, dev, info, None)
    del info, buf
    return handle


def create(dev: Any, path: Path, identity: tuple[int, int, int, bytes]) -> tuple[Any, bytes]:
    """(a VkPipelineCache seeded from ``path`` when it verifies, the data it was seeded
    with). A seed the driver refuses is discarded with a warning; the cache starts empty."""
    data = load(path, identity)
    if data:
        try:
            return _create(dev, data), data
        except VulkanError as e:
            _discard(path, f"the driver refused it ({e})")
    return _create(dev, b""), b""


def get_data(dev: Any, cache: Any) -> bytes:
    """vkGetPipelineCacheData, both calls (size, then contents)."""
    size = vk.ffi.new("size_t*")
    r = vk.lib.vkGetPipelineCacheData(dev, cache, size, vk.ffi.NULL)
    if r != vk.VK_SUCCESS or size[0] == 0:
        return b""
    buf = vk.ffi.new("char[]", size[0])
    r = vk.lib.vkGetPipelineCacheData(dev, cache, size, buf)
    if r not in (vk.VK_SUCCESS, vk.VK_INCOMPLETE):
        return b""
    return bytes(vk.ffi.buffer(buf, size[0]))


def save(path: Path, data: bytes, max_bytes: int) -> bool:
    """Write ``data`` to ``path`` atomically; False when it is empty, over ``max_bytes``
    (POOTVK_CACHE_MAX_BYTES) or the folder is not writable (a cold compile next time)."""
    if not data or len(data) > max_bytes:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encode(data))
            os.replace(tmp, path)  # atomic: another process reads the old file or this one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        log.warning("could not save pipeline cache %s: %s", path, e)
        return False
    return True
