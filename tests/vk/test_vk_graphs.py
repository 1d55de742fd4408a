"""Whole graphs on the live device: fused and primitive forms, folded grids, replay checks.

Attention outputs are checked against the independent float64 reference (tests.helpers);
graphs without attention against the oracle."""

import numpy as np
import pytest

from pootvk.errors import BindError, SlotRangeError
from pootvk.ir import F32, I32, SlotKind
from pootvk.ir import prims as P
from pootvk.ops import Builder, trace_attention, trace_decode_step
from pootvk.oracle import evaluate
from pootvk.passes import canonicalize, compile_graph
from pootvk.plan import plan_graph
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan
from tests.helpers import assert_close, random_inputs, reference_attention, reference_decode_step


def run_on_device(device, g, ins, profile=None):
    plan = plan_graph(g, profile or device.profile)
    with Replay(device, plan, compile_plan(plan)) as rp:
        for s in g.slots:
            if s.kind is SlotKind.STATE:
                rp.set_state(s.name, ins[s.name])
            elif s.kind is SlotKind.PARAM:
                rp.set_params({s.name: ins[s.name]})
        out = rp.step({k: v for k, v in ins.items() if g.slot(k).kind.per_step})
        states = {name: rp.read_state(name) for name in g.states}
        assert rp.recordings == 1
    return out, states


def decode(**kw):
    """A decode-step case: its graph and its reference (from the definition)."""
    scale, softcap = kw.get("scale"), kw.get("softcap")
    return trace_decode_step(**kw), lambda ins: reference_decode_step(ins, scale, softcap)


def plain(*shapes):
    return trace_attention(*shapes), lambda ins: {
        "out": reference_attention(ins["q"], ins["k"], ins["v"], ins["mask"])
    }


CASES = {
    "decode": decode(batch=2, q_heads=8, kv_heads=2, head_dim=16, capacity=40, softcap=20.0,
                     alibi=True),
    "prefill": decode(batch=1, q_heads=4, kv_heads=1, head_dim=12, capacity=33, q_rows=6),
    "plain": plain((2, 3, 4, 5), (2, 3, 9, 5), (2, 3, 9, 7), (2, 1, 4, 9)),
}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_graph_runs_fused_and_as_primitives(device, case, fused):
    """The primitive form runs too: every primitive kernel checked through a real chain."""
    g, reference = CASES[case]
    c = compile_graph(g) if fused else canonicalize(g)
    assert (c.count(P.ATTENTION) == 1) == fused
    ins = random_inputs(g, np.random.default_rng(4), pos=5)
    ref = reference(ins)
    out, states = run_on_device(device, c, ins)
    assert_close(out["out"], ref["out"])
    assert set(states) == set(ref) - {"out"}
    for name, s in states.items():
        np.testing.assert_array_equal(s, ref[name])  # the KV write is exact


def test_all_primitive_kernels(device):
    b = Builder()
    x = b.input("x", (3, 4, 5))
    y = b.input("y", (4, 1))
    i = b.input("i", (3, 4, 5), I32)
    t = b.transpose(b.add(x, y), (2, 0, 1))  # [5,3,4]
    s = b.slice(t, (1, 0, 1), (4, 3, 4))  # [3,3,3]
    c = b.concat([s, b.unary("Neg", s)], 0)  # [6,3,3]
    r = b.reduce("Sum", b.unary("Tanh", c), 2, keepdim=False)  # [6,3]
    mx = b.reduce("Max", c, 0)  # [1,3,3]
    mm = b.matmul(b.reshape(r, (2, 3, 3)), mx)  # [2,3,3]
    cv = b.convert(b.compare("Gt", i, 1), F32)
    sel = b.select(b.compare("Lt", x, 0.0), b.max(x, y), b.min(b.sub(x, y), cv))
    b.export("mm", b.div(mm, 3.0))
    b.export("sel", b.mul(sel, b.unary("Exp", b.unary("Abs", y))))
    b.export("iota", b.convert(b.iota((2, 5), 1), F32))
    b.export("bc", b.broadcast(y, (2, 4, 3)))
    b.export("ints", b.add(i, b.convert(b.iota((3, 4, 5), 0), I32)))
    g = b.build()
    ins = random_inputs(g, np.random.default_rng(5))
    ref = evaluate(g, ins)
    out, _ = run_on_device(device, canonicalize(g), ins)
    for k in ("mm", "sel", "iota", "bc"):
        np.testing.assert_allclose(out[k], ref[k], rtol=2e-5, atol=2e-6, err_msg=k)
    np.testing.assert_array_equal(out["ints"], ref["ints"])


def test_two_d_grid_on_the_device(device):
    """A profile whose X limit is small forces folded 2-D grids; the answers don't change."""
    g = trace_decode_step(3, 8, 2, 16, 20)
    small = device.profile.with_(max_grid=(5, 65535, 65535))
    for c in (compile_graph(g), canonicalize(g)):
        plan = plan_graph(c, small)
        assert any(k.request.grid[1] > 1 for k in plan.kernels)
        ins = random_inputs(g, np.random.default_rng(6), pos=11)
        ref = reference_decode_step(ins)
        out, states = run_on_device(device, c, ins, profile=small)
        assert_close(out["out"], ref["out"])
        np.testing.assert_array_equal(states["k_cache"], ref["k_cache"])


def test_bad_step_publishes_nothing_and_keeps_state(device):
    g = trace_decode_step(1, 2, 2, 8, 4)
    plan = plan_graph(compile_graph(g), device.profile)
    ins = random_inputs(g, np.random.default_rng(7), pos=1)
    with Replay(device, plan, compile_plan(plan)) as rp:
        rp.set_state("k_cache", ins["k_cache"])
        rp.set_state("v_cache", ins["v_cache"])
        step = {k: ins[k] for k in ("q", "k_new", "v_new", "pos")}
        good = rp.step(step)["out"]
        k_after = rp.read_state("k_cache")
        q_buf = rp.buffers["in:q"].read(0, 64)
        for bad, err in (
            ({"pos": np.int32(4)}, SlotRangeError),  # declared [0, 3]
            ({"pos": np.int32(-1)}, SlotRangeError),
            ({"q": np.zeros((1, 2, 1, 9), np.float32)}, BindError),
            ({"k_new": np.zeros((1, 2, 1, 8), np.int32)}, BindError),
        ):
            # a good q is offered alongside: the check must refuse before writing anything
            with pytest.raises(err):
                rp.step({**step, "q": np.full((1, 2, 1, 8), 9.0, np.float32), **bad})
            np.testing.assert_array_equal(rp.read_state("k_cache"), k_after)
            assert rp.buffers["in:q"].read(0, 64) == q_buf
        np.testing.assert_allclose(rp.step(step)["out"], good, rtol=1e-6)


def test_inputs_go_through_staging_when_device_memory_is_not_mappable(device):
    """A discrete GPU without ReBAR: per-step inputs are copied by the recording itself."""
    from pootvk.vk import Device

    g = trace_decode_step(2, 4, 2, 16, 24, alibi=True)
    with Device(device.name) as dev:
        dev.allow_mapped_device_memory = False
        plan = plan_graph(compile_graph(g), dev.profile)
        rng = np.random.default_rng(8)
        kc = np.zeros((2, 2, 24, 16), np.float32)
        vc = np.zeros_like(kc)
        alibi = rng.standard_normal((1, 4, 1, 24)).astype(np.float32)
        with Replay(dev, plan, compile_plan(plan)) as rp:
            assert set(rp.staging) == {"in:q", "in:k_new", "in:v_new", "in:pos"}
            assert not rp.buffers["state:k_cache"].mapped
            rp.set_params({"alibi": alibi})
            for pos in range(5):
                step = random_inputs(g, rng, pos=pos)
                out = rp.step({k: step[k] for k in ("q", "k_new", "v_new", "pos")})
                ref = reference_decode_step({**step, "k_cache": kc, "v_cache": vc,
                                             "alibi": alibi})
                kc, vc = ref["k_cache"], ref["v_cache"]
                assert_close(out["out"], ref["out"])
            np.testing.assert_array_equal(rp.read_state("v_cache"), vc)
            assert rp.recordings == 1


def test_replay_releases_every_handle_it_made(device):
    g = compile_graph(trace_decode_step(1, 4, 2, 8, 16, alibi=True))
    plan = plan_graph(g, device.profile)
    spv = compile_plan(plan)
    Replay(device, plan, spv).close()  # pipelines are cached on the device from here on
    base = device.live_objects()
    for _ in range(3):
        with Replay(device, plan, spv) as rp:
            assert device.live_objects() > base
            ins = random_inputs(g, np.random.default_rng(0), pos=1)
            rp.step({k: v for k, v in ins.items() if g.slot(k).kind.per_step})
    assert device.live_objects() == base


def test_a_failed_guard_publishes_nothing(device):
    """Replay checks validation witnesses after the step and refuses to publish; a witness
    is cleared before every step (a failed step does not fail the next one)."""
    from pootvk.errors import GuardFailed

    b = Builder()
    x = b.input("x", (4,))
    pos = b.pos("pos", 0, 9)
    b.export("y", b.mul(x, 2.0))
    b.validations["pos_le_5"] = b.convert(b.compare("Gt", pos, 5), I32)
    idx = b.input("idx", (3,), I32)
    b.export("z", b.convert(b.index_guard(idx, 0, 7, "idx_in_range"), F32))
    g = b.build()
    plan = plan_graph(g, device.profile)
    good = {"x": np.arange(4, dtype=np.float32), "pos": np.int32(5),
            "idx": np.array([0, 7, 3], np.int32)}
    with Replay(device, plan, compile_plan(plan)) as rp:
        ok = rp.step(good)
        np.testing.assert_array_equal(ok["y"], [0, 2, 4, 6])
        np.testing.assert_array_equal(ok["z"], [0, 7, 3])
        with pytest.raises(GuardFailed) as e:
            rp.step({**good, "pos": np.int32(6)})
        assert e.value.guard == "pos_le_5" and e.value.count == 1
        with pytest.raises(GuardFailed, match=r"idx_in_range.*1 value\(s\) outside \[0, 7\], "
                           r"e.g. -4") as e:
            rp.step({**good, "idx": np.array([2, -4, 5], np.int32)})
        assert (e.value.value, e.value.count, e.value.lo, e.value.hi) == (-4, 1, 0, 7)
        with pytest.raises(GuardFailed) as e:
            rp.step({**good, "idx": np.array([8, -1, 9], np.int32)})
        assert e.value.count == 3 and e.value.value in (8, -1, 9)
        again = rp.step(good)  # the witnesses were cleared: the next good step passes
        np.testing.assert_array_equal(again["z"], [0, 7, 3])
