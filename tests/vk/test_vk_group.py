"""One launch per dependency level for the small elementwise kernels (``plan.group``): a
Llama decode step's q rotation and two cache writes shape, other widths and dtypes, gated
state writes, the binding cap, and dependent kernels kept apart. Every grouped plan runs on
the device against the oracle and bit for bit against the same plan ungrouped."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.access import levels
from pootvk.errors import GuardFailed
from pootvk.ir import F16, F32, I32, SlotKind
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph
from pootvk.plan import FusedRequest, FusedUpdateRequest, GroupRequest, plan_graph
from pootvk.plan.group import MAX_BINDINGS, touches
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan
from tests.helpers import assert_close, random_inputs
from tests.passes.test_fuse_moves import rope


def rotate_and_write(kv=F32, hq=3, hkv=2, d=8, cap=6, gate=False, q_rows=1):
    """q = rope(qkv[heads :hq]) exported; k_cache[:, :, p] = rope(qkv[hq:hq+hkv]) and
    v_cache[:, :, p] = qkv[hq+hkv:] in place: three kernels of one level (a Llama decode
    step's), with F16 states narrowing in the write."""
    b = Builder()
    qkv = b.input("qkv", (1, hq + 2 * hkv, q_rows, d))
    cos, sin = b.input("cos", (1, 1, q_rows, d)), b.input("sin", (1, 1, q_rows, d))
    p = b.pos("p", 0, cap - q_rows)
    q = rope(b, b.slice(qkv, (0, 0, 0, 0), (1, hq, q_rows, d)), cos, sin)
    k = rope(b, b.slice(qkv, (0, hq, 0, 0), (1, hq + hkv, q_rows, d)), cos, sin)
    v = b.slice(qkv, (0, hq + hkv, 0, 0), (1, hq + 2 * hkv, q_rows, d))
    if kv is not F32:
        k, v = b.convert(k, kv), b.convert(v, kv)
    for name, u in (("k", k), ("v", v)):
        s = b.state(f"{name}_cache", (1, hkv, cap, d), kv)
        b.set_state(f"{name}_cache", b.dynamic_update_slice(s, u, (0, 0, p, 0)))
    if gate:
        b.export("n2", b.index_guard(b.input("n", (1,), I32), 1, 8, "n_ok"))
    b.export("q", b.mul(q, 0.5))
    return b.build()


def run(device, c, ins, group):
    plan = plan_graph(c, device.profile, group=group)
    with Replay(device, plan, compile_plan(plan)) as rp:
        for s in c.slots:
            if s.kind is SlotKind.STATE:
                rp.set_state(s.name, ins[s.name])
        out = rp.step({k: v for k, v in ins.items() if c.slot(k).kind.per_step})
        states = {name: rp.read_state(name) for name in c.states}
    return plan, out, states


def check(device, g, ins):
    """The grouped plan against the oracle (exports and new states) and bit for bit against
    the same compiled graph planned ungrouped."""
    c = compile_graph(g)
    ref = evaluate(g, ins)
    plan, out, states = run(device, c, ins, True)
    _, out0, states0 = run(device, c, ins, False)
    for name, r in ref.items():
        if name in g.validations:
            continue
        got = out[name] if name in out else states[name]
        assert_close(got.astype(np.float32), r.astype(np.float32), 1e-6)
    for name, v in out.items():
        np.testing.assert_array_equal(v, out0[name], err_msg=name)
    for name, v in states.items():
        np.testing.assert_array_equal(v, states0[name], err_msg=name)
    return plan, states


@pytest.mark.parametrize("kv", [F32, F16])
@pytest.mark.parametrize("q_rows", [1, 3])
def test_rotation_and_cache_writes_are_one_launch(device, kv, q_rows):
    g = rotate_and_write(kv, q_rows=q_rows)
    ins = random_inputs(g, np.random.default_rng(q_rows), pos=2)
    plan, states = check(device, g, ins)
    reqs = [k.request for k in plan.kernels]
    (grp,) = [r for r in reqs if isinstance(r, GroupRequest)]
    assert sorted(type(p).__name__ for p in grp.parts) == [
        "FusedRequest", "FusedUpdateRequest", "FusedUpdateRequest"]
    assert not any(isinstance(r, (FusedRequest, FusedUpdateRequest)) for r in reqs)
    # the writes landed at row p, the rows around it kept the old values
    qkv, cos, sin = ins["qkv"], ins["cos"], ins["sin"]
    v = qkv[:, 3 + 2:, :, :]
    want_v = ins["v_cache"].copy()
    want_v[:, :, 2:2 + q_rows] = v.astype(kv.numpy)
    np.testing.assert_array_equal(states["v_cache"], want_v)
    half = 4
    k = qkv[:, 3:5].astype(np.float32)
    rot = np.concatenate([k[..., half:], k[..., :half]], -1)  # folded tables (the helper)
    want_k = ins["k_cache"].copy()
    want_k[:, :, 2:2 + q_rows] = (k * cos + rot * sin).astype(kv.numpy)
    assert_close(states["k_cache"].astype(np.float32), want_k.astype(np.float32), 1e-10)


def test_a_failed_gate_leaves_both_states_unwritten(device):
    g = rotate_and_write(gate=True)
    ins = random_inputs(g, np.random.default_rng(5), pos=1)
    ins["n"] = np.array([0], np.int32)  # outside [1, 8]: the guard fails
    c = compile_graph(g)
    plan = plan_graph(c, device.profile)
    assert any(isinstance(k.request, GroupRequest) for k in plan.kernels)
    with Replay(device, plan, compile_plan(plan)) as rp:
        for name in ("k_cache", "v_cache"):
            rp.set_state(name, ins[name])
        with pytest.raises(GuardFailed):
            rp.step({k: v for k, v in ins.items() if c.slot(k).kind.per_step})
        for name in ("k_cache", "v_cache"):
            np.testing.assert_array_equal(rp.read_state(name), ins[name])


def test_parts_of_different_sizes_and_dtypes(device):
    """Independent exports of 5, 300 and 2000 elements (one F16): each part gets its own
    workgroups of the group's size, idle lanes return."""
    b = Builder()
    x, y = b.input("x", (5,)), b.input("y", (3, 100))
    z = b.input("z", (2000,), F16)
    b.export("a", b.add(b.unary("Exp", x), 1.0))  # two ops: a Fused kernel, not a Prim one
    b.export("b", b.mul(b.unary("Tanh", y), 3.0))
    b.export("c", b.convert(b.mul(b.convert(z, F32), 2.0), F16))
    g = b.build()
    plan, _ = check(device, g, random_inputs(g, np.random.default_rng(7)))
    (grp,) = [k.request for k in plan.kernels]
    assert isinstance(grp, GroupRequest) and len(grp.parts) == 3


def test_dependent_kernels_are_not_grouped_and_the_cap_holds(device):
    """a = exp(x) + 1 (observed), then b = (a + 1) * 2: two levels, never one launch; 12
    independent exports of 2 bindings each fill groups of at most MAX_BINDINGS bindings
    (every body two ops: a Fused kernel, not a Prim one)."""
    b = Builder()
    x = b.input("x", (64,))
    a = b.add(b.unary("Exp", x), 1.0)
    b.export("a", a)
    b.export("b", b.mul(b.add(a, 1.0), 2.0))
    for i in range(12):
        b.export(f"e{i}", b.add(b.mul(b.input(f"x{i}", (40,)), float(i + 1)), 0.5))
    g = b.build()
    plan, _ = check(device, g, random_inputs(g, np.random.default_rng(8)))
    lv = levels([touches(k) for k in plan.kernels])
    assert list(lv) == sorted(lv)  # the plan is listed level by level
    for k in plan.kernels:
        assert len(k.bindings) <= MAX_BINDINGS
    parts = sum(len(k.request.parts) if isinstance(k.request, GroupRequest) else 1
                for k in plan.kernels)
    assert parts == 14 and len(plan.kernels) < 14
    # the kernel reading a is a level above the one writing it, in no group with it
    assert len(set(lv)) == 2


def test_primitive_launches_group_too(device):
    """DecodeLoop-shaped levels: the live length's i32 add and an index guard (its witness
    binding written through atomics), then the two plain cache writes (DynamicUpdateSlice,
    gated on the witness: the next level) are Prim launches: two groups, the same words as
    ungrouped; a failed guard still fails and writes nothing."""
    b = Builder()
    p = b.pos("p", 0, 5)
    for name in ("k", "v"):
        s = b.state(f"{name}_cache", (1, 2, 6, 8), F16)
        b.set_state(f"{name}_cache", b.dynamic_update_slice(
            s, b.input(f"{name}_new", (1, 2, 1, 8), F16), (0, 0, p, 0)))
    b.export("len", b.add(p, b.add(b.mul(b.iota((1,), axis=0), 0), 1)))
    b.export("n2", b.index_guard(b.input("n", (1,), I32), 1, 8, "n_ok"))
    g = b.build()
    ins = random_inputs(g, np.random.default_rng(9), pos=3)
    ins["n"] = np.array([4], np.int32)
    plan, states = check(device, g, ins)
    groups = [k.request for k in plan.kernels if isinstance(k.request, GroupRequest)]
    assert len(groups) == 2 and all(len(gr.parts) == 2 for gr in groups)
    assert all(type(r).__name__ == "PrimRequest" for gr in groups for r in gr.parts)
    want = ins["v_cache"].copy()
    want[:, :, 3] = ins["v_new"][:, :, 0]
    np.testing.assert_array_equal(states["v_cache"], want)
    ins["n"] = np.array([0], np.int32)
    c = compile_graph(g)
    grouped = plan_graph(c, device.profile)
    with Replay(device, grouped, compile_plan(grouped)) as rp:
        for name in ("k_cache", "v_cache"):
            rp.set_state(name, ins[name])
        with pytest.raises(GuardFailed):
            rp.step({k: v for k, v in ins.items() if c.slot(k).kind.per_step})
        np.testing.assert_array_equal(rp.read_state("v_cache"), ins["v_cache"])
