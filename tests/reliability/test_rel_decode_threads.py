"""Item 1: one DecodeLoop shared by 4 threads x 50 steps: every position 0..199 is written
exactly once (read back from the KV cache) and every output is the float64 reference over
the cache as it stood at that step."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pootvk.errors import CapacityExceeded
from pootvk.llm import DecodeLoop
from tests.helpers import reference_attention

THREADS, STEPS = 4, 50
B, HQ, HKV, D = 1, 2, 1, 16
CAP = THREADS * STEPS


def test_shared_decode_loop_writes_each_position_once(device) -> None:
    loop = DecodeLoop(B, HQ, HKV, D, CAP, device=device)
    done: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker(t: int) -> None:
        rng = np.random.default_rng(1000 + t)
        try:
            start.wait()
            for i in range(STEPS):
                q = rng.standard_normal((B, HQ, 1, D), dtype=np.float32)
                k = rng.standard_normal((B, HKV, 1, D), dtype=np.float32)
                v = rng.standard_normal((B, HKV, 1, D), dtype=np.float32)
                done[t, i] = (q, k, v, loop.step(q, k, v))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with loop:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        assert loop.position == CAP
        kc, vc = loop.k_cache, loop.v_cache
        with pytest.raises(CapacityExceeded):
            loop.step(*done[0, 0][:3])

    # Which step wrote each position: k_new rows are random, so they identify their step.
    writer = {done[key][1].tobytes(): key for key in done}
    assert len(writer) == CAP
    at = [writer.get(kc[:, :, p : p + 1].tobytes()) for p in range(CAP)]
    assert None not in at, f"positions not written by any step: {at.index(None)}"
    assert sorted(at) == sorted(done)  # every step wrote exactly one position, none twice
    bad = []
    for p, key in enumerate(at):
        q, _, v, out = done[key]
        np.testing.assert_array_equal(vc[:, :, p : p + 1], v)
        # Steps are serialised: at position p the cache held exactly positions 0..p.
        ref = reference_attention(q, kc[:, :, : p + 1], vc[:, :, : p + 1])
        if not np.allclose(out, ref, atol=2e-5, rtol=1e-4):
            bad.append((p, key, float(np.abs(out - ref).max())))
    assert not bad, bad[:5]
    # Each thread's own steps took increasing positions.
    for t in range(THREADS):
        mine = [p for p, key in enumerate(at) if key[0] == t]
        assert mine == sorted(mine, key=lambda p: at[p][1])
