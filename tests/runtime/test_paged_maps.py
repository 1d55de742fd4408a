"""Paged maps on the device (lavapipe): a refused write or read map publishes nothing and
leaves the pools bit-identical.

The step is ``ops.trace_paged_step``: the new K/V rows written into state pools through the
write map (ScatterUpdate, in place), then attention through the read map. It is compiled here
without the attention rewrite, so the attention runs as the primitives every device plans
today (the gathered view), and run through a Replay. A refused step (a write slot outside
the pool or named twice, a read word outside the pool) raises its typed error at bind: the
pools read back before and after are identical and the next good step runs as if the
refused one had never been asked for.
"""

import numpy as np
import pytest

import pootvk
from pootvk.errors import SlotRangeError, WriteMapError
from pootvk.ir import ForwardSlotMap, KeyLayout
from pootvk.ir import prims as P
from pootvk.ops import trace_paged_step
from pootvk.oracle import evaluate
from pootvk.passes import PASSES, attention_rewrite
from pootvk.plan import plan_graph
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan
from tests.helpers import assert_close

B, HQ, HKV, D, S, LK = 3, 4, 2, 8, 32, 12


def unfused(g):
    """The compile pipeline without the attention rewrite: the paged attention stays the
    Gather/Transpose view and the dense chain's primitives."""
    for p in PASSES:
        if p is not attention_rewrite:
            g = p(g)
    return g


def read_map() -> np.ndarray:
    tables = [[7, 2, 5], [7, 0, 3], [1, 6, 4]]  # block 7 shared by rows 0 and 1, blocks of 4
    return np.array([[tab[t // 4] * 4 + t % 4 for t in range(LK)] for tab in tables],
                    np.int32)


def _step(rng, write, lens=(1, LK, 6)):
    return {"q": rng.standard_normal((B, HQ, 1, D)).astype(np.float32),
            "k_new": rng.standard_normal((B, HKV, D)).astype(np.float32),
            "v_new": rng.standard_normal((B, HKV, D)).astype(np.float32),
            "write": write, "read": read_map(), "len": np.array(lens, np.int32)}


def check_refusals(g, run, state, set_state):
    """A good step, every refused map (pools bit-identical after each, nothing returned),
    then a good step that continues from the first one's pools. ``run(values) -> exports``,
    ``state(name)`` reads a pool back, ``set_state(name, value)`` replaces it."""
    rng = np.random.default_rng(0)
    k0 = rng.standard_normal((S, HKV, D)).astype(np.float32)
    v0 = rng.standard_normal((S, HKV, D)).astype(np.float32)
    set_state("k_pool", k0)
    set_state("v_pool", v0)
    pools = lambda: (state("k_pool"), state("v_pool"))  # noqa: E731
    read = read_map()
    # a good step: rows 0 and 1 write their next slots, row 2 is padding (-1)
    good = _step(rng, np.array([read[0, 0], read[1, LK - 1], -1], np.int32))
    out = run(good)
    want = evaluate(g, {**good, "k_pool": k0, "v_pool": v0})
    kp, vp = pools()
    np.testing.assert_array_equal(kp, want["k_pool"])
    np.testing.assert_array_equal(vp, want["v_pool"])
    assert not np.array_equal(kp, k0)  # the step did write
    assert_close(out["out"], want["out"].astype(np.float64))

    # exact i32 arrays take the replay's fast bind, the others check_bind: both refuse
    bad_writes = [
        (np.array([3, S, -1], np.int32), "word 1 = 32: not a slot"),
        (np.array([-2, 3, 4], np.int32), "word 0 = -2: not a slot"),
        (np.array([9, 10, 9], np.int32), "word 2 = 9: slot named twice"),
        (np.array([9, 10, 9], np.int64), "word 2 = 9: slot named twice"),
        ([-1, 11, 11], "word 2 = 11: slot named twice"),
    ]
    before = pools()
    for write, msg in bad_writes:
        with pytest.raises(WriteMapError, match=msg):
            run(_step(rng, write))
        assert all(np.array_equal(a, b) for a, b in zip(before, pools(), strict=True))
    bad_read = _step(rng, np.array([12, 13, 14], np.int32))
    for word in (S, -1):
        bad_read["read"] = read_map()
        bad_read["read"][1, 5] = word
        with pytest.raises(SlotRangeError, match="'read'"):
            run(bad_read)
        assert all(np.array_equal(a, b) for a, b in zip(before, pools(), strict=True))

    # the next good step (a checked ForwardSlotMap) continues from the first step's pools
    nxt = _step(rng, ForwardSlotMap([read[0, 1], -1, read[2, 5]], S), lens=(2, LK, 6))
    out = run(nxt)
    want = evaluate(g, {**nxt, "k_pool": before[0], "v_pool": before[1]})
    kp, vp = pools()
    np.testing.assert_array_equal(kp, want["k_pool"])
    np.testing.assert_array_equal(vp, want["v_pool"])
    assert_close(out["out"], want["out"].astype(np.float64))


def test_unfused_paged_step_refuses_bad_maps_and_publishes_nothing(device):
    g = trace_paged_step(B, HQ, HKV, D, S, LK, live=True)
    c = unfused(g)
    assert c.count(P.ATTENTION) == 0 and c.count(P.SCATTER_UPDATE) == 2
    plan = plan_graph(c, device.profile)
    labels = [k.label for k in plan.kernels]  # the writes in place: no copy of a pool
    assert labels[:2] == ["ScatterUpdate"] * 2 and "copy" not in labels, labels
    with Replay(device, plan, compile_plan(plan)) as rp:
        check_refusals(g, rp.step, rp.read_state, rp.set_state)


def test_fused_paged_step_through_a_program(device):
    g = trace_paged_step(B, HQ, HKV, D, S, LK, live=True)
    with pootvk.compile(g, device) as prog:
        (att,) = [e for e in prog.plan.graph.eqns if e.prim is P.ATTENTION]
        assert att.params["form"].keys is KeyLayout.PAGED
        labels = [k.label for k in prog.plan.kernels]  # in place, read in place: no copy,
        assert labels[:2] == ["ScatterUpdate"] * 2, labels  # no gathered view
        assert set(labels[2:]) <= {"attention", "combine"}, labels
        check_refusals(g, lambda v: prog(**v), prog.state, prog.set_state)


def test_pootvk_plan_of_a_paged_key(capsys):
    from pootvk.cli import main

    assert main(["plan", "--profile", "lavapipe", "--shape", "2,4,2,64,32",
                 "--pool-slots", "256"]) == 0
    out = capsys.readouterr().out
    assert "paged: pools of 256 slots read through read [2,64]" in out
    assert "Gather" not in out and "Transpose" not in out
    # the keys visited (2 rows x 2 heads x 64 keys x (32 + 32) f32), not the 256-slot pools
    assert f"K/V read: {2 * 2 * 64 * 64 * 4} B of pools holding {2 * 256 * 2 * 32 * 4} B, " \
        f"through a {2 * 64 * 4} B read map" in out
