"""Fusion through index-moving primitives (Slice, Concat) and into state writes
(FusedUpdate): what merges, what must not, and that the oracle's answer is kept bit for bit."""

import dataclasses

import numpy as np
import pytest

from pootvk.errors import ShapeError
from pootvk.ir import F16, F32, I32, Params, Var
from pootvk.ir import prims as P
from pootvk.ir.fused import (
    FUSED,
    FUSED_REDUCE,
    FUSED_ROW,
    FUSED_UPDATE,
    FusedBody,
    Node,
    moves_reduced,
    type_body,
    update_parts,
)
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.passes import canonicalize, compile_graph, gate_state_writes
from pootvk.plan import plan_graph, recorded_profile
from tests.helpers import random_inputs
from tests.passes.test_fuse import LAVAPIPE, assert_keeps_answer, kernels, same
from tests.random_graphs import rms_norm


def rope(b, x, cos, sin):
    """HF's non-interleaved rotation with folded tables, as ``ops.layers.rope`` traces it."""
    half = x.shape[-1] // 2
    lo = b.slice(x, (0,) * x.ndim, (*x.shape[:-1], half))
    hi = b.slice(x, (0,) * (x.ndim - 1) + (half,), x.shape)
    return b.add(b.mul(x, cos), b.mul(b.concat([hi, lo], axis=x.ndim - 1), sin))


def rope_graph(shape=(1, 4, 3, 8)):
    b = Builder()
    x = b.input("x", shape)
    cos = b.input("cos", (1, 1, shape[2], shape[3]))
    sin = b.input("sin", (1, 1, shape[2], shape[3]))
    b.export("y", rope(b, x, cos, sin))
    return b.build()


def test_the_rope_chain_is_one_kernel_reading_x_once():
    """Two slices, the concat, two products and the sum: one Fused eqn whose leaves are x,
    cos and sin (x read at three indices, never stored shifted)."""
    g = rope_graph()
    assert len(kernels(canonicalize(g))) == 6
    c = assert_keeps_answer(g)
    (e,) = c.eqns
    assert e.prim is FUSED and e.inputs == tuple(s.var for s in g.slots)
    assert e.params["body"].moves
    assert kernels(c) == ["fused"]


def test_slices_of_a_value_and_its_producer_fuse_through_the_moves():
    """An elementwise producer (tanh) read by slices, and a slice of a Linear-like input
    ahead of the rotation (how the model traces q and k): all one kernel."""
    b = Builder()
    qk = b.input("qk", (1, 6, 2, 8))
    cos, sin = b.input("cos", (1, 1, 2, 8)), b.input("sin", (1, 1, 2, 8))
    t = b.unary("Tanh", qk)
    q = rope(b, b.slice(t, (0, 0, 0, 0), (1, 4, 2, 8)), cos, sin)
    k = rope(b, b.slice(qk, (0, 4, 0, 0), (1, 6, 2, 8)), cos, sin)
    b.export("q", q)
    b.export("k", k)
    g = b.build()
    c = assert_keeps_answer(g)
    assert [e.prim for e in c.eqns] == [FUSED, FUSED]
    assert all(e.inputs[0] is qk for e in c.eqns)  # the slices read qk itself
    assert kernels(c) == ["fused", "fused"]


def test_a_pure_move_read_by_two_kernels_is_read_through_by_both():
    """A transpose (no arithmetic) read by two kernels that cannot share one body (one is
    exported before the other reads a matmul of it): each reads x through the permuted
    index, nothing stores the transpose. A computed value read twice is stored once."""
    b = Builder()
    x = b.input("x", (3, 4))
    t = b.transpose(x, (1, 0))
    b.export("a", b.mul(t, 2.0))
    b.export("m", b.matmul(b.unary("Exp", t), b.input("w", (3, 2))))
    g = b.build()
    c = assert_keeps_answer(g)
    # the Exp's body becomes the matmul's prologue (passes.linear_fuse): it reads x too
    assert c.count(P.TRANSPOSE) == 0 and c.count(FUSED) == c.count(P.LINEAR) == 1
    assert all(e.inputs[0] is x for e in c.eqns)
    (lin,) = [e for e in c.eqns if e.prim is P.LINEAR]
    assert lin.params["form"].prologue.body.moves
    b = Builder()
    x = b.input("x", (3, 4))
    t = b.transpose(b.unary("Tanh", x), (1, 0))  # computes: stored once for both
    b.export("a", b.mul(t, 2.0))
    b.export("m", b.matmul(b.unary("Exp", t), b.input("w", (3, 2))))
    g = b.build()
    c = assert_keeps_answer(g)
    assert str(c.eqns[0].params["body"]) == "Transpose[(1, 0)](Unary[Tanh](x0))"
    # (the Exp inside the matmul's prologue: passes.linear_fuse)
    assert sum(t in e.inputs for e in c.eqns) == 2 and len(c.eqns) == 3


def test_a_concat_of_computed_operands_picks_by_the_index():
    b = Builder()
    x, y = b.input("x", (3, 2)), b.input("y", (3, 5))
    z = b.concat([b.unary("Exp", x), b.mul(y, 2.0), b.unary("Neg", x)], axis=1)
    b.export("z", b.add(z, 1.0))
    g = b.build()
    c = assert_keeps_answer(g)
    assert [e.prim for e in c.eqns] == [FUSED]


@pytest.mark.parametrize("why", ["export", "read_twice"])
def test_moves_that_must_not_fuse(why):
    """A computed slice that is exported, or read by two kernels (an elementwise one and a
    matmul), is stored."""
    b = Builder()
    x = b.input("x", (4, 6))
    s = b.slice(b.unary("Tanh", x), (0, 2), (4, 6))
    if why == "export":
        b.export("s", s)
        b.export("y", b.mul(s, 3.0))
    else:
        b.export("m", b.matmul(s, b.input("w", (4, 2))))
        b.export("y", b.mul(s, 3.0))
    g = b.build()
    c = assert_keeps_answer(g)
    assert s in {o for e in c.eqns for o in e.outputs}


def test_reductions_read_through_moves_but_not_their_own_result_moved():
    """Sum(slice(tanh x)^2) is one FusedReduce and an RMSNorm of a gathered row one
    FusedRow; a row chain that transposes the reduction itself (each element would need
    another row's sum) keeps the reduction stored."""
    b = Builder()
    x = b.input("x", (4, 6))
    s = b.slice(b.unary("Tanh", x), (0, 2), (4, 6))
    b.export("y", b.reduce("Sum", b.mul(s, s), 1))
    g = b.build()
    c = assert_keeps_answer(g)
    assert [e.prim for e in c.eqns] == [FUSED_REDUCE] and c.eqns[0].params["body"].moves
    b = Builder()
    row = b.gather(b.param("table", (10, 8)), b.input("ids", (3,), I32))
    b.export("y", rms_norm(b, row, b.param("w", (8,))))
    g = b.build()
    c = assert_keeps_answer(g)
    assert [e.prim for e in c.eqns] == [FUSED_ROW]
    b = Builder()
    x = b.input("x", (4, 4))
    b.export("y", b.transpose(b.div(x, b.reduce("Sum", x, 1)), (1, 0)))
    g = b.build()
    c = assert_keeps_answer(g)
    assert c.count(FUSED_ROW) == 0 and c.count(P.REDUCE) == 1
    assert moves_reduced(FusedBody((
        Node.operand(0, (4, 4), F32), Node.reduced((4, 1), F32),
        Node(P.DIV, (0, 1), Params(), (4, 4), F32),
        Node(P.TRANSPOSE, (2,), Params(perm=(1, 0)), (4, 4), F32))))


def test_moved_bodies_are_typed():
    x = Var((2, 6), F32)
    n0 = Node.operand(0, (2, 6), F32)
    sl = Node(P.SLICE, (0,), Params(start=(0, 2), limit=(2, 6)), (2, 4), F32)
    assert type_body(FusedBody((n0, sl)), [x], moves=True) == ((2, 4), F32)
    with pytest.raises(ShapeError):
        type_body(FusedBody((n0, sl)), [x])  # a reduction's body: no moves
    bad = Node(P.SLICE, (0,), Params(start=(0, 2), limit=(2, 6)), (2, 3), F32)
    with pytest.raises(ShapeError):
        type_body(FusedBody((n0, bad)), [x], moves=True)


def dus_graph(kv=F32, state_rows=6, start=None, gate=False):
    """s[0, :, p] = rope(x * 2) (as F16 for an F16 state): a state write of a body."""
    b = Builder()
    s = b.state("s", (1, 2, state_rows, 8), kv)
    x = b.input("x", (1, 2, 1, 8))
    cos, sin = b.input("cos", (1, 1, 1, 8)), b.input("sin", (1, 1, 1, 8))
    p = b.input("p", (), I32) if start is None else start(b)
    u = rope(b, b.mul(x, 2.0), cos, sin)
    if kv is not F32:
        u = b.convert(u, kv)
    new = b.dynamic_update_slice(s, u, (0, 0, p, 0))
    b.set_state("s", new)
    if gate:
        b.export("n2", b.index_guard(b.input("n", (1,), I32), 1, 8, "n_ok"))
    b.export("y", b.reduce("Sum", b.convert(new, F32) if kv is not F32 else new, 2))
    return b.build()


@pytest.mark.parametrize("kv", [F32, F16])
def test_a_state_write_computes_its_update_in_place(kv):
    """The rotation (and the F16 narrowing) is computed by the write itself: one
    FusedUpdate kernel, no Slice, Concat, Convert or DynamicUpdateSlice kernel; starts
    outside the state clamp exactly as DynamicUpdateSlice's do."""
    g = dus_graph(kv)
    c = compile_graph(g)
    (upd,) = [e for e in c.eqns if e.prim is FUSED_UPDATE]
    state, ops, starts, gates = update_parts(upd.prim, upd.inputs, upd.params)
    assert state is g.slot("s").var and not gates and upd.params["body"].moves
    assert c.count(P.DYNAMIC_UPDATE_SLICE) == c.count(P.SLICE) == c.count(P.CONCAT) == 0
    labels = kernels(c)
    assert labels.count("fused update") == 1 and "Convert" not in labels[:1]
    for p in (-3, 0, 2, 5, 6, 100):  # 6 and 100 clamp to row 5, -3 to row 0
        ins = random_inputs(g, np.random.default_rng(p + 10))
        ins["p"] = np.int32(p)
        want, got = evaluate(g, ins), evaluate(c, ins)
        assert same(want, got)
        row = min(max(p, 0), 5)
        assert not np.array_equal(got["s"][0, :, row], ins["s"][0, :, row])


def test_a_gated_state_write_keeps_its_gates_when_fused():
    g = dus_graph(gate=True)
    c = compile_graph(g)
    (upd,) = [e for e in c.eqns if e.prim is FUSED_UPDATE]
    assert update_parts(upd.prim, upd.inputs, upd.params)[3] == (g.validations["n_ok"],)
    plan_graph(c, LAVAPIPE)  # the planner's gate and state-order checks accept it
    ref = gate_state_writes(canonicalize(g))  # the same gating over the primitive chain
    ins = random_inputs(g, np.random.default_rng(1))
    ins["p"], ins["n"] = np.int32(1), np.array([0], np.int32)  # the guard fails
    out = evaluate(c, ins)
    assert same(evaluate(ref, ins), out) and np.array_equal(out["s"], ins["s"])
    ins["n"] = np.array([3], np.int32)
    out = evaluate(c, ins)
    assert same(evaluate(ref, ins), out) and not np.array_equal(out["s"], ins["s"])
    assert str(gate_state_writes(c)) == str(c)  # regating a fused write changes nothing


@pytest.mark.parametrize("view", [False, True])
def test_an_update_reading_the_state_it_overwrites_is_not_fused(view):
    """u = 2 * s[0, :, 0:1] (or of a reshaped view of s) written over s: computing u inside
    the write would read rows the same kernel writes; u is stored first."""
    b = Builder()
    s = b.state("s", (1, 2, 4, 8))
    if view:  # the leaf is a view of s: [2, 4, 8] (a Reshape runs no kernel)
        u = b.broadcast(b.mul(b.slice(b.reshape(s, (2, 4, 8)), (0, 0, 0), (2, 1, 8)), 2.0),
                        (1, 2, 1, 8))
    else:
        u = b.mul(b.slice(s, (0, 0, 0, 0), (1, 2, 1, 8)), 2.0)
    b.set_state("s", b.dynamic_update_slice(s, u, (0, 0, b.pos("p", 0, 3), 0)))
    g = b.build()
    c = assert_keeps_answer(g)
    assert c.count(FUSED_UPDATE) == 0 and c.count(P.DYNAMIC_UPDATE_SLICE) == 1
    assert c.count(P.RESHAPE) == (1 if view else 0)
    plan_graph(c, LAVAPIPE)


def test_smollm2_decode_plan_has_three_rope_and_cache_kernels_per_layer():
    """SmolLM2's shapes, two layers: no Slice or Concat kernel; per layer the q
    rotation is one Fused kernel, k's rotation is computed by its cache write (a
    FusedUpdate), v's write is one kernel (v's slice of the packed q/k/v output read by
    it); with F16 caches the narrowing fuses into both writes, in prefill v's head
    transpose does. Listed ungrouped (``group=False``): in the plan the three share one
    launch (plan.group)."""
    from pootvk.llm.model import SMOLLM2_135M, trace_llama, trace_prefill

    h200 = recorded_profile("nvidia_h200")
    for kv in ("float32", "float16"):
        cfg = dataclasses.replace(SMOLLM2_135M, layers=2, vocab=1024, kv_dtype=kv)
        for g in (trace_llama(cfg), trace_prefill(cfg, 16)):
            labels = [k.label for k in plan_graph(compile_graph(g), h200, group=False).kernels]
            decode = g.slot("pos").range[1] == cfg.capacity - 1
            assert not {"Slice", "Concat"} & set(labels), labels
            # only the attention output's head transpose, read by the o projection (prefill)
            assert labels.count("Transpose") == (0 if decode else cfg.layers)
            writes = labels.count("fused update") + labels.count("DynamicUpdateSlice")
            assert writes == 2 * cfg.layers
            assert labels.count("fused update") == 2 * cfg.layers
            # no Gather or Convert kernel: the embedding row's gather and widening are one
            # kernel, the RoPE rows are read through by every rotation
            assert not {"Gather", "Convert"} & set(labels), labels
        if kv == "float32":
            # 30 after fuse; the norms, SwiGLU products and residual adds then run inside
            # the Linears (passes.linear_fuse): 19; the rotation and the two writes of a
            # layer share a launch, so do the live length's add and the embedding row: 14
            # (8 and 6 a layer)
            c = compile_graph(trace_llama(cfg))
            assert len(plan_graph(c, h200, group=False).kernels) == 19
            grouped = plan_graph(c, h200).kernels
            assert len(grouped) == 14 and [k.label for k in grouped].count("group") == 3
