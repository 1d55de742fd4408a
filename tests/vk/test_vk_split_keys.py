"""Split-key (latent) attention on the live device: ``pootvk.attention(..., k_shared=)``
against the independent float64 reference over the whole key concat(k, broadcast(k_shared)),
every schedule, F32 and F16 K/V; and the typed refusals naming the widths."""

import ml_dtypes
import numpy as np
import pytest

import pootvk
from pootvk.errors import BindError, DtypeLowering, ShapeError
from pootvk.plan import forced_schedule
from tests.helpers import assert_close, reference_attention
from tests.vk.test_vk_attention import SCHEDULES


def whole_key(k: np.ndarray, k_shared: np.ndarray) -> np.ndarray:
    """The key a split key stands for, built here in float64 (never by pootvk)."""
    b, hkv, lk, _ = k.shape
    shared = np.broadcast_to(k_shared.astype(np.float64), (b, hkv, lk, k_shared.shape[3]))
    return np.concatenate([k.astype(np.float64), shared], axis=3)


def split_inputs(rng, b, hq, hkv, lk, dk, s, dv, dt):
    q = rng.standard_normal((b, hq, 1, dk), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, dk - s), dtype=np.float32).astype(dt)
    ks = rng.standard_normal((b, 1, lk, s), dtype=np.float32).astype(dt)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32).astype(dt)
    return q, k, ks, v


#: The small MLA-like variant that fits lavapipe: Hkv=1, Dk=96 = 64 + s 32, Dv=64.
SMALL = (1, 8, 1, 300, 96, 32, 64)


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_split_key_matches_the_reference_on_every_schedule(device, schedule, kv):
    dt = np.float32 if kv == "f32" else np.float16
    q, k, ks, v = split_inputs(np.random.default_rng(7), *SMALL, dt)
    ref = reference_attention(q, whole_key(k, ks), v.astype(np.float64))
    with forced_schedule(**SCHEDULES[schedule]):
        if kv != "f32" and schedule == "streaming":
            with pytest.raises(DtypeLowering):  # the streaming kernel is F32 only
                pootvk.attention(q, k, v, k_shared=ks, device=device)
            return
        got = pootvk.attention(q, k, v, k_shared=ks, device=device)
    assert got.dtype == np.float32 and got.shape == (1, 8, 1, 64)
    assert_close(got, ref)


@pytest.mark.parametrize(
    ("shape", "kv", "schedule"),
    [
        # GQA (two KV heads share one k_shared), a batch of 2, mask, softcap, Lq > 1
        ((2, 8, 2, 129, 48, 16, 40), "bf16", "grouped"),
        ((2, 8, 2, 129, 48, 16, 40), "f32", "streaming"),
        # widths that are not multiples of 4: the scalar paths
        ((1, 4, 1, 50, 14, 6, 10), "f32", "streaming"),
        ((1, 4, 1, 50, 14, 6, 10), "f32", "grouped"),
    ],
)
def test_split_key_with_gqa_mask_softcap_and_odd_widths(device, shape, kv, schedule):
    b, hq, hkv, lk, dk, s, dv = shape
    dt = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}[kv]
    rng = np.random.default_rng(11)
    q, k, ks, v = split_inputs(rng, b, hq, hkv, lk, dk, s, dv, dt)
    q = np.concatenate([q, q[:, :, :, ::-1]], axis=2)  # Lq = 2
    m = np.where(np.arange(lk)[None, :] <= np.arange(2)[:, None] + lk - 40, 0.0, -np.inf)
    m = np.broadcast_to(m, (b, 1, 2, lk)).astype(np.float32)
    ref = reference_attention(q, whole_key(k.astype(np.float32), ks.astype(np.float32)),
                              v.astype(np.float64), m, softcap=5.0)
    with forced_schedule(schedule):
        got = pootvk.attention(q, k, v, mask=m, softcap=5.0, k_shared=ks, device=device)
    assert_close(got, ref)


def test_split_key_refusals_name_the_widths(device):
    q = np.zeros((1, 4, 1, 12), np.float32)
    k = np.zeros((1, 1, 5, 8), np.float32)
    v = np.zeros((1, 1, 5, 6), np.float32)
    ks = np.zeros((1, 1, 5, 4), np.float32)
    with pytest.raises(ShapeError, match=r"key width 8 \+ shared key width 3 = 11 != query "
                                         r"width 12"):
        pootvk.attention(q, k, v, k_shared=ks[..., :3], device=device)
    with pytest.raises(ShapeError, match=r"k_shared \(1, 2, 5, 4\) is not \[B=1, 1, Lk=5"):
        pootvk.attention(q, k, v, k_shared=np.zeros((1, 2, 5, 4), np.float32), device=device)
    with pytest.raises(ShapeError, match=r"k_shared \(1, 1, 6, 4\)"):
        pootvk.attention(q, k, v, k_shared=np.zeros((1, 1, 6, 4), np.float32), device=device)
    with pytest.raises(ShapeError, match="key width 8 != query width 12"):
        pootvk.attention(q, k, v, device=device)  # the split key's part alone
    with pytest.raises(BindError, match="k_shared"):
        pootvk.attention(q, k, v, k_shared=ks.astype(np.float16), device=device)
    with pytest.raises(BindError, match="rank 4"):
        pootvk.attention(q, k, v, k_shared=ks[0], device=device)


@pytest.mark.parametrize("schedule", ["streaming", "grouped", "split7"])
def test_split_key_with_a_live_length(device, schedule):
    """lengths= and k_shared= together: keys t >= lengths[b] are never read, even NaN ones
    in k_shared (the split part) or k."""
    b, hq, hkv, lk, dk, s, dv = 2, 8, 2, 300, 48, 16, 40
    q, k, ks, v = split_inputs(np.random.default_rng(5), b, hq, hkv, lk, dk, s, dv, np.float32)
    lengths = np.array([129, 300])
    ks[0, 0, 200] = np.nan  # past row 0's live length
    k[0, 1, 250] = np.nan
    m = np.zeros((b, 1, 1, lk), np.float32)
    m[0, ..., 129:] = -np.inf  # the reference sees only the live keys
    ref = reference_attention(q, whole_key(np.nan_to_num(k), np.nan_to_num(ks)),
                              v.astype(np.float64), m)
    with forced_schedule(**SCHEDULES[schedule]):
        got = pootvk.attention(q, k, v, k_shared=ks, lengths=lengths, device=device)
    assert np.isfinite(got).all()
    assert_close(got, ref)
