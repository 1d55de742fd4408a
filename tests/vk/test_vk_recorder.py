from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import vulkan

from pootvk.errors import BindingRange, GridLimit, VulkanError
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import (
    Access,
    BufferRange,
    Device,
    Dispatch,
    InvalidBinding,
    Recorder,
    barriers_before,
)
from tests.vk.hazard_cases import ADD, ALL_CASES, RANDOM_PROGRAMS, Kernels, run_case

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
        a.write(0, y)
        rec.submit(wait=False)
        rec.wait()
        np.testing.assert_array_equal(c.read_array(0, N, np.float32), y + y)
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
        assert per is not None and len(per) == 2 and all(p > 0 for p in per)
        assert sum(per) == pytest.approx(t)
    finally:
        rec.destroy()
    # "bounds": two timestamps around the whole step, no per-dispatch times
    arena.write(r[3].offset, np.zeros(N, np.float32))
    rec = Recorder(device).record(
        [
            Dispatch(add, (r[0], r[1], r[2]), groups(N), "c"),
            Dispatch(add, (r[2], r[1], r[3]), groups(N), "d"),
        ],
        timestamps="bounds",
    )
    try:
        rec.submit()
        np.testing.assert_array_equal(arena.read_array(r[3].offset, N, np.float32), x + 1.0)
        t = rec.gpu_time_ns()
        assert t is not None and t > 0 and rec._n_queries == 2
        assert rec.dispatch_times_ns() is None
    finally:
        rec.destroy()
        arena.destroy()


def test_bad_bindings_raise_before_vulkan(device, add, monkeypatch) -> None:
    buf = device.create_buffer(4096, name="buf")
    base = device.live_objects()
    ok = BufferRange(buf, 0, 1024)
    rec = Recorder(device)
    try:
        with monkeypatch.context() as m:
            for name in ("vkCreateDescriptorPool", "vkCreateCommandPool", "vkCreateFence"):
                m.setattr(vulkan, name, _boom)
            cases = [  # (binds, the binding named, words of the reason)
                ((ok, BufferRange(buf, 4, 16), ok), 1, "not a multiple"),  # misaligned
                ((ok, ok, BufferRange(buf, 4080, 32)), 2, "outside buffer"),  # past end
                ((BufferRange(buf, 4096), ok, ok), 0, "outside buffer"),  # empty
                ((ok, ok), -1, "2 bindings given"),  # wrong count
            ]
            for binds, index, why in cases:
                with pytest.raises(InvalidBinding, match=why) as e:
                    rec.record([Dispatch(add, binds, groups(N), "bad")])
                assert (e.value.label, e.value.binding) == ("bad", index)
            with pytest.raises(GridLimit):
                rec.record([Dispatch(add, (ok, ok, ok), (device.profile.max_grid[0] + 1, 1, 1))])
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


# --- barriers only on hazards (cases in hazard_cases.py) ----------------------------------


@pytest.fixture(scope="module")
def kernels(device):
    return Kernels(device)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_barriers_only_on_hazards(device, kernels, case) -> None:
    """Level order: the case's recorded order and barriers, and the numbers of running the
    dispatches one after another in the order given; the order given (program_order)
    gives the same numbers with the barriers its own order needs."""
    rec, got, want = run_case(kernels, case, Recorder(device).record)
    assert rec.order == (case.order or tuple(range(len(case.ops))))
    assert rec.barrier_before == case.barriers
    placed = barriers_before(rec.recorded)
    assert tuple(placed[rec.order.index(i)] for i in range(len(case.ops))) == case.barriers
    for b in want:
        np.testing.assert_array_equal(got[b], want[b], err_msg=b)
    prog, got_p, _ = run_case(
        kernels, case, lambda ds: Recorder(device).record(ds, program_order=True)
    )
    assert prog.order == tuple(range(len(case.ops)))
    assert prog.barrier_before == barriers_before(prog.dispatches)
    want_prog = rec.barriers if case.program_barriers is None else case.program_barriers
    assert prog.barriers == want_prog and rec.barriers <= prog.barriers
    for b in want:
        np.testing.assert_array_equal(got_p[b], want[b], err_msg=b)


def test_sync_validation_agrees_with_the_barriers(device) -> None:
    """Under the layer's synchronization validation, the recorder's barriers draw no message,
    and leaving every barrier out draws exactly the hazard each case names (none where the
    recorder placed none): every barrier placed is needed, none left out is. Seeded random
    programs recorded in level order draw no message and give the in-order numbers."""
    from pootvk.vk import validation_active

    if not validation_active():
        pytest.skip("validation is off (POOTVK_VALIDATION=0)")
    env = dict(
        os.environ,
        POOTVK_VALIDATION="1",
        VK_LAYER_ENABLES="VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT",
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.vk.hazard_cases"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    runs = out["cases"]
    assert set(runs) == {c.name for c in ALL_CASES}
    assert len(out["random"]) == RANDOM_PROGRAMS
    for i, (messages, same) in enumerate(out["random"]):
        assert messages == [] and same, (i, messages, same)
    for case in ALL_CASES:
        placed, omitted = runs[case.name]
        assert placed == [], (case.name, placed)
        if not case.hazard:
            assert omitted == [], (case.name, omitted)
        elif case.layer_reports:
            assert any(case.hazard in m for m in omitted), (case.name, omitted)
            assert all("SYNC-HAZARD" in m for m in omitted), (case.name, omitted)


def test_access_must_match_bindings(device, add) -> None:
    bufs = [device.create_buffer(N * 4, name=f"x{i}") for i in range(3)]
    binds = tuple(BufferRange(b) for b in bufs)
    try:
        for access in ((Access.READ, Access.WRITE), (Access.READ, Access.READ, "w")):
            with pytest.raises(InvalidBinding):
                Recorder(device).record([Dispatch(add, binds, groups(N), "bad", access)])
    finally:
        for b in bufs:
            b.destroy()


def test_failed_construction_releases_and_registers_nothing(device, monkeypatch) -> None:
    """An Owned whose creation fails half-way destroys what it made and is not adopted."""
    base, owned = device.live_objects(), dict(device._owned)

    def fail(*a, **k):
        raise vulkan.VkErrorOutOfDeviceMemory()

    monkeypatch.setattr(vulkan, "vkAllocateMemory", fail)  # after vkCreateBuffer succeeded
    with pytest.raises(VulkanError):
        device.create_buffer(64, name="doomed")
    monkeypatch.undo()
    assert device.live_objects() == base and device._owned == owned


def test_only_owned_touches_device_ownership() -> None:
    """Device's private ownership methods are called from owned.py (and device.py) only."""
    vk_dir = Path(__file__).resolve().parents[2] / "pootvk"
    callers = {
        str(f.relative_to(vk_dir))
        for f in vk_dir.rglob("*.py")
        if re.search(r"\._(track|adopt|disown)\(", f.read_text())
    }
    assert callers == {"vk/owned.py", "vk/device.py"}
