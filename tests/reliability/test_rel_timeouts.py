"""Item 5: a fence wait past POOTVK_FENCE_TIMEOUT_S raises DeviceTimeout naming the kernel,
the limit and the setting; the next submit never hangs (refused at once while the work
still runs, accepted once it finished)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pootvk.config import Config, config
from pootvk.errors import DeviceTimeout
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import Buffer, BufferRange, Device, Dispatch, Pipeline, Recorder, Recording

GROUPS = 2000  # x 30000 iterations: ~0.3 s on lavapipe
GPU_GROUPS = (65535, 16)  # x 65535 iterations: ~0.5 s on an H200 (one lane per workgroup)
SLOW = """#version 450
layout(local_size_x = 1) in;
layout(std430, set = 0, binding = 0) buffer B { uint n; uint acc; } b;
void main() {
    uint x = 2463534242u;  // xorshift32: a chain the compiler cannot shorten
    // llvmpipe stops any loop after 65535 iterations: slowness comes from the grid.
    for (uint i = 0u; i < b.n; ++i) { x ^= x << 13; x ^= x >> 17; x ^= x << 5; }
    atomicXor(b.acc, x);
}
"""


def test_fence_timeout_env_is_read_into_config() -> None:
    assert Config.from_env({"POOTVK_FENCE_TIMEOUT_S": "0.25"}).fence_timeout_s == 0.25
    assert Config.from_env({}).fence_timeout_s == 600.0


def slow_loop(d: Device) -> tuple[Pipeline, Buffer, Recording]:
    """SLOW's pipeline, its buffer set to ~0.3-0.5 s of work, and its recording."""
    p = d.compute_pipeline(compile_glsl(SLOW), 1)
    buf = d.create_buffer(8, host_visible=True, name="slow")
    cpu = d.profile.device_type == "cpu"
    buf.write(0, np.array([30_000 if cpu else 65_535, 0], np.uint32))
    grid = (GROUPS, 1, 1) if cpu else (*GPU_GROUPS, 1)
    return p, buf, Recorder(d).record([Dispatch(p, (BufferRange(buf),), grid, "slow_loop")])


def test_slow_kernel_times_out_then_the_device_is_usable() -> None:
    with Device(None, Config(**{**config().__dict__, "fence_timeout_s": 0.002})) as d:
        _, buf, rec = slow_loop(d)
        t = time.perf_counter()
        with pytest.raises(DeviceTimeout) as e:
            rec.submit()
        assert time.perf_counter() - t < 2.0
        msg = str(e.value)
        assert "slow_loop" in msg and "POOTVK_FENCE_TIMEOUT_S" in msg and "0.002" in msg
        assert e.value.limit_s == pytest.approx(0.002)
        # The next submit answers at once (refused while the work runs), never a hang.
        t = time.perf_counter()
        with pytest.raises(DeviceTimeout) as again:
            rec.submit()
        assert time.perf_counter() - t < 0.5
        assert again.value.still_running and "still running" in str(again.value)
        # Do what the message says: a longer limit; the device is usable again.
        d.config = Config(**{**config().__dict__, "fence_timeout_s": 60.0})
        buf.write(0, np.array([1, 0], np.uint32))
        rec.wait()  # the timed-out submit finishes within the new limit
        rec.submit()
        assert buf.read_array(0, 1, np.uint32)[0] == 1


def test_fence_polling_before_the_blocking_wait() -> None:
    """POOTVK_SPIN_US: a wait polls the fence first (GPUs by default, never a CPU device
    unless asked); results are the same, and the limit still holds across the two phases."""
    assert Config.from_env({"POOTVK_SPIN_US": "50"}).spin_us == 50.0
    assert Config.from_env({}).spin_us is None
    spin = Config(**{**config().__dict__, "spin_us": 20_000.0, "fence_timeout_s": 0.002})
    with Device(None, spin) as d:
        assert d.spin_ns == 20_000_000
        p, buf, rec = slow_loop(d)
        t = time.perf_counter()
        with pytest.raises(DeviceTimeout):
            rec.submit()  # polls 2 ms (the limit, not 20), then no blocking time is left
        assert time.perf_counter() - t < 2.0
        d.config = Config(**{**spin.__dict__, "fence_timeout_s": 60.0})
        rec.wait()
        one = Recorder(d).record([Dispatch(p, (BufferRange(buf),), (1, 1, 1), "one")])
        buf.write(0, np.array([3, 0], np.uint32))
        one.submit()  # polled to completion: one invocation, three xorshift rounds
        x = 2463534242
        for _ in range(3):
            x ^= (x << 13) & 0xFFFFFFFF
            x ^= x >> 17
            x ^= (x << 5) & 0xFFFFFFFF
        assert not one._pending and buf.read_array(0, 2, np.uint32).tolist() == [3, x]
    with Device(None, Config(**{**config().__dict__, "spin_us": None})) as d:
        assert (d.spin_ns == 0) == (d.profile.device_type == "cpu")
