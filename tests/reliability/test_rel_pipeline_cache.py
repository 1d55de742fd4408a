"""Item 2: a VkPipelineCache persisted per device in the cache folder, which a bad file
never breaks (it is discarded with a warning naming it, and the device starts empty)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pootvk.config import config
from pootvk.errors import CacheCorrupt, VulkanError
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import Device, pipeline_cache

ROOT = Path(__file__).resolve().parents[2]
K = """#version 450
layout(local_size_x = 1) in;
layout(std430, set = 0, binding = 0) buffer B { float x[]; } b;
void main() { b.x[0] = %s; }
"""

# A fresh process (cold in-memory caches): open a Device on the cache folder, create the
# same pipelines, report what it found and how long the pipelines took.
CHILD = """
import json, sys, time, warnings
warnings.simplefilter("error")  # a good file must load without any warning
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import Device
K = %r
spv = [compile_glsl(K %% f"{i}.5") for i in range(3)]
with Device() as d:
    seeded = len(d._pipeline_cache_seed)
    t = time.perf_counter()
    for s in spv:
        d.compute_pipeline(s, 1)
    dt = time.perf_counter() - t
    path = str(d.pipeline_cache_path)
print(json.dumps({"path": path, "seeded": seeded, "seconds": dt}))
"""


def _child(cache_dir: Path) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, POOTVK_CACHE_DIR=str(cache_dir), PYTHONPATH=path)
    r = subprocess.run(
        [sys.executable, "-c", CHILD % K], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_second_process_finds_the_saved_cache(tmp_path) -> None:
    first = _child(tmp_path)
    path = Path(first["path"])
    assert path.parent == tmp_path / "pipelines" and first["seeded"] == 0
    assert path.exists() and path.stat().st_size > len(pipeline_cache.MAGIC) + 32
    second = _child(tmp_path)
    assert second["path"] == first["path"]
    assert second["seeded"] > 0  # read, verified and handed to the driver
    assert second["seconds"] <= first["seconds"] * 1.5 + 0.05  # never slower
    assert path.exists()


def _device(cache_dir: Path) -> Device:
    return Device(config=dataclasses.replace(config(), cache_dir=cache_dir))


def _saved_file(tmp_path) -> Path:
    with _device(tmp_path) as d:
        d.compute_pipeline(compile_glsl(K % "7.0"), 1)
        path = d.pipeline_cache_path
    assert path.exists()
    return path


def _works(d: Device) -> None:
    p = d.compute_pipeline(compile_glsl(K % "8.0"), 1)
    assert not p.destroyed and d.pipeline_cache is not None


@pytest.mark.parametrize("damage", ["garbage", "truncate", "flip_byte", "foreign_header"])
def test_bad_file_is_tolerated_named_and_replaced(tmp_path, damage) -> None:
    path = _saved_file(tmp_path)
    blob = path.read_bytes()
    m = len(pipeline_cache.MAGIC) + 32
    if damage == "garbage":
        path.write_bytes(os.urandom(300))
    elif damage == "truncate":
        path.write_bytes(blob[: len(blob) - 7])
    elif damage == "flip_byte":
        path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    else:  # a well-formed file whose Vulkan header names another pipelineCacheUUID
        data = bytearray(blob[m:])
        data[16:32] = bytes(16)
        path.write_bytes(pipeline_cache.encode(bytes(data)))
    with pytest.warns(CacheCorrupt, match=path.name):
        d = _device(tmp_path)
    with d:
        assert d._pipeline_cache_seed == b""  # an empty cache
        _works(d)
    # close() wrote a good file back: the next device loads it without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with _device(tmp_path) as d2:
            assert d2._pipeline_cache_seed
            _works(d2)


def test_a_file_the_driver_refuses_falls_back_to_empty(tmp_path, monkeypatch) -> None:
    path = _saved_file(tmp_path)
    real = pipeline_cache._create

    def refuse(dev, data):  # type: ignore[no-untyped-def]
        if data:
            raise VulkanError("vkCreatePipelineCache failed: VkErrorInitializationFailed")
        return real(dev, data)

    monkeypatch.setattr(pipeline_cache, "_create", refuse)
    with pytest.warns(CacheCorrupt, match=path.name):
        d = _device(tmp_path)
    with d:
        _works(d)


def test_cache_handle_is_counted_and_released(tmp_path) -> None:
    d = _device(tmp_path)
    base = d.live_objects()
    assert base == 3  # transfer pool, transfer fence, pipeline cache
    d.close()
    assert d.live_objects() == 0 and d.pipeline_cache is None


def test_unwritable_folder_costs_nothing(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with _device(blocker) as d:  # <file>/pipelines cannot be created
        _works(d)
        assert not d.save_pipeline_cache()
