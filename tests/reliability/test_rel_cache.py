"""Item 2: the SPIR-V disk cache verifies its entries; the caches are bounded."""

from __future__ import annotations

import os
import warnings

import pytest

from pootvk.config import Config
from pootvk.errors import CacheCorrupt
from pootvk.shaders import compiler
from pootvk.shaders.compiler import cache_key, compile_glsl, trim_disk_cache

K = """#version 450
layout(local_size_x = 1) in;
layout(std430, set = 0, binding = 0) buffer B { float x[]; } b;
void main() { b.x[0] = %s; }
"""


def _entry(tmp_path, src):
    return tmp_path / "spirv" / f"{cache_key(src)}.spv"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_kernel", "flip_byte"])
def test_bad_entry_is_discarded_named_and_rewritten(tmp_path, damage) -> None:
    src, other = K % f"{len(damage)}.0", K % "2.0"
    good = compile_glsl(src, cache_dir=tmp_path)
    path = _entry(tmp_path, src)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: compiler.HEADER_BYTES + 8])
    elif damage == "garbage":
        path.write_bytes(compiler.HEADER_MAGIC + b"\0" * 80)
    elif damage == "other_kernel":
        compile_glsl(other, cache_dir=tmp_path)
        path.write_bytes(_entry(tmp_path, other).read_bytes())
    else:
        path.write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
    compiler.clear_memory_cache()
    before = compiler.glslang_calls
    with pytest.warns(CacheCorrupt, match=str(path.name)):
        assert compile_glsl(src, cache_dir=tmp_path) == good
    assert compiler.glslang_calls == before + 1  # recompiled
    assert compiler.decode_entry(cache_key(src), path.read_bytes()) == good  # rewritten
    compiler.clear_memory_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_glsl(src, cache_dir=tmp_path) == good  # a clean hit now


def test_memo_is_bounded(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(compiler, "MAX_MEMO", 3)
    for i in range(6):
        compile_glsl(K % f"{i}.5", cache_dir=tmp_path)
    assert len(compiler._memory_cache) <= 3


def test_disk_cache_is_capped_oldest_first(tmp_path) -> None:
    assert Config.from_env({"POOTVK_CACHE_MAX_BYTES": "1000"}).cache_max_bytes == 1000
    srcs = [K % f"{i}.25" for i in range(4)]
    for i, s in enumerate(srcs):
        compile_glsl(s, cache_dir=tmp_path)
        os.utime(_entry(tmp_path, s), ns=(i * 10**9, i * 10**9))
    size = _entry(tmp_path, srcs[0]).stat().st_size
    assert trim_disk_cache(tmp_path / "spirv", 2 * size) == 2
    assert [_entry(tmp_path, s).exists() for s in srcs] == [False, False, True, True]


def test_pipeline_cache_is_lru_and_keeps_held_pipelines() -> None:
    from pootvk.vk import Device

    with Device() as d:
        d.max_cached_pipelines = 2
        spv = [compile_glsl(K % f"{i}.75") for i in range(4)]
        held = d.compute_pipeline(spv[0], 1, hold=True)
        others = [d.compute_pipeline(s, 1) for s in spv[1:]]
        assert len(d._pipelines) == 2 and not held.destroyed
        assert others[0].destroyed and not others[-1].destroyed
        d.release_pipeline(held)
        d.compute_pipeline(spv[1], 1)
        assert held.destroyed and len(d._pipelines) == 2
