"""Block-sparse attention on the device, end to end: the fused form (BlockTopK +
SelectedAttention) and the primitive form (the traced chains, compiled without the selection
pass) against the oracle and an independent float64 reference, over block sizes {16, 64},
K in {1, 4, 16} and Lk up to 32k, with tied block scores and rows whose own block is the only
one; and ``pootvk.attention``'s block-sparse arguments, their refusals and the device guard
on the positions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pootvk
from pootvk.errors import (
    BindError,
    DtypeLowering,
    GuardFailed,
    InvalidArgument,
    ShapeError,
    SlotRangeError,
)
from pootvk.ir import F16, F32, I32, check_graph
from pootvk.ir import prims as P
from pootvk.ops import Builder, attention_block_sparse
from pootvk.oracle import evaluate
from pootvk.passes import PASSES, compile_graph, selection
from pootvk.plan import forced_schedule, plan_graph
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan
from tests.helpers import assert_close, examples
from tests.sparse_ref import ref_attend, ref_select


def _graph(b, hq, hkv, lq, d, lk, bs, k, kv=F32, scores=True):
    bb = Builder()
    q = bb.input("q", (b, hq, lq, d))
    kk = bb.input("k", (b, hkv, lk, d), kv)
    vv = bb.input("v", (b, hkv, lk, d), kv)
    qp = bb.input("qpos", (b, lq), I32)
    sc = bb.input("scores", (b, hkv, lq, lk // bs)) if scores else None
    bb.export("out", attention_block_sparse(bb, q, kk, vv, qp, block_size=bs, top_k=k,
                                            block_scores=sc))
    return bb.build()


def _run(device, g, values, fused: bool):
    """The graph on the device: compiled as usual, or with every pass but the selection
    (the block-sparse chains stay primitive)."""
    if fused:
        c = compile_graph(g)
    else:
        c = g
        for p in PASSES:
            if p is not selection:
                c = p(c)
                check_graph(c)
    plan = plan_graph(c, device.profile)
    rp = Replay(device, plan, compile_plan(plan))
    try:
        return c, rp.step(values)["out"]
    finally:
        rp.close()


@pytest.mark.parametrize("lk", [512, 32768])
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("k", [1, 4, 16])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "primitive"])
def test_fused_and_primitive_match_the_oracle(device, lk, bs, k, fused):
    rng = np.random.default_rng(lk + 7 * bs + k)
    b, hq, hkv, d = 2, 4, 2, 32
    g = _graph(b, hq, hkv, 1, d, lk, bs, k)
    qpos = np.array([[bs // 2], [lk - 1 - int(rng.integers(0, bs))]], np.int32)  # row 0: own only
    x = {"q": rng.standard_normal((b, hq, 1, d), np.float32),
         "k": rng.standard_normal((b, hkv, lk, d), np.float32),
         "v": rng.standard_normal((b, hkv, lk, d), np.float32),
         "qpos": qpos,
         "scores": rng.integers(0, 3, (b, hkv, 1, lk // bs)).astype(np.float32)}  # ties
    c, got = _run(device, g, x, fused)
    assert (c.count(P.SELECTED_ATTENTION) == 1) == fused
    assert c.count(P.BLOCK_TOPK) == int(fused) and c.count(P.TOPK) == int(not fused)
    assert_close(got, evaluate(g, x)["out"])
    ids = ref_select(x["scores"], qpos, bs, min(k, lk // bs))
    assert_close(got, ref_attend(x["q"], x["k"], x["v"], ids, qpos, bs, d ** -0.5))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "primitive"])
def test_prefill_rows_indexer_and_f16(device, fused):
    """Lq = 3 rows at their own positions, blocks scored by the in-graph indexer, F16 K/V."""
    rng = np.random.default_rng(11)
    b, hq, hkv, lq, d, lk, bs, k = 1, 4, 2, 3, 16, 256, 16, 4
    g = _graph(b, hq, hkv, lq, d, lk, bs, k, kv=F16, scores=False)
    x = {"q": rng.standard_normal((b, hq, lq, d), np.float32),
         "k": rng.standard_normal((b, hkv, lk, d)).astype(np.float16),
         "v": rng.standard_normal((b, hkv, lk, d)).astype(np.float16),
         "qpos": np.array([[9, 130, 255]], np.int32)}
    c, got = _run(device, g, x, fused)
    assert c.count(P.SELECTED_ATTENTION) == int(fused)
    assert_close(got, evaluate(g, x)["out"])


def test_public_api_block_sparse(device):
    rng = np.random.default_rng(12)
    b, hq, hkv, lk, d, bs = 2, 8, 2, 1024, 32, 64
    q = rng.standard_normal((b, hq, 1, d), np.float32)
    k = rng.standard_normal((b, hkv, lk, d), np.float32)
    v = rng.standard_normal((b, hkv, lk, d), np.float32)
    sc = rng.standard_normal((b, 1, 1, lk // bs)).astype(np.float32)  # one per batch row
    lengths = np.array([700, 1024])
    got = pootvk.attention(q, k, v, block_size=bs, top_k=4, block_scores=sc,
                           lengths=lengths, device=device)
    pos = (lengths - 1)[:, None].astype(np.int32)  # the default: the last Lq of each length
    want = ref_attend(q, k, v, ref_select(sc, pos, bs, 4), pos, bs, d ** -0.5)
    assert_close(got, want)
    # top_k over every block: the causal attention over each row's prefix
    full = pootvk.attention(q, k, v, block_size=bs, top_k=64, positions=pos, device=device)
    dense = pootvk.attention(q, k, v, lengths=lengths, device=device)
    assert_close(full, dense.astype(np.float64), 1e-10)


def test_public_api_refusals(device):
    q = np.zeros((1, 2, 1, 8), np.float32)
    k = np.zeros((1, 1, 64, 8), np.float32)
    with pytest.raises(InvalidArgument, match="block_size"):
        pootvk.attention(q, k, k, block_size=48, top_k=1, device=device)
    with pytest.raises(InvalidArgument, match="top_k"):
        pootvk.attention(q, k, k, block_size=16, device=device)
    with pytest.raises(InvalidArgument, match="lengths"):
        pootvk.attention(q, k, k, block_size=16, top_k=1, positions=np.array([[3]]),
                         lengths=np.array([4]), device=device)
    with pytest.raises(InvalidArgument, match="mask"):
        pootvk.attention(q, k, k, mask=np.zeros((1, 1, 1, 64), np.float32), block_size=16,
                         top_k=1, device=device)
    with pytest.raises(ShapeError, match="shared key width"):
        pootvk.attention(q, k, k, k_shared=np.zeros((1, 1, 64, 3), np.float32),
                         block_size=16, top_k=1, device=device)
    with pytest.raises(BindError, match="block_scores"):
        pootvk.attention(q, k, k, block_size=16, top_k=1, device=device,
                         block_scores=np.zeros((1, 2, 1, 3), np.float32))
    with pytest.raises(InvalidArgument, match="block_scores"):
        pootvk.attention(q, k, k, block_scores=np.zeros((1, 1, 1, 4), np.float32),
                         device=device)
    with pytest.raises(SlotRangeError) as e:  # refused at bind: nothing runs
        pootvk.attention(q, k, k, block_size=16, top_k=1, positions=np.array([[64]]),
                         device=device)
    assert (e.value.slot, e.value.value, e.value.hi) == ("positions", 64, 63)


def test_guard_on_positions_fails_the_step(device):
    """Positions from the graph (no declared range) are guarded on the device: one outside
    [0, Lk - 1] fails the step through the validation channel and publishes nothing."""
    rng = np.random.default_rng(13)
    g = _graph(1, 2, 1, 1, 8, 128, 16, 2)
    x = {"q": rng.standard_normal((1, 2, 1, 8), np.float32),
         "k": rng.standard_normal((1, 1, 128, 8), np.float32),
         "v": rng.standard_normal((1, 1, 128, 8), np.float32),
         "qpos": np.array([[128]], np.int32),
         "scores": rng.standard_normal((1, 1, 1, 8)).astype(np.float32)}
    with pytest.raises(GuardFailed) as e:
        _run(device, g, x, True)
    assert "qpos" in str(e.value)


SPARSE_SCHEDULES = {
    "planner": {},
    "streaming": {"schedule": "streaming"},
    "grouped": {"schedule": "grouped"},
    "split3": {"schedule": "grouped", "splits": 3},
    "split3_two_launches": {"schedule": "grouped", "splits": 3, "fused_combine": False},
    "shared_reduce": {"schedule": "grouped", "subgroup": False},
}


def forced_attention(schedule: str, kv: str, *args, **kw):
    """``pootvk.attention(*args, **kw)`` under ``SPARSE_SCHEDULES[schedule]``; None where
    that schedule refuses 16-bit K/V (the streaming kernel is F32 only: DtypeLowering,
    checked here)."""
    with forced_schedule(**SPARSE_SCHEDULES[schedule]):
        if kv != "f32" and schedule == "streaming":
            with pytest.raises(DtypeLowering):
                pootvk.attention(*args, **kw)
            return None
        return pootvk.attention(*args, **kw)


@settings(max_examples=examples(30), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 2), n_rep=st.sampled_from([1, 3, 4]), hkv=st.integers(1, 2),
    lq=st.sampled_from([1, 2]), bs=st.sampled_from([16, 32, 64]), blocks=st.integers(1, 12),
    top_k=st.integers(1, 6), d=st.sampled_from([16, 40, 64]), dv=st.sampled_from([16, 24, 64]),
    per_head=st.booleans(), softcap=st.sampled_from([None, 6.0]),
    kv=st.sampled_from(["f32", "f16", "bf16"]), schedule=st.sampled_from(sorted(SPARSE_SCHEDULES)),
    seed=st.integers(0, 2**16),
)
def test_public_block_sparse_sweep(device, b, n_rep, hkv, lq, bs, blocks, top_k, d, dv,
                                   per_head, softcap, kv, schedule, seed):
    """``pootvk.attention(block_size=, top_k=)`` against the float64 reference over shapes,
    widths (not multiples of 4 too), GQA, per-group or shared scores, softcap, K/V dtypes and
    every SelectedAttention schedule (forced, so lavapipe runs each)."""
    rng = np.random.default_rng(seed)
    hq, lk = hkv * n_rep, blocks * bs
    q = rng.standard_normal((b, hq, lq, d), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32)
    if kv != "f32":
        dt = np.float16 if kv == "f16" else ml_dtypes.bfloat16
        k, v = k.astype(dt), v.astype(dt)
    sc = rng.integers(0, 4, (b, hkv if per_head else 1, lq, blocks)).astype(np.float32)
    pos = rng.integers(0, lk, (b, lq)).astype(np.int32)
    ids = ref_select(sc, pos, bs, min(top_k, blocks))
    ref = ref_attend(q, k.astype(np.float32), v.astype(np.float32), ids, pos, bs,
                     d ** -0.5, softcap)
    got = forced_attention(schedule, kv, q, k, v, block_size=bs, top_k=top_k,
                           block_scores=sc, positions=pos, softcap=softcap, device=device)
    if got is not None:
        assert_close(got, ref)


@pytest.mark.parametrize("schedule", sorted(SPARSE_SCHEDULES))
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_split_key_block_sparse(device, schedule, kv):
    """Latent attention (a split key: k's own channels + k_shared, one row per key for
    every head) made block-sparse: fused into SelectedAttention with its k_shared operand,
    against the float64 reference over the concatenated key, on every schedule."""
    rng = np.random.default_rng(21)
    b, hq, hkv, dn, s, dv, lk, bs, top = 2, 8, 1, 32, 16, 24, 512, 32, 3
    q = rng.standard_normal((b, hq, 1, dn + s), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, dn), dtype=np.float32)
    ks = rng.standard_normal((b, 1, lk, s), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32)
    if kv == "f16":
        k, ks, v = k.astype(np.float16), ks.astype(np.float16), v.astype(np.float16)
    sc = rng.standard_normal((b, 1, 1, lk // bs)).astype(np.float32)
    pos = np.array([[lk - 1], [40]], np.int32)
    whole = np.concatenate([k.astype(np.float32), np.broadcast_to(
        ks.astype(np.float32), (b, hkv, lk, s))], axis=-1)
    ref = ref_attend(q, whole, v.astype(np.float32), ref_select(sc, pos, bs, top), pos, bs,
                     (dn + s) ** -0.5)
    kw = dict(block_size=bs, top_k=top, block_scores=sc, positions=pos, device=device)
    got = forced_attention(schedule, kv, q, k, v, k_shared=ks, **kw)
    if got is None:
        return
    assert_close(got, ref)
    # a NaN in a key no row visits (an unselected block's shared part) changes nothing
    ks2 = ks.copy()
    picked = set(ref_select(sc, pos, bs, top).ravel().tolist()) | {int(p) // bs for p in pos[:, 0]}
    free = next(j for j in range(lk // bs) if j not in picked)
    ks2[:, :, free * bs] = np.nan
    np.testing.assert_array_equal(forced_attention(schedule, kv, q, k, v, k_shared=ks2, **kw),
                                  got)


@pytest.mark.parametrize(("shape", "bs", "top", "splits"), [
    ((1, 32, 1, 64, 0, 64, 4096), 64, 4, None),  # b, hq, hkv, dk, s, dv, lk
    ((2, 16, 2, 128, 0, 64, 2048), 16, 16, 3),
    ((1, 128, 1, 576, 64, 512, 8192), 64, 16, None),  # DeepSeek's MLA decode shape
    ((1, 24, 1, 96, 32, 64, 1024), 32, 1, 1),
], ids=str)
def test_tensor_core_selected_kernel(device, shape, bs, top, splits):
    """The staged cooperative-matrix kernel in its selected mode (tile rows read through
    the block table), forced, against the float64 reference; skipped where the device
    lists no 16x16x16 f16 cooperative matrix (lavapipe)."""
    from pootvk.plan.decode_schedule import DecodeProblem, matrix_supported

    b, hq, hkv, dk, s, dv, lk = shape
    probe = DecodeProblem(b=1, hq=4, hkv=1, lq=1, lk=128, dk=64, dv=64, scale=0.1,
                          kv_dtype="f16")
    if not matrix_supported(probe, device.profile, device.profile.subgroup_shuffle):
        pytest.skip(f"{device.name} lists no 16x16x16 f16 cooperative matrix")
    rng = np.random.default_rng(lk + bs)
    q = rng.standard_normal((b, hq, 1, dk), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, dk - s)).astype(np.float16)
    ks = rng.standard_normal((b, 1, lk, s)).astype(np.float16) if s else None
    v = rng.standard_normal((b, hkv, lk, dv)).astype(np.float16)
    sc = rng.standard_normal((b, hkv, 1, lk // bs)).astype(np.float32)
    pos = np.array([[lk - 1 - int(rng.integers(0, bs))] for _ in range(b)], np.int32)
    pos[0, 0] = min(pos[0, 0], bs * (top // 2) + 3)  # fewer complete blocks than top_k
    whole = k.astype(np.float32) if ks is None else np.concatenate(
        [k.astype(np.float32), np.broadcast_to(ks.astype(np.float32), (b, hkv, lk, s))], -1)
    ref = ref_attend(q, whole, v.astype(np.float32), ref_select(sc, pos, bs, top), pos, bs,
                     dk ** -0.5)
    with forced_schedule(schedule="grouped", splits=splits, matrix=16):
        got = pootvk.attention(q, k, v, k_shared=ks, block_size=bs, top_k=top,
                               block_scores=sc, positions=pos, device=device)
    assert_close(got, ref)
