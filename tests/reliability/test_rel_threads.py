"""Item 1: one Device per physical device, and pootvk.attention from 4 threads x 200 calls
(same and different shapes, evictions forced by a cache of 2) all correct, under the
validation layer with zero messages (the autouse fixture)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import pootvk
from pootvk import runtime
from pootvk.errors import DeviceNotFound, InvalidDevice
from pootvk.runtime import resolve_device


def reference(q, k, v):
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


def test_one_device_per_physical_device(device) -> None:
    name = device.name.split()[0].lower()
    same = [resolve_device(x) for x in (None, 0, "0", " 0 ", np.int64(0), name)]
    assert all(d is device for d in same)


@pytest.mark.parametrize("bad", [1.5, True, object(), b"0", -1])
def test_bad_device_values_are_typed_errors(bad) -> None:
    q = np.ones((1, 1, 1, 4), np.float32)
    with pytest.raises((InvalidDevice, DeviceNotFound)):
        pootvk.attention(q, q, q, device=bad)


def test_threaded_stress_with_evictions(device, monkeypatch) -> None:
    monkeypatch.setattr(runtime, "MAX_CACHED_REPLAYS", 2)
    shapes = [(1, 2, 1, 7, 8), (1, 2, 1, 13, 8), (2, 1, 2, 5, 4)]  # B, H, Lq, Lk, D
    errors: list[BaseException] = []
    bad: list[str] = []
    start = threading.Barrier(4)

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        try:
            start.wait()
            for i in range(200):
                # threads 0 and 1 share shape 0 on even calls; all cycle through the rest
                b, h, lq, lk, d = shapes[0 if (t < 2 and i % 2 == 0) else (t + i) % 3]
                q = rng.standard_normal((b, h, lq, d), dtype=np.float32)
                k = rng.standard_normal((b, h, lk, d), dtype=np.float32)
                v = rng.standard_normal((b, h, lk, d), dtype=np.float32)
                out = pootvk.attention(q, k, v, device=device)
                if not np.allclose(out, reference(q, k, v), atol=2e-4, rtol=1e-3):
                    bad.append(f"thread {t} call {i}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    assert not bad, f"{len(bad)} wrong results: {bad[:5]}"
    assert len(runtime._replays) <= 2 and not runtime._retired and not runtime._holders
