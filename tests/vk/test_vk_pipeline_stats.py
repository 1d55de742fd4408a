"""Pipeline.statistics(): the driver's per-executable statistics through
VK_KHR_pipeline_executable_properties, or a typed refusal naming what is missing.

Lavapipe (Mesa 22.3) does not expose the extension, so here the refusal path runs; on a
driver that does (NVIDIA, RADV), the same tests check real numbers.
"""

from __future__ import annotations

import numbers

import pytest

from pootvk.config import Config, config
from pootvk.errors import CapabilityError, PipelineStatisticsUnavailable
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import Device
from pootvk.vk.physical import PIPELINE_EXECUTABLE_EXT, pipeline_executable_info

SRC = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer A { float a[]; };
layout(std430, binding = 1) buffer B { float b[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    b[i] = a[i] * 2.0 + 1.0;
}
"""


def test_config_reads_pipeline_stats() -> None:
    assert Config.from_env({}).pipeline_stats is False
    assert Config.from_env({"POOTVK_PIPELINE_STATS": "0"}).pipeline_stats is False
    assert Config.from_env({"POOTVK_PIPELINE_STATS": "1"}).pipeline_stats is True


def _stats_device(device, on: bool) -> Device:  # type: ignore[no-untyped-def]
    cfg = Config(**{**config().__dict__, "pipeline_stats": on})
    return Device(device.physical.index, cfg)


def test_device_enables_the_feature_exactly_when_exposed(device) -> None:
    p = device.physical
    exposed = PIPELINE_EXECUTABLE_EXT in p.extensions
    assert device.pipeline_executable_info == pipeline_executable_info(p.handle, p.extensions)
    if not exposed:
        assert device.pipeline_executable_info is False


def test_statistics_with_the_flag(device) -> None:
    with _stats_device(device, True) as d:
        pipe = d.compute_pipeline(compile_glsl(SRC), 2)
        if not d.pipeline_executable_info:  # lavapipe: the typed refusal names the extension
            assert pipe.captures_statistics is False
            with pytest.raises(PipelineStatisticsUnavailable) as e:
                pipe.statistics()
            assert isinstance(e.value, CapabilityError)
            assert e.value.device == d.name
            assert any(PIPELINE_EXECUTABLE_EXT in m for m in e.value.missing)
            assert PIPELINE_EXECUTABLE_EXT in str(e.value)
            return
        assert pipe.captures_statistics is True
        stats = pipe.statistics()
        assert stats, "the driver reported no statistic"
        for name, v in stats.items():
            assert isinstance(name, str) and name
            assert isinstance(v, (bool, numbers.Real))
            if isinstance(v, int) and not isinstance(v, bool):
                assert v >= 0, (name, v)
        assert pipe.statistics() == stats  # stable across calls


def test_statistics_without_the_flag_names_what_is_missing(device) -> None:
    with _stats_device(device, False) as d:
        pipe = d.compute_pipeline(compile_glsl(SRC), 2)
        assert pipe.captures_statistics is False
        with pytest.raises(PipelineStatisticsUnavailable) as e:
            pipe.statistics()
        want = "POOTVK_PIPELINE_STATS" if d.pipeline_executable_info else PIPELINE_EXECUTABLE_EXT
        assert len(e.value.missing) == 1 and want in e.value.missing[0]


# --- the query's contract with the spec, against a scripted driver ------------------------
# Lavapipe lacks the extension, so the two-call enumeration, the output sTypes and the value
# formats are checked here against entry points written from the spec: they refuse output
# structs whose sType the caller did not set (as the validation layer would) and report two
# executables with one statistic of each format; an exception inside them returns an error.

EXECS = [("Compute", [("Register Count", "u64", 40), ("Spill Bytes", "i64", 3),
                      ("Uses Barrier", "b32", True), ("Occupancy", "f64", 0.5)]),
         ("Second", [("Register Count", "u64", 7)])]


def _scripted(pipe, fail_stats: bool = False):  # type: ignore[no-untyped-def]
    import vulkan as vk

    ffi = vk.ffi
    fmt = {"b32": vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR,
           "i64": vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR,
           "u64": vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR,
           "f64": vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR}
    bad = vk.VK_ERROR_INITIALIZATION_FAILED

    def execs(device, info, count, props):  # type: ignore[no-untyped-def]
        if info.sType != vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR or info.pipeline != pipe.handle:
            return bad
        if props == ffi.NULL:
            count[0] = len(EXECS)
            return vk.VK_SUCCESS
        for i, (name, _) in enumerate(EXECS[:count[0]]):
            if props[i].sType != vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR:
                return bad
            props[i].name = name.encode()
        return vk.VK_SUCCESS

    def stats(device, info, count, out):  # type: ignore[no-untyped-def]
        if info.sType != vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR or fail_stats:
            return bad
        rows = EXECS[info.executableIndex][1]
        if out == ffi.NULL:
            count[0] = len(rows)
            return vk.VK_SUCCESS
        for i, (name, kind, value) in enumerate(rows[:count[0]]):
            if out[i].sType != vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR:
                return bad
            out[i].name = name.encode()
            out[i].format = fmt[kind]
            setattr(out[i].value, kind, value)
        return vk.VK_SUCCESS

    return {
        "vkGetPipelineExecutablePropertiesKHR":
            ffi.callback("PFN_vkGetPipelineExecutablePropertiesKHR", execs, error=bad),
        "vkGetPipelineExecutableStatisticsKHR":
            ffi.callback("PFN_vkGetPipelineExecutableStatisticsKHR", stats, error=bad),
    }


def test_statistics_query_follows_the_spec(device, monkeypatch) -> None:
    from pootvk.errors import VulkanError

    with _stats_device(device, False) as d:
        pipe = d.compute_pipeline(compile_glsl(SRC), 2)
        procs = _scripted(pipe)
        monkeypatch.setattr(d, "proc", lambda name: procs[name])
        monkeypatch.setattr(pipe, "captures_statistics", True)
        stats = pipe.statistics()
        assert stats == {"Register Count": 40, "Spill Bytes": 3, "Uses Barrier": True,
                         "Occupancy": 0.5, "Second: Register Count": 7}
        assert type(stats["Register Count"]) is int and type(stats["Uses Barrier"]) is bool
        failing = _scripted(pipe, fail_stats=True)
        monkeypatch.setattr(d, "proc", lambda name: failing[name])
        with pytest.raises(VulkanError, match="statistics"):
            pipe.statistics()
