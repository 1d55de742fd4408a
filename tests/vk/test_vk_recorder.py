from __future__ import annotations

import numpy as np
import pytest
import vulkan

from pootvk.errors import BindingRange, GridLimit
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import BufferRange, Device, Dispatch, InvalidBinding, Recorder

ADD = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };
layout(set = 0, binding = 2) writeonly buffer C { float c[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < c.length()) c[i] = a[i] + b[i];
}
"""
N = 1000


@pytest.fixture(scope="module")
def add(device):
    return device.compute_pipeline(compile_glsl(ADD), 3)


def groups(n: int) -> tuple[int, int, int]:
    return ((n + 63) // 64, 1, 1)


def test_pipeline_cached(device, add) -> None:
    assert device.compute_pipeline(compile_glsl(ADD), 3) is add


def test_add_replayed_with_changed_inputs(device, add) -> None:
    a = device.create_buffer(N * 4, host_visible=True, name="a")
    b = device.create_buffer(N * 4, name="b")
    c = device.create_buffer(N * 4, host_visible=True, name="c")
    rec = Recorder(device).record(
        [Dispatch(add, (BufferRange(a), BufferRange(b), BufferRange(c)), groups(N), "add")]
    )
    rng = np.random.default_rng(1)
    try:
        for _ in range(3):
            x = rng.standard_normal(N).astype(np.float32)
            y = rng.standard_normal(N).astype(np.float32)
            a.write(0, x)
            b.write(0, y)
            rec.submit()
            np.testing.assert_array_equal(c.read_array(0, N, np.float32), x + y)
        assert rec.gpu_time_ns() is None
        rec.submit(wait=False)
        rec.wait()
    finally:
        rec.destroy()
        for buf in (a, b, c):
            buf.destroy()


def test_dependent_dispatches_sub_ranges_and_timestamps(device, add) -> None:
    """c = a + b then d = c + b, with every operand a range of one arena buffer."""
    align = device.profile.min_storage_offset_alignment
    seg = (N * 4 + align - 1) // align * align
    arena = device.create_buffer(4 * seg, name="arena")
    r = [BufferRange(arena, i * seg, N * 4) for i in range(4)]
    x = np.arange(N, dtype=np.float32)
    y = np.full(N, 0.5, dtype=np.float32)
    arena.write(r[0].offset, x)
    arena.write(r[1].offset, y)
    rec = Recorder(device).record(
        [
            Dispatch(add, (r[0], r[1], r[2]), groups(N), "c"),
            Dispatch(add, (r[2], r[1], r[3]), groups(N), "d"),
        ],
        timestamps=True,
    )
    try:
        rec.submit()
        np.testing.assert_array_equal(arena.read_array(r[3].offset, N, np.float32), x + 1.0)
        t = rec.gpu_time_ns()
        per = rec.dispatch_times_ns()
        assert t is not None and t > 0
        assert per is not None and len(per) == 2 and all(p >= 0 for p in per)
        assert sum(per) == pytest.approx(t)
    finally:
        rec.destroy()
        arena.destroy()


def test_invalid_binding_is_a_value_error() -> None:
    assert issubclass(InvalidBinding, ValueError)


def test_bad_bindings_raise_before_vulkan(device, add, monkeypatch) -> None:
    buf = device.create_buffer(4096, name="buf")
    base = device.live_objects()
    ok = BufferRange(buf, 0, 1024)
    rec = Recorder(device)
    try:
        with monkeypatch.context() as m:
            for name in ("vkCreateDescriptorPool", "vkCreateCommandPool", "vkCreateFence"):
                m.setattr(vulkan, name, _boom)
            cases = [
                (InvalidBinding, (BufferRange(buf, 4, 16), ok, ok), groups(N)),  # misaligned
                (InvalidBinding, (BufferRange(buf, 4080, 32), ok, ok), groups(N)),  # past end
                (InvalidBinding, (BufferRange(buf, 4096), ok, ok), groups(N)),  # empty
                (InvalidBinding, (ok, ok), groups(N)),  # wrong count
                (GridLimit, (ok, ok, ok), (device.profile.max_grid[0] + 1, 1, 1)),
            ]
            for err, binds, g in cases:
                with pytest.raises(err):
                    rec.record([Dispatch(add, binds, g, "bad")])
            m.setattr(device, "profile", device.profile.with_(max_storage_buffer_range=512))
            with pytest.raises(BindingRange) as e:
                rec.record([Dispatch(add, (ok, ok, ok), groups(N), "wide")])
            assert e.value.nbytes == 1024 and e.value.limit == 512
        assert device.live_objects() == base
    finally:
        buf.destroy()


def _boom(*a, **k):
    raise AssertionError("Vulkan was called before validation finished")


def test_no_leaks(device, add) -> None:
    base = device.live_objects()
    bufs = [device.create_buffer(N * 4, host_visible=i == 2, name=f"l{i}") for i in range(3)]
    rec = Recorder(device).record(
        [Dispatch(add, tuple(BufferRange(b) for b in bufs), groups(N))] * 2, timestamps=True
    )
    rec.submit()
    assert device.live_objects() > base
    rec.destroy()
    rec.destroy()
    for b in bufs:
        b.destroy()
    assert device.live_objects() == base


def test_close_destroys_recordings_and_pipelines() -> None:
    d = Device()
    p = d.compute_pipeline(compile_glsl(ADD), 3)
    bufs = [d.create_buffer(256) for _ in range(3)]
    rec = Recorder(d).record([Dispatch(p, tuple(BufferRange(b) for b in bufs), (4, 1, 1))])
    rec.submit(wait=False)
    d.close()
    assert d.live_objects() == 0 and p.destroyed and all(b.destroyed for b in bufs)
