"""The live form without a device: value ranges, when the rewrite fuses a live bound (and
when it must not), guard elision, state-write gating, and the fused oracle rule bit for bit
against the chain it replaced."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.errors import UnsupportedPrimitive
from pootvk.ir import F16, F32, I32, SlotKind, new_eqn
from pootvk.ir import prims as P
from pootvk.ops import Builder, attention_live, trace_attention, trace_decode_step
from pootvk.ops.attention import _attend  # the chain of attention_live without its guard
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph, gate_state_writes, value_ranges
from pootvk.plan import plan_graph, recorded_profile
from tests.helpers import random_inputs


def _live_graph(length_of, *, b=2, lk=40, d=8, kv=F32):
    """attention_live over bound K/V with ``length_of(builder) -> i32[b]`` as the length."""
    bb = Builder()
    q = bb.input("q", (b, 4, 1, d))
    k = bb.input("k", (b, 2, lk, d), kv)
    v = bb.input("v", (b, 2, lk, d), kv)
    bb.export("out", attention_live(bb, q, k, v, length_of(bb)))
    return bb.build()


def test_value_ranges():
    bb = Builder()
    pos = bb.pos("pos", 0, 99)
    x = bb.input("x", (3,), I32)
    a = bb.add(pos, 1)
    m = bb.mul(bb.sub(pos, 50), pos)
    big = bb.mul(bb.mul(pos, 1 << 20), 1 << 20)  # leaves i32: no range
    guarded = bb.index_guard(x, 1, 7, "x_ok")
    e = new_eqn(P.INDEX_GUARD, [x], lo=0, hi=3)  # a guard whose witness nobody declared
    bb.eqns.append(e)
    g = bb.build()
    r = value_ranges(g)
    assert r[a] == (1, 100) and r[m] == (-50 * 99, 49 * 99)
    assert big not in r and x not in r
    assert r[guarded] == (1, 7)  # the clamp counts: its witness is a validation output
    assert e.outputs[0] not in r  # it does not


def test_decode_live_fuses_from_the_position_slot_without_a_guard():
    g = compile_graph(trace_decode_step(2, 8, 2, 16, 64, live=True, kv_dtype=F16))
    (att,) = [e for e in g.eqns if e.prim is P.ATTENTION]
    form = att.params["form"]
    assert form.live and form.kv_dtype is F16 and att.inputs[-1].shape == (2,)
    assert g.count(P.INDEX_GUARD) == 0 and not g.validations  # proven by pos in [0, 63]
    assert g.count(P.SELECT) == 0 and g.count(P.COMPARE) == 0  # no mask is built
    assert "live" in str(g)


@pytest.mark.parametrize("kind", ["guarded", "unguarded", "undeclared", "wide_slot"])
def test_the_rewrite_fuses_only_what_it_proves(kind):
    """A declared guard or a slot range inside 1..=Lk fuses; an unproven length (no guard, a
    guard whose witness is not a validation output, a slot range past Lk) stays primitive.
    Either way the oracle's answer is the chain's, bit for bit."""
    lk = 40

    def length(bb):
        if kind == "wide_slot":
            return bb.slot("lengths", SlotKind.LEN, (2,), I32, (1, lk + 1))
        n = bb.input("lengths", (2,), I32)
        if kind == "undeclared":
            e = new_eqn(P.INDEX_GUARD, [n], lo=1, hi=lk)
            bb.eqns.append(e)
            return e.outputs[0]
        return n

    if kind == "guarded":
        g = trace_attention((2, 4, 1, 8), (2, 2, lk, 8), (2, 2, lk, 8), lengths=True)
    else:
        bb = Builder()
        q = bb.input("q", (2, 4, 1, 8))
        k = bb.input("k", (2, 2, lk, 8))
        v = bb.input("v", (2, 2, lk, 8))
        n = length(bb)
        bb.export("out", _attend(bb, q, k, v, None, None, None, n))
        g = bb.build()
    c = compile_graph(g)
    assert c.count(P.ATTENTION) == (1 if kind == "guarded" else 0)
    rng = np.random.default_rng(0)
    ins = random_inputs(g, rng)
    ins["lengths"] = np.array([3, lk], np.int32)
    ins["k"][0, :, 3:] = np.nan  # inactive rows: never reach the output
    ins["v"][0, :, 3:] = np.nan
    want, got = evaluate(g, ins)["out"], evaluate(c, ins)["out"]
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got, want)


def test_guard_elision_and_witnesses():
    g = _live_graph(lambda bb: bb.add(bb.pos("pos", 0, 39), bb.add(bb.mul(
        bb.iota((2,), axis=0), 0), 1)))
    assert "len" in g.validations
    c = compile_graph(g)
    assert c.count(P.INDEX_GUARD) == 0 and not c.validations and c.count(P.ATTENTION) == 1
    # a position that may reach Lk: the guard stays and its witness with it
    g2 = _live_graph(lambda bb: bb.add(bb.pos("pos", 0, 40), bb.add(bb.mul(
        bb.iota((2,), axis=0), 0), 1)))
    c2 = compile_graph(g2)
    assert c2.count(P.INDEX_GUARD) == 1 and "len" in c2.validations
    assert c2.count(P.ATTENTION) == 1


def test_state_writes_are_gated_or_refused():
    b = Builder()
    kc = b.state("kc", (1, 1, 8, 4))
    kn = b.input("kn", (1, 1, 1, 4))
    n = b.input("n", (1,), I32)
    pos = b.pos("pos", 0, 7)
    kc2 = b.dynamic_update_slice(kc, kn, (0, 0, pos, 0))
    b.export("n2", b.index_guard(n, 1, 8, "n_ok"))
    b.set_state("kc", kc2)
    g = b.build()
    gated = gate_state_writes(g)
    assert gated.eqns[0].prim is P.INDEX_GUARD  # the guard runs before the write
    (dus,) = [e for e in gated.eqns if e.prim is P.DYNAMIC_UPDATE_SLICE]
    assert dus.inputs[-1] is g.validations["n_ok"]
    ins = {"kc": np.zeros((1, 1, 8, 4), np.float32), "kn": np.ones((1, 1, 1, 4), np.float32),
           "pos": np.int32(2), "n": np.array([0], np.int32)}
    out = evaluate(gated, ins)
    assert not out["kc"].any() and out["n_ok"].tolist() == [1, 0]  # failed: nothing written
    assert evaluate(gated, {**ins, "n": np.array([3], np.int32)})["kc"][0, 0, 2].all()
    lav = recorded_profile("lavapipe")
    with pytest.raises(UnsupportedPrimitive, match="gates"):
        plan_graph(g, lav)  # ungated state under a witness: refused
    plan_graph(gated, lav)

    b2 = Builder()  # a guard that reads the state written this step cannot gate it
    kc = b2.state("kc", (1, 1, 8, 4))
    kc2 = b2.dynamic_update_slice(kc, b2.input("kn", (1, 1, 1, 4)), (0, 0, b2.pos("p", 0, 7), 0))
    b2.export("g", b2.index_guard(b2.convert(b2.reshape(kc2, (32,)), I32), 0, 1, "w"))
    b2.set_state("kc", kc2)
    with pytest.raises(UnsupportedPrimitive, match="same step"):
        gate_state_writes(b2.build())

    b3 = Builder()  # a state not updated in place by a DynamicUpdateSlice
    s = b3.state("s", (4,))
    b3.set_state("s", b3.add(s, 1.0))
    b3.export("g", b3.index_guard(b3.input("i", (1,), I32), 0, 3, "i_ok"))
    with pytest.raises(UnsupportedPrimitive, match="in place"):
        gate_state_writes(b3.build())
