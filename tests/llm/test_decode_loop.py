import numpy as np
import pytest

from pootvk.errors import BindError, CapacityExceeded
from pootvk.ir import prims as P
from pootvk.llm import DecodeLoop
from tests.helpers import assert_close, reference_decode_step


def test_256_steps_one_recording_every_step_matches_the_reference(device):
    b, hq, hkv, d, cap = 2, 8, 2, 64, 256
    rng = np.random.default_rng(0)
    kc = np.zeros((b, hkv, cap, d), np.float32)
    vc = np.zeros_like(kc)
    with DecodeLoop(b, hq, hkv, d, cap, device=device) as loop:
        assert loop.plan.graph.count(P.ATTENTION) == 1
        worst = 0.0
        for i in range(cap):
            q = rng.standard_normal((b, hq, 1, d), dtype=np.float32)
            kn = rng.standard_normal((b, hkv, 1, d), dtype=np.float32)
            vn = rng.standard_normal((b, hkv, 1, d), dtype=np.float32)
            out = loop.step(q, kn, vn)
            ref = reference_decode_step({"q": q, "k_new": kn, "v_new": vn, "k_cache": kc,
                                         "v_cache": vc, "pos": np.int32(i)})
            kc, vc = ref["k_cache"], ref["v_cache"]
            worst = max(worst, assert_close(out, ref["out"]))
        assert loop.recordings == 1 and loop.position == cap
        np.testing.assert_array_equal(loop.k_cache, kc)
        np.testing.assert_array_equal(loop.v_cache, vc)
        assert worst < 1e-9  # f32 rounding only: far inside the tolerance


def test_capacity_and_bad_shapes_are_refused_without_touching_state(device):
    rng = np.random.default_rng(1)
    with DecodeLoop(1, 4, 2, 8, 3, device=device, softcap=10.0) as loop:
        def args():
            return (rng.standard_normal((1, 4, 8), dtype=np.float32),  # [B,H,D] is accepted
                    rng.standard_normal((1, 2, 1, 8), dtype=np.float32),
                    rng.standard_normal((1, 2, 1, 8), dtype=np.float32))

        for _ in range(3):
            loop.step(*args())
        k = loop.k_cache
        with pytest.raises(CapacityExceeded) as e:
            loop.step(*args())
        assert (e.value.position, e.value.capacity) == (3, 3)
        np.testing.assert_array_equal(loop.k_cache, k)
        loop.reset()
        assert loop.position == 0 and not loop.k_cache.any()
        q, kn, vn = args()
        with pytest.raises(BindError):
            loop.step(q, kn[:, :1], vn)
        with pytest.raises(BindError):
            loop.step(q, kn, vn.astype(np.int64))
        assert loop.position == 0 and not loop.k_cache.any()
        loop.step(q, kn, vn)
        assert loop.position == 1 and loop.recordings == 1


def test_value_width_and_timestamps(device):
    rng = np.random.default_rng(2)
    with DecodeLoop(1, 4, 4, 16, 8, device=device, value_dim=24, timestamps=True) as loop:
        out = loop.step(rng.standard_normal((1, 4, 1, 16), dtype=np.float32),
                        rng.standard_normal((1, 4, 1, 16), dtype=np.float32),
                        rng.standard_normal((1, 4, 1, 24), dtype=np.float32))
        assert out.shape == (1, 4, 1, 24)
        assert loop.gpu_time_ns() > 0


def test_seek_continues_over_given_caches(device):
    """seek(position, caches): the next step writes there and attends over the position + 1
    keys of the given caches (the live form reads nothing past them); bad positions refused."""
    from pootvk.errors import InvalidArgument

    b, hq, hkv, d, cap = 1, 4, 2, 16, 64
    rng = np.random.default_rng(3)
    kc = rng.standard_normal((b, hkv, cap, d), dtype=np.float32)
    vc = rng.standard_normal((b, hkv, cap, d), dtype=np.float32)
    with DecodeLoop(b, hq, hkv, d, cap, device=device) as loop:
        loop.seek(40, kc, vc)
        q = rng.standard_normal((b, hq, 1, d), dtype=np.float32)
        kn = rng.standard_normal((b, hkv, 1, d), dtype=np.float32)
        vn = rng.standard_normal((b, hkv, 1, d), dtype=np.float32)
        out = loop.step(q, kn, vn)
        ref = reference_decode_step({"q": q, "k_new": kn, "v_new": vn, "k_cache": kc,
                                     "v_cache": vc, "pos": np.int32(40)})
        assert_close(out, ref["out"])
        assert loop.position == 41
        np.testing.assert_array_equal(loop.k_cache, ref["k_cache"])
        with pytest.raises(InvalidArgument):
            loop.seek(-1)
        with pytest.raises(CapacityExceeded):
            loop.seek(cap + 1)
        assert loop.position == 41
