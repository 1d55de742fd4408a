"""The live length (issue 8): ``ops.attention_live`` fused and primitive, every schedule, on the
device against the float64 reference; NaN in inactive K/V rows never reaches an output; a
length outside 1..=Lk fails through the validation channel and publishes nothing (the
outputs are not returned and the KV state is unchanged)."""

from __future__ import annotations

import numpy as np
import pytest

import pootvk
from pootvk.errors import DtypeLowering, GuardFailed
from pootvk.ir import F16, F32, I32
from pootvk.ir import prims as P
from pootvk.llm import DecodeLoop
from pootvk.ops import Builder, attention_live
from pootvk.oracle import evaluate
from pootvk.passes import canonicalize, compile_graph
from pootvk.plan import FusedRequest, forced_schedule, plan_graph
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan
from tests.helpers import assert_close, planned_requests, reference_attention
from tests.vk.test_vk_attention import SCHEDULES

HQ, HKV, LK, D = 8, 2, 300, 64
#: one batch row per length the issue names: 1, 2, around a 128-key tile, and all of Lk
LENGTHS = np.array([1, 2, 127, 128, 129, LK])


def _inputs(kv: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    b = len(LENGTHS)
    q = rng.standard_normal((b, HQ, 1, D), dtype=np.float32)
    k = rng.standard_normal((b, HKV, LK, D), dtype=np.float32)
    v = rng.standard_normal((b, HKV, LK, D), dtype=np.float32)
    if kv == "f16":
        k, v = k.astype(np.float16), v.astype(np.float16)
    return q, k, v


def _reference(q, k, v) -> np.ndarray:
    mask = np.where(np.arange(LK)[None, :] < LENGTHS[:, None], 0.0, -np.inf)
    return reference_attention(q, k.astype(np.float32), v.astype(np.float32),
                               mask[:, None, None, :])


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_live_and_capacity_forms_match_the_reference(device, schedule, kv):
    """Lengths {1, 2, 127, 128, 129, Lk}; the live form with NaN planted in every inactive
    K/V row, the capacity form (an additive mask over every slot) on clean rows."""
    q, k, v = _inputs(kv)
    ref = _reference(q, k, v)
    poisoned_k, poisoned_v = k.copy(), v.copy()
    for b, n in enumerate(LENGTHS):
        poisoned_k[b, :, n:] = np.nan
        poisoned_v[b, :, n:] = np.nan
    mask = np.where(np.arange(LK)[None, :] < LENGTHS[:, None], 0.0, -np.inf)
    mask = mask[:, None, None, :].astype(np.float32)
    with forced_schedule(**SCHEDULES[schedule]):
        if kv == "f16" and schedule == "streaming":
            with pytest.raises(DtypeLowering):  # the streaming kernel is F32 only
                pootvk.attention(q, poisoned_k, poisoned_v, lengths=LENGTHS, device=device)
            return
        live = pootvk.attention(q, poisoned_k, poisoned_v, lengths=LENGTHS, device=device)
        capacity = pootvk.attention(q, k, v, mask=mask, device=device)
    assert np.isfinite(live).all()
    assert_close(live, ref)
    assert_close(capacity, ref)


@pytest.mark.parametrize("bad", [0, LK + 1, -7])
def test_a_bad_length_fails_and_returns_nothing(device, bad):
    q, k, v = _inputs("f32")
    lengths = LENGTHS.copy()
    lengths[2] = bad
    with pytest.raises(GuardFailed) as e:
        pootvk.attention(q, k, v, lengths=lengths, device=device)
    assert (e.value.guard, e.value.value, e.value.count) == ("lengths", bad, 1)
    assert (e.value.lo, e.value.hi) == (1, LK)
    assert_close(pootvk.attention(q, k, v, lengths=LENGTHS, device=device),
                 _reference(q, k, v))  # the next good call is unaffected


# --- a decode step whose lengths the graph cannot prove: guarded, state gated -------------


def _guarded_step(b=2, cap=160, kv=F32):
    """KV caches written at ``pos``, then attention over per-row ``lengths`` (an unranged
    input): the guard stays, and the cache writes are gated on its witness."""
    bb = Builder()
    q = bb.input("q", (b, HQ, 1, D))
    kn = bb.input("k_new", (b, HKV, 1, D), kv)
    vn = bb.input("v_new", (b, HKV, 1, D), kv)
    kc = bb.state("k_cache", (b, HKV, cap, D), kv)
    vc = bb.state("v_cache", (b, HKV, cap, D), kv)
    pos = bb.pos("pos", 0, cap - 1)
    lengths = bb.input("lengths", (b,), I32)
    kc2 = bb.dynamic_update_slice(kc, kn, (0, 0, pos, 0))
    vc2 = bb.dynamic_update_slice(vc, vn, (0, 0, pos, 0))
    bb.export("out", attention_live(bb, q, kc2, vc2, lengths))
    bb.set_state("k_cache", kc2)
    bb.set_state("v_cache", vc2)
    return bb.build()


@pytest.mark.parametrize("kv", [F32, F16])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "primitive"])
def test_a_failed_guard_leaves_the_kv_state_unchanged(device, fused, kv):
    g = _guarded_step(kv=kv)
    cg = compile_graph(g)
    if not fused:  # the same gating, over the primitive chain
        from pootvk.passes import gate_state_writes
        cg = gate_state_writes(canonicalize(g))
    assert cg.count(P.ATTENTION) == (1 if fused else 0)
    dus = [e for e in cg.eqns if e.prim is P.DYNAMIC_UPDATE_SLICE]
    assert len(dus) == 2 and all(e.inputs[-1] is cg.validations["len"] for e in dus)
    plan = plan_graph(cg, device.profile)
    rng = np.random.default_rng(4)
    np_kv = kv.numpy

    def step_values(pos, lengths):
        return {"q": rng.standard_normal((2, HQ, 1, D), dtype=np.float32),
                "k_new": rng.standard_normal((2, HKV, 1, D)).astype(np_kv),
                "v_new": rng.standard_normal((2, HKV, 1, D)).astype(np_kv),
                "pos": np.int32(pos), "lengths": np.array(lengths, np.int32)}

    with Replay(device, plan, compile_plan(plan)) as rp:
        first = step_values(0, [1, 1])
        out = rp.step(first)
        ref = evaluate(g, {**first, "k_cache": np.zeros((2, HKV, 160, D), np_kv),
                           "v_cache": np.zeros((2, HKV, 160, D), np_kv)})
        assert_close(out["out"], ref["out"].astype(np.float64))
        held = out["out"].copy()
        k0, v0 = rp.read_state("k_cache"), rp.read_state("v_cache")
        for bad in ([0, 1], [1, 161]):
            with pytest.raises(GuardFailed) as e:
                rp.step(step_values(1, bad))
            assert e.value.guard == "len" and e.value.value in bad
            np.testing.assert_array_equal(rp.read_state("k_cache"), k0)
            np.testing.assert_array_equal(rp.read_state("v_cache"), v0)
        np.testing.assert_array_equal(out["out"], held)  # what the caller holds is intact
        good = step_values(1, [2, 1])
        ins = {**good, "k_cache": k0, "v_cache": v0}
        ref = evaluate(g, ins)
        got = rp.step(good)
        assert_close(got["out"], ref["out"].astype(np.float64))
        np.testing.assert_array_equal(rp.read_state("k_cache"), ref["k_cache"])


def test_decode_loop_live_by_default_and_capacity_on_request(device):
    """Live mode builds no mask (no Compare/Select kernels); both forms give the same steps."""
    b, hq, hkv, d, cap = 2, 8, 2, 64, 200
    rng = np.random.default_rng(7)
    steps = [tuple(rng.standard_normal((b, h, 1, w), dtype=np.float32)
                   for h, w in ((hq, d), (hkv, d), (hkv, d))) for _ in range(3)]
    outs = {}
    for live in (True, False):
        with DecodeLoop(b, hq, hkv, d, cap, device=device, live=live) as loop:
            reqs = planned_requests(loop.plan)
            prims = {r.prim for r in reqs if hasattr(r, "prim")}
            prims |= {n.op for r in reqs if isinstance(r, FusedRequest)
                      for n in r.body.nodes}  # the mask's Compare and Select fused
            assert (P.COMPARE in prims or P.SELECT in prims) is not live
            assert loop.plan.graph.count(P.ATTENTION) == 1
            outs[live] = [loop.step(*s) for s in steps]
            assert loop.recordings == 1
    kc = np.stack([s[1] for s in steps], axis=2)[:, :, :, 0]
    vc = np.stack([s[2] for s in steps], axis=2)[:, :, :, 0]
    for i, s in enumerate(steps):
        ref = reference_attention(s[0], kc[:, :, : i + 1], vc[:, :, : i + 1])
        assert_close(outs[True][i], ref)
        assert_close(outs[False][i], ref)


@pytest.mark.parametrize("schedule", ["streaming", "grouped", "split7", "split7_interleaved"])
def test_live_with_an_additive_mask_and_several_query_rows(device, schedule):
    """The live bound is orthogonal to an additive (ALiBi) mask, and bounds every query row
    of a batch row alike (Lq = 3)."""
    rng = np.random.default_rng(11)
    b, hq, hkv, lq, lk, d = 3, 4, 2, 3, 257, 40
    q = rng.standard_normal((b, hq, lq, d), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    slopes = 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)
    alibi = (slopes[:, None, None] * (np.arange(lk) - lk + 1)[None, None, :])[None]
    alibi = np.broadcast_to(alibi, (1, hq, lq, lk)).astype(np.float32)
    lengths = np.array([5, lk, 129])
    live = np.where(np.arange(lk)[None, :] < lengths[:, None], 0.0, -np.inf)
    ref = reference_attention(q, k, v, alibi + live[:, None, None, :])
    for i, n in enumerate(lengths):
        k[i, :, n:] = np.inf
        v[i, :, n:] = np.nan
    with forced_schedule(**SCHEDULES[schedule]):
        got = pootvk.attention(q, k, v, mask=alibi, lengths=lengths, device=device)
    assert_close(got, ref)


@pytest.mark.parametrize("schedule", ["streaming", "split7", "split7_interleaved"])
def test_a_fused_live_eqn_clamps_any_length(device, schedule):
    """An Attention eqn built by hand over an unguarded length: the kernels clamp it into
    0..=Lk and agree with the fused oracle rule (nothing read outside the buffers)."""
    from pootvk.ir import AttentionForm, new_eqn

    b, lk = 4, 150
    bb = Builder()
    q = bb.input("q", (b, 4, 1, 16))
    k = bb.input("k", (b, 2, lk, 16))
    v = bb.input("v", (b, 2, lk, 16))
    n = bb.input("n", (b,), I32)
    e = new_eqn(P.ATTENTION, [q, k, v, n], form=AttentionForm(scale=0.25, n_rep=2, live=True))
    bb.eqns.append(e)
    bb.export("out", e.out)
    g = bb.build()
    rng = np.random.default_rng(5)
    ins = {s.name: rng.standard_normal(s.var.shape, dtype=np.float32)
           for s in g.slots if s.var.dtype is F32}
    ins["n"] = np.array([-3, 0, lk + 5, 2**31 - 1], np.int32)
    ref = evaluate(g, ins)["out"]
    with forced_schedule(**SCHEDULES[schedule]):
        plan = plan_graph(g, device.profile)
    with Replay(device, plan, compile_plan(plan)) as rp:
        got = rp.step(ins)["out"]
    assert np.isnan(ref[:2]).all() and np.isfinite(ref[2:]).all()
    assert_close(got, ref.astype(np.float64))
