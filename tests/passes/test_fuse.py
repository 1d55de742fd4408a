"""The fusion pass: what merges, what must not, and that the oracle's answer is kept bit for
bit (on the chains fusion is for and on random elementwise graphs)."""

import numpy as np
import pytest
from hypothesis import given, settings

from pootvk.errors import ShapeError
from pootvk.ir import F16, F32, Params, Var, check_graph
from pootvk.ir import prims as P
from pootvk.ir.fused import (
    ELEMENTWISE,
    FUSED,
    FUSED_REDUCE,
    FUSED_ROW,
    MOVES,
    FusedBody,
    Node,
    type_body,
)
from pootvk.ops import Builder, trace_decode_step
from pootvk.oracle import evaluate
from pootvk.passes import canonicalize, compile_graph, fuse
from pootvk.passes.fuse import LONG_ROW
from pootvk.plan import plan_graph, recorded_profile
from tests.helpers import random_inputs
from tests.random_graphs import elementwise_graphs, rms_norm, swiglu

LAVAPIPE = recorded_profile("lavapipe")
MERGING = (FUSED, *ELEMENTWISE, *MOVES)


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k], equal_nan=True) for k in a
    )


def kernels(g):
    """The kernels' labels, one per planned kernel (ungrouped: ``plan.group`` would merge a
    level's elementwise launches)."""
    return [k.label for k in plan_graph(g, LAVAPIPE, group=False).kernels]


def assert_keeps_answer(g, seeds=(0, 1)):
    c = compile_graph(g)
    for s in seeds:
        ins = random_inputs(g, np.random.default_rng(s))
        assert same(evaluate(g, ins), evaluate(c, ins))
    return c


def rms_graph(dtype=F32, rows=3, hidden=16):
    b = Builder()
    x = b.input("x", (rows, hidden), dtype)
    w = b.param("w", (hidden,), dtype)
    if dtype is not F32:
        x, w = b.convert(x, F32), b.convert(w, F32)
    y = rms_norm(b, x, w)
    b.export("y", y if dtype is F32 else b.convert(y, dtype))
    return b.build()


def test_rms_norm_is_one_kernel():
    """The sum of squares computed on load, the scale per element of the same row: the
    square, the sum and the row's scale factor are never stored."""
    g = rms_graph()
    assert len(kernels(canonicalize(g))) == 7
    c = assert_keeps_answer(g)
    (row,) = c.eqns
    assert row.prim is FUSED_ROW and row.inputs == (g.slots[0].var, g.slots[1].var)
    assert str(row.params["body"]) == "Mul(x0, x0)"
    epilogue = "Mul(Mul(x0, Unary[Rsqrt](Add(Mul(r, 0.0625), 1e-05))), x1)"
    assert str(row.params["epilogue"]) == epilogue
    assert kernels(c) == ["fused row"]


def test_rms_norm_16bit_storage_fuses_its_single_use_converts():
    """The widened x is read twice (the square and the scale): it stays one Convert, stored
    once; w's Convert and the narrowing of y fuse into the row kernel."""
    g = rms_graph(F16)
    c = assert_keeps_answer(g)
    assert [e.prim for e in c.eqns] == [P.CONVERT, FUSED_ROW]
    cv, row = c.eqns
    assert cv.inputs == (g.slots[0].var,) and row.out.dtype is F16
    assert {v.dtype for v in row.inputs} == {F32, F16}  # w read as 16-bit


def test_softmax_is_two_row_kernels():
    """max and exp(s - max) in one row kernel; ex is read twice (sum and divide), so it is
    stored once, and the sum and the division are the second row kernel."""
    b = Builder()
    s = b.input("s", (4, 9))
    m = b.reduce("Max", s, 1)
    ex = b.unary("Exp", b.sub(s, m))
    b.export("p", b.div(ex, b.reduce("Sum", ex, 1)))
    g = b.build()
    c = assert_keeps_answer(g)
    assert [e.prim for e in c.eqns] == [FUSED_ROW, FUSED_ROW]
    assert str(c.eqns[0].params["epilogue"]) == "Unary[Exp](Sub(x0, r))"
    assert str(c.eqns[1].params["epilogue"]) == "Div(x0, r)"


@pytest.mark.parametrize(("rows", "fused"), [(1, False), (63, False), (64, True)])
def test_few_long_rows_keep_the_splitting_reduce(rows, fused):
    """A softmax over fewer than FEW_ROWS rows longer than LONG_ROW keeps its Reduce kernels
    (they split a long row over the device; a fused row is one workgroup: 0.2-0.4x on the
    H200 for one 128256-wide row); from FEW_ROWS rows on it is two row kernels again."""
    b = Builder()
    s = b.input("s", (rows, LONG_ROW + 1))
    m = b.reduce("Max", s, 1)
    ex = b.unary("Exp", b.sub(s, m))
    b.export("p", b.div(ex, b.reduce("Sum", ex, 1)))
    prims = [e.prim for e in compile_graph(b.build()).eqns]
    assert (prims == [FUSED_ROW, FUSED_ROW]) is fused
    assert (prims.count(P.REDUCE) == 2) is not fused


def test_a_reduction_stays_stored_when_observed_read_twice_or_not_row_shaped():
    b = Builder()
    x = b.input("x", (3, 8))
    r1 = b.reduce("Sum", x, 1)
    b.export("r1", r1)  # observed
    b.export("a", b.mul(x, r1))
    r2 = b.reduce("Max", b.unary("Abs", x), 1)
    b.export("b", b.mul(x, r2))
    b.export("b2", b.unary("Exp", r2))  # r2 read by two kernels
    r3 = b.reduce("Sum", b.mul(x, 2.0), 1)
    b.export("c", b.add(r3, 1.0))  # [3,1]: not row-shaped
    g = b.build()
    c = assert_keeps_answer(g)
    assert c.count(FUSED_ROW) == 0
    assert c.count(P.REDUCE) == 1 and c.count(FUSED_REDUCE) == 2


def test_a_reduction_of_a_state_is_not_moved_past_its_in_place_update():
    b = Builder()
    s = b.state("s", (2, 4))
    r = b.reduce("Sum", b.mul(s, s), 1)
    b.set_state("s", b.dynamic_update_slice(s, b.input("u", (1, 4)), [b.pos("p", 0, 1), 0]))
    b.export("y", b.mul(b.input("x", (2, 4)), r))
    g = b.build()
    c = assert_keeps_answer(g)
    plan_graph(c, LAVAPIPE)  # the reduction still reads the old state before the update
    assert c.count(FUSED_ROW) == 0 and c.count(FUSED_REDUCE) == 1


@pytest.mark.parametrize("silu_prim", [True, False])
def test_swiglu_is_one_kernel_after_its_matmuls(silu_prim):
    b = Builder()
    x = b.input("x", (2, 8))
    b.export("y", swiglu(b, x, b.param("wg", (8, 12)), b.param("wu", (8, 12)), silu_prim))
    g = b.build()
    unfused = kernels(canonicalize(g))
    c = assert_keeps_answer(g)
    assert kernels(fuse_free(g, through=True)) == ["MatMul", "MatMul", "fused"]
    assert kernels(c) == ["MatMul", "Linear"]  # then the gate matmul's epilogue
    assert len(unfused) == (4 if silu_prim else 5)


def test_no_fusion_across_an_export_a_state_output_or_a_second_use():
    b = Builder()
    x = b.input("x", (4,))
    s = b.state("s", (4,))
    e = b.exp(x)
    b.export("e", e)  # exported: stays its own eqn
    n = b.unary("Neg", x)
    b.export("m", b.mul(n, 2.0))  # n is read by two kernels: this one and y's
    new_s = b.mul(s, 0.5)
    b.set_state("s", new_s)  # a state output
    b.export("y", b.add(b.add(e, b.mul(n, 3.0)), b.unary("Tanh", new_s)))
    g = b.build()
    c = assert_keeps_answer(g)
    outs = {o for eq in c.eqns for o in eq.outputs}
    assert {e, n, new_s} <= outs  # each still stored
    (last,) = [eq for eq in c.eqns if eq.out is g.exports["y"]]
    assert last.prim is FUSED and set(last.inputs) == {e, n, new_s}
    assert str(last.params["body"]) == "Add(Add(x0, Mul(x1, 3.0)), Unary[Tanh](x2))"


def test_a_value_read_twice_inside_one_body_is_computed_once():
    """n is read by two eqns that both merge into y's body: the next round merges n too,
    as one node both reads share (nothing is computed twice, nothing stored)."""
    b = Builder()
    x = b.input("x", (4,))
    n = b.unary("Neg", x)
    b.export("y", b.add(b.mul(n, 2.0), b.mul(n, 3.0)))
    g = b.build()
    (y,) = assert_keeps_answer(g).eqns
    body = y.params["body"]
    assert y.inputs == (x,)
    assert str(body) == "Add(Mul(Unary[Neg](x0), 2.0), Mul(Unary[Neg](x0), 3.0))"
    assert sum(1 for nd in body.nodes if nd.op is P.UNARY) == 1  # printed twice, one node


def test_a_merged_read_of_a_state_stays_before_its_in_place_update():
    """y = exp(s) is read only by z, after s is overwritten in place: moving exp(s) to z's
    position would read the new state (the planner refuses that order)."""
    b = Builder()
    s = b.state("s", (4,))
    y = b.exp(s)
    upd = b.dynamic_update_slice(s, b.input("u", (2,)), [b.pos("p", 0, 2)])
    b.set_state("s", upd)
    b.export("z", b.mul(y, 2.0))
    g = b.build()
    c = assert_keeps_answer(g)
    plan_graph(c, LAVAPIPE)  # no "read after its in-place update" refusal
    assert c.count(P.UNARY) == 1 and c.count(P.MUL) == 1  # exp(s) stayed before the update


def test_a_body_never_takes_more_than_seven_buffers():
    b = Builder()
    xs = [b.input(f"x{i}", (3,)) for i in range(10)]
    acc = xs[0]
    for x in xs[1:]:
        acc = b.add(acc, b.unary("Tanh", x))
    b.export("y", acc)
    g = b.build()
    c = assert_keeps_answer(g)
    assert all(len(e.inputs) <= 7 for e in c.eqns)
    assert len(c.eqns) == 2 and all(e.prim is FUSED for e in c.eqns)


def test_fused_bodies_are_typed_and_checked():
    x = Var((2, 3), F32)
    n0 = Node.operand(0, (2, 3), F32)
    good = FusedBody((n0, Node(P.UNARY, (0,), Params(op=P.UnaryOp.EXP), (2, 3), F32)))
    assert type_body(good, [x]) == ((2, 3), F32)
    for bad in (
        FusedBody((n0, Node(P.UNARY, (0,), Params(op=P.UnaryOp.EXP), (3,), F32))),  # shape
        FusedBody((n0, Node(P.MATMUL, (0, 0), Params(), (2, 2), F32))),  # not elementwise
        FusedBody((n0, Node(P.UNARY, (1,), Params(op=P.UnaryOp.EXP), (2, 3), F32))),  # order
        FusedBody((Node.operand(0, (2, 3), F16),)),  # leaf type differs from its operand
    ):
        with pytest.raises(ShapeError):
            type_body(bad, [x])
    with pytest.raises(ShapeError):
        type_body(good, [x, x])  # an operand no leaf reads


def test_signed_zero_literals_are_different_bodies():
    def body(z):
        return FusedBody((Node.operand(0, (), F32), Node.literal(z, F32),
                          Node(P.MAX, (0, 1), Params(), (), F32)))
    assert body(0.0) != body(-0.0) and body(0.0) == body(0.0)


def test_fusing_twice_changes_nothing_and_decode_keeps_its_attention():
    g = trace_decode_step(2, 8, 2, 16, 24, softcap=20.0, alibi=True)
    c = compile_graph(g)
    assert c.count(P.ATTENTION) == 1 and c.count(FUSED) == 1
    assert str(fuse(c)) == str(c)
    for pos in (0, 5):
        ins = random_inputs(g, np.random.default_rng(pos), pos=pos)
        assert same(evaluate(g, ins), evaluate(c, ins))


@settings(max_examples=30, deadline=None)
@given(g=elementwise_graphs())
def test_fusion_keeps_the_oracle_answer_on_random_graphs(g):
    c = compile_graph(g)
    check_graph(c)
    assert len(c.eqns) <= len(canonicalize(g).eqns)
    ins = random_inputs(g, np.random.default_rng(0))
    assert same(evaluate(g, ins), evaluate(c, ins))
    info = c.use_info()
    for e in c.eqns:  # nothing fusable is left unfused
        if e.prim in MERGING:
            users = set(info.users.get(e.out, []))
            if e.out not in info.observed and len(users) == 1:
                assert c.eqns[users.pop()].prim not in {*MERGING, P.REDUCE}, str(c)
    plan_graph(c, LAVAPIPE.with_(extra={"storage_buffer_16bit": True}))


# --- the simplification passes issue 9 asks for next to fusion -------------------------------


def test_an_iota_is_a_folded_constant_and_layers_share_one_mask():
    b = Builder()
    pos = b.pos("pos", 0, 15)
    x = b.input("x", (1, 16))
    for _ in range(4):  # four layers, each tracing its own causal mask
        keys = b.iota((1, 16), 1)
        mask = b.select(b.compare("Le", keys, pos), 0.0, float("-inf"))
        x = b.add(b.unary("Tanh", x), mask)
    b.export("y", x)
    g = b.build()
    assert g.count(P.IOTA) == 4 and g.count(P.COMPARE) == 4
    c = compile_graph(g)
    assert c.count(P.IOTA) == 0 and len(c.constants) == 1  # one Iota, folded
    (iota,) = c.constants.values()
    np.testing.assert_array_equal(iota, np.arange(16, dtype=np.int32)[None])
    masks = [e for e in c.eqns if "Compare" in str(e.params.get("body", ""))]
    assert len(masks) == 1  # CSE: one mask for the four layers
    for p in (0, 9):
        ins = random_inputs(g, np.random.default_rng(p), pos=p)
        assert same(evaluate(g, ins), evaluate(c, ins))


def test_the_llama_test_model_runs_every_norm_as_one_row_kernel():
    """Every RMSNorm (two per layer and the final one) is one FusedRow and every SwiGLU
    product one Fused kernel; no Reduce and no Unary kernel is left, and the oracle's
    answer is kept bit for bit."""
    from pootvk.llm import LlamaConfig, trace_llama

    layers = 2
    g = trace_llama(LlamaConfig(layers=layers, q_heads=2, kv_heads=1, head_dim=8, hidden=16,
                                intermediate=32, vocab=10, capacity=8))
    c = fuse_free(g, through=True)
    assert c.count(FUSED_ROW) == 2 * layers + 1
    assert c.count(P.REDUCE) == c.count(FUSED_REDUCE) == c.count(P.UNARY) == 0
    silu = [e for e in c.eqns if e.prim is FUSED and "Silu" in str(e.params["body"])]
    assert len(silu) == layers
    before = len(plan_graph(fuse_free(g), LAVAPIPE).kernels)
    assert len(plan_graph(c, LAVAPIPE).kernels) <= before - 10 * layers
    for p in (0, 3):
        ins = random_inputs(g, np.random.default_rng(p), pos=p)
        want, got = evaluate(g, ins), evaluate(c, ins)
        # the live length's guards are proven by the pos range and elided by the compile
        assert set(want) - set(got) == set(g.validations)
        assert same({k: want[k] for k in got}, got)


def fuse_free(g, through: bool = False):
    """The compile pipeline up to fuse (without it; with ``through``, fuse included: the
    Linear fusion after it takes some of its bodies into the matmul kernels)."""
    from pootvk.passes import PASSES

    for p in PASSES[:PASSES.index(fuse) + through]:
        g = p(g)
    return g
