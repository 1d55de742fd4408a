"""Item 4: owners of device memory free it when garbage-collected and when closed; use
after close raises Closed naming the object."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import vulkan

import pootvk
from pootvk.errors import Closed
from pootvk.llm import DecodeLoop
from pootvk.ops import trace_attention
from pootvk.runtime import build_replay
from pootvk.vk import Device


def _step_args(rng, b=1, hq=2, hkv=1, d=8):
    return (rng.standard_normal((b, hq, 1, d), dtype=np.float32),
            rng.standard_normal((b, hkv, 1, d), dtype=np.float32),
            rng.standard_normal((b, hkv, 1, d), dtype=np.float32))


def test_dropped_decode_loop_releases_its_handles(device) -> None:
    rng = np.random.default_rng(0)
    with DecodeLoop(1, 2, 1, 8, 16, device=device) as warm:  # pipelines now cached
        warm.step(*_step_args(rng))
    gc.collect()
    base = device.live_objects()
    loop = DecodeLoop(1, 2, 1, 8, 16, device=device)
    loop.step(*_step_args(rng))
    assert device.live_objects() > base
    del loop
    gc.collect()
    assert device.live_objects() == base


def test_use_after_close_raises_closed(device) -> None:
    rng = np.random.default_rng(1)
    loop = DecodeLoop(1, 2, 1, 8, 16, device=device)
    loop.close()
    loop.close()  # idempotent
    with pytest.raises(Closed, match="DecodeLoop"):
        loop.step(*_step_args(rng))
    g = trace_attention((1, 1, 2, 4), (1, 1, 3, 4), (1, 1, 3, 4))
    with build_replay(g, device) as rp:
        pass
    with pytest.raises(Closed, match="replay"):
        rp.step({"q": np.zeros((1, 1, 2, 4), np.float32), "k": np.zeros((1, 1, 3, 4)),
                 "v": np.zeros((1, 1, 3, 4))})
    with pytest.raises(Closed):
        rp.read_state("q")


def test_closed_device_is_refused_and_replaced() -> None:
    d = Device()
    d.close()
    with pytest.raises(Closed, match="device"):
        d.create_buffer(16)


def test_dropped_device_is_closed_by_the_collector(monkeypatch) -> None:
    destroyed = []
    real = vulkan.vkDestroyDevice
    monkeypatch.setattr(vulkan, "vkDestroyDevice", lambda h, a: (destroyed.append(h), real(h, a)))
    d = Device()
    d.create_buffer(64)  # the buffer and the Device refer to each other (a cycle)
    h = d.handle
    del d
    gc.collect()
    assert destroyed == [h]


def test_cached_replays_are_closed_on_eviction(device, monkeypatch) -> None:
    from pootvk import runtime

    monkeypatch.setattr(runtime, "MAX_CACHED_REPLAYS", 1)
    q = np.ones((1, 1, 1, 4), np.float32)
    pootvk.attention(q, np.ones((1, 1, 3, 4)), np.ones((1, 1, 3, 4)), device=device)
    first = next(reversed(runtime._replays.values()))
    pootvk.attention(q, np.ones((1, 1, 5, 4)), np.ones((1, 1, 5, 4)), device=device)
    assert first.closed  # nobody held it: freed at eviction
