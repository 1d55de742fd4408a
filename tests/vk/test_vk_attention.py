"""pootvk.attention on the live Vulkan device against the independent float64 reference."""

import contextlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pootvk
from pootvk.errors import BindError, DtypeLowering, ShapeError
from pootvk.plan import forced_schedule
from tests.helpers import assert_close, examples, reference_attention


def check(got, ref):
    assert got.dtype == np.float32
    return assert_close(got, ref)


#: Every schedule the planner can pick, forced (so lavapipe runs each): the streaming
#: fallback, the grouped kernel with the planner's split count, forced split counts (chunks
#: partial or empty), and the grouped kernel reducing through workgroup memory.
SCHEDULES = {
    "streaming": {"schedule": "streaming"},
    "grouped": {"schedule": "grouped"},
    "split2": {"schedule": "grouped", "splits": 2},
    "split7": {"schedule": "grouped", "splits": 7},
    "split16": {"schedule": "grouped", "splits": 16},
    "split7_two_launches": {"schedule": "grouped", "splits": 7, "fused_combine": False},
    # the splits take the tiles in turn (DecodeRequest.interleave), fused and not
    "split7_interleaved": {"schedule": "grouped", "splits": 7, "interleave": True},
    "split7_two_launches_interleaved": {"schedule": "grouped", "splits": 7,
                                        "fused_combine": False, "interleave": True},
    # the F32 variant a GPU picks at one workgroup a compute unit: tiles in turn, lazy
    "split7_interleaved_lazy": {"schedule": "grouped", "splits": 7, "interleave": True,
                                "lazy_rescale": True},
    "shared_reduce": {"schedule": "grouped", "subgroup": False},
    # the short-16-bit variant the H200 picks: dots reduce-scattered across a key's lanes,
    # accumulators rescaled only when a row's running max moves
    "scatter_lazy": {"schedule": "grouped", "splits": 2, "dot_reduce": "scatter",
                     "lazy_rescale": True},
    # the long-16-bit-chunk variant the H200 picks: the query rows in workgroup memory,
    # 4 keys a step
    "query_workgroup": {"schedule": "grouped", "splits": 7, "q_workgroup": True,
                        "keys_per_iter": 4},
}


@settings(max_examples=examples(45), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 3), n_rep=st.sampled_from([1, 4, 8, 12]), hkv=st.integers(1, 2),
    lq=st.sampled_from([1, 3, 7]), lk=st.sampled_from([1, 113, 128, 129, 1000, 4096]),
    dk=st.sampled_from([40, 64, 72, 128, 256]), dv=st.sampled_from([40, 64, 72, 128, 256]),
    mask=st.sampled_from([None, "shared", "alibi"]), softcap=st.sampled_from([None, 8.0]),
    schedule=st.sampled_from(sorted(SCHEDULES)), kv=st.sampled_from(["f32", "f16", "bf16"]),
    seed=st.integers(0, 2**16),
)
def test_attention_matches_the_reference(device, b, n_rep, hkv, lq, lk, dk, dv, mask, softcap,
                                         schedule, kv, seed):
    rng = np.random.default_rng(seed)
    hq = hkv * n_rep
    q = rng.standard_normal((b, hq, lq, dk), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, dk), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32)
    m = None
    if mask == "shared":  # causal-style additive mask, one for every head
        m = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq, 0.0, -np.inf)
        m = np.broadcast_to(m, (b, 1, lq, lk)).astype(np.float32)
    elif mask == "alibi":  # per-head linear bias
        slopes = 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)
        m = (slopes[:, None, None] * (np.arange(lk) - lk + 1)[None, None, :])
        m = np.broadcast_to(m[None], (1, hq, lq, lk)).astype(np.float32)
    if kv != "f32":  # stored 16-bit; the reference computes on the rounded values
        dt = np.float16 if kv == "f16" else ml_dtypes.bfloat16
        k, v = k.astype(dt), v.astype(dt)
    ref = reference_attention(q, k.astype(np.float32), v.astype(np.float32), m, softcap=softcap)
    with forced_schedule(**SCHEDULES[schedule]):
        if kv != "f32" and schedule == "streaming":
            with pytest.raises(DtypeLowering):  # the streaming kernel is F32 only
                pootvk.attention(q, k, v, mask=m, softcap=softcap, device=device)
            return
        got = pootvk.attention(q, k, v, mask=m, softcap=softcap, device=device)
    check(got, ref)


@pytest.mark.parametrize(
    ("qs", "ks", "vs"),
    [
        ((1, 4, 3, 6), (1, 2, 17, 6), (1, 2, 17, 10)),  # widths not multiples of 4: scalar path
        ((2, 1, 1, 576), (2, 1, 33, 576), (2, 1, 33, 512)),  # MLA-like wide head, dv < dk
        ((1, 2, 2, 8), (1, 2, 300, 8), (1, 2, 300, 8)),
    ],
)
def test_odd_shapes_and_explicit_scale(device, qs, ks, vs):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s, dtype=np.float32) for s in (qs, ks, vs))
    got = pootvk.attention(q, k, v, scale=0.3, device=device)
    check(got, reference_attention(q, k, v, scale=0.3))


def test_minus_inf_adds_zero_weight_and_empty_rows_are_nan(device):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 3, 8), dtype=np.float32)
    k = rng.standard_normal((1, 2, 130, 8), dtype=np.float32)
    v = rng.standard_normal((1, 2, 130, 8), dtype=np.float32)
    m = np.zeros((1, 2, 3, 130), np.float32)
    m[..., 0, 5:] = -np.inf  # row 0 sees 5 keys
    m[..., 1, :] = -np.inf  # row 1 sees nothing: 0/0
    m[0, 1, 2, ::2] = -np.inf
    got = pootvk.attention(q, k, v, mask=m, device=device)
    check(got, reference_attention(q, k, v, m))
    assert np.isnan(got[:, :, 1]).all() and np.isfinite(got[:, :, 0]).all()


def test_repeated_calls_reuse_one_replay(device, monkeypatch):
    """A repeated call with the same shapes is a cache lookup: the same Replay object, and
    no tracing, no shader compile (not even a cache hit) and no new recording."""
    from pootvk import api
    from pootvk.runtime import replay as replay_mod
    from pootvk.shaders import compiler

    got, traces, recordings = [], [], []

    @contextlib.contextmanager
    def spy_held_replay(key, trace, dev):
        def counted_trace():
            traces.append(key)
            return trace()

        with held_replay(key, counted_trace, dev) as rp:
            got.append(rp)
            yield rp

    def spy_record(self, *a, **kw):
        recordings.append(self)
        return record(self, *a, **kw)

    held_replay, record = api.held_replay, replay_mod.Recorder.record
    monkeypatch.setattr(api, "held_replay", spy_held_replay)
    monkeypatch.setattr(replay_mod.Recorder, "record", spy_record)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 1, 16), dtype=np.float32)
    k = rng.standard_normal((1, 4, 50, 16), dtype=np.float32)
    first = pootvk.attention(q, k, k, device=device)
    assert len(got) == 1 and len(traces) == len(recordings) <= 1  # built at most once
    compiles = compiler.glslang_calls, compiler.compile_requests
    del traces[:], recordings[:]
    for _ in range(3):
        q2 = rng.standard_normal(q.shape, dtype=np.float32)  # new values, same shapes
        out = pootvk.attention(q2, k, k, device=device)
        check(out, reference_attention(q2, k, k))
    assert len(got) == 4 and all(rp is got[0] for rp in got), "a new Replay was built"
    assert traces == [] and recordings == []
    assert (compiler.glslang_calls, compiler.compile_requests) == compiles
    assert got[0].recordings == 1
    np.testing.assert_array_equal(pootvk.attention(q, k, k, device=device), first)


def test_bad_input_is_a_typed_error(device):
    q = np.zeros((1, 4, 1, 8), np.float32)
    k = np.zeros((1, 2, 5, 8), np.float32)
    with pytest.raises(BindError, match="dtype"):
        pootvk.attention(q.astype(np.int32), k, k, device=device)
    with pytest.raises(BindError, match="rank 4"):
        pootvk.attention(q[0], k, k, device=device)
    with pytest.raises(ShapeError, match="multiple"):
        pootvk.attention(np.zeros((1, 3, 1, 8), np.float32), k, k, device=device)
    with pytest.raises(ShapeError, match="key width"):
        pootvk.attention(q, np.zeros((1, 2, 5, 4), np.float32), k, device=device)
    with pytest.raises(ShapeError, match="mask"):
        pootvk.attention(q, k, k, mask=np.zeros((1, 3, 1, 5), np.float32), device=device)
    with pytest.raises(ShapeError, match="mask"):
        pootvk.attention(q, k, k, mask=np.zeros((1, 1, 1, 6), np.float32), device=device)
