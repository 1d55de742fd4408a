"""The Linear fusion pass (``passes.linear_fuse``): what becomes a Linear's prologue or
epilogue, what must not, that the oracle keeps the unfused chain's answer bit for bit, and
that the SmolLM2-shaped decode plan has no norm, SwiGLU or residual kernel left."""

import collections
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings

from pootvk.errors import ShapeError
from pootvk.ir import F16, F32, LinearForm, check_graph, new_eqn
from pootvk.ir import prims as P
from pootvk.ir.fused import FUSED, FUSED_ROW, FusedBody, Node
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.passes import PASSES, compile_graph, linear_fuse
from pootvk.passes.fuse import MAX_OPERANDS
from pootvk.plan import plan_graph, recorded_profile, recorded_profiles
from tests.helpers import random_inputs
from tests.passes.test_fuse import same
from tests.random_graphs import rms_norm
from tests.vk.test_vk_linear_fuse import block, linear_chains

H200 = recorded_profile("nvidia_h200")


def without_linear_fuse(g):
    assert PASSES[-1] is linear_fuse
    for p in PASSES[:-1]:
        g = p(g)
    return g


def assert_keeps_answer(g, seeds=(0, 1)):
    """Compiled with and without the Linear fusion: the same oracle answer, bit for bit."""
    c, u = compile_graph(g), without_linear_fuse(g)
    for s in seeds:
        ins = random_inputs(g, np.random.default_rng(s))
        assert same(evaluate(u, ins), evaluate(c, ins))
        assert same(evaluate(g, ins), evaluate(c, ins))
    return c, u


def forms(g):
    return [e.params["form"] for e in g.eqns if e.prim is P.LINEAR]


@pytest.mark.parametrize("dt", [F32, F16], ids=lambda d: d.value)
@pytest.mark.parametrize("transpose", [True, False], ids=["nk", "kn"])
def test_norm_prologue_and_residual_epilogue_keep_the_answer(dt, transpose):
    c, u = assert_keeps_answer(block(3, 24, 16, dt, transpose))
    assert u.count(FUSED_ROW) == 1 and u.count(P.ADD) == 1
    (lin,) = c.eqns  # RMSNorm, the matmul and the residual: one eqn
    (form,) = forms(c)
    assert form.prologue.row is not None and form.epilogue is not None
    assert len(lin.inputs) == 4  # x, the norm weight; W; the residual
    assert "a=Mul(Mul(x0, Unary[Rsqrt]" in str(c) and "y=Add(x0, r)" in str(c)


def test_swiglu_prologue_and_16bit_leaves_keep_the_answer():
    for g in (block(2, 16, 8, F16, glu=True), block(2, 16, 8, F16, norm=False, x16=True,
                                                     y16=True)):
        c, _ = assert_keeps_answer(g)
        assert c.count(FUSED) == c.count(FUSED_ROW) == c.count(P.CONVERT) == 0
    assert forms(c)[0].epilogue.out.dtype is F16


def test_many_rows_get_an_epilogue_but_no_prologue():
    """Past GEMV_MAX_ROWS the matmul is a GEMM: the norm stays its kernel; SwiGLU becomes
    the gate projection's epilogue (no prologue for the down projection)."""
    c, _ = assert_keeps_answer(block(12, 16, 8, F16, glu=True))
    assert c.count(FUSED_ROW) == 1 and c.count(FUSED) == 0
    assert [f.prologue for f in forms(c)] == [None] * 3
    assert sum(f.epilogue is not None for f in forms(c)) == 2  # SwiGLU, the residual


def test_a_norm_read_by_two_linears_is_recomputed_in_both():
    b = Builder()
    x = b.input("x", (1, 16))
    a = rms_norm(b, x, b.param("g", (16,)))
    for name in ("p", "q"):
        b.export(name, b.matmul(a, b.param("w" + name, (16, 8))))
    c, _ = assert_keeps_answer(b.build())
    assert c.count(FUSED_ROW) == 0 and [f.prologue is not None for f in forms(c)] == [True] * 2


def test_chains_the_pass_cannot_prove_keep_their_kernels():
    """A producer also read by a non-Linear eqn, a matmul output also exported, a consumer
    that broadcasts the output up: nothing merges, the answer is the same."""
    b = Builder()
    x = b.input("x", (1, 16))
    a = rms_norm(b, x, b.param("g", (16,)))
    y = b.matmul(a, b.param("w", (16, 8)))
    b.export("s", b.add(a, 1.0))  # a second reader of the norm: not a Linear
    b.export("y", y)
    b.export("z", b.add(y, b.input("r", (1, 8))))  # y observable: no epilogue
    y2 = b.matmul(b.mul(x, 3.0), b.param("w2", (16, 8)))
    b.export("t", b.add(y2, b.input("r2", (4, 1, 8))))  # [4,1,8]: not y2's shape
    g = b.build()
    c, u = assert_keeps_answer(g)
    assert len(c.eqns) == len(u.eqns) - 1  # only x * 3 became a prologue
    assert c.count(FUSED_ROW) == 1 and c.count(P.ADD) == 3
    assert sum(f.prologue is not None for f in forms(c)) == 1
    assert all(f.epilogue is None for f in forms(c))
    labels = collections.Counter(k.label for k in plan_graph(c, H200).kernels)
    assert labels["fused row"] == 1 and labels["Add"] == 3


def test_a_prologue_is_not_moved_past_an_in_place_update_of_a_state_it_reads():
    b = Builder()
    s = b.state("s", (1, 8))
    a = b.mul(s, 2.0)
    b.set_state("s", b.dynamic_update_slice(s, b.input("u", (1, 4)), [0, b.pos("p", 0, 4)]))
    b.export("y", b.matmul(a, b.param("w", (8, 4))))
    c, _ = assert_keeps_answer(b.build())
    assert all(f.prologue is None for f in forms(c))


def test_operand_limit():
    """An epilogue that would read more than MAX_OPERANDS buffers stays its own kernel."""
    b = Builder()
    y = b.matmul(b.input("x", (1, 8)), b.param("w", (8, 4)))
    extra = [b.input(f"r{i}", (1, 4)) for i in range(MAX_OPERANDS)]
    acc = y
    for r in extra:
        acc = b.add(acc, r)
    b.export("y", acc)
    c, _ = assert_keeps_answer(b.build())
    assert c.count(FUSED) == 1 and all(f.epilogue is None for f in forms(c))


def test_the_shape_rule_types_the_bodies():
    b = Builder()
    x, w, r = b.input("x", (2, 8)), b.param("w", (4, 8), F16), b.input("r", (2, 4))
    epi = FusedBody((Node.operand(0, (2, 4), F32), Node.reduced((2, 4), F32),
                     Node(P.ADD, (0, 1), P.Params(), (2, 4), F32)))
    form = LinearForm(True, F16, epilogue=epi)
    (e,) = [new_eqn(P.LINEAR, [x, w, r], form=form)]
    assert e.out.shape == (2, 4) and e.out.dtype is F32
    with pytest.raises(ShapeError, match="extra operands"):
        new_eqn(P.LINEAR, [x, w, r], form=LinearForm(True, F16))
    with pytest.raises(ShapeError):  # the extra operand is not the output's shape
        new_eqn(P.LINEAR, [x, w, b.input("r1", (2, 3))], form=form)
    bad = FusedBody((Node.reduced((2, 4), F32), Node(P.UNARY, (0,), P.Params(op=P.UnaryOp.EXP),
                                                      (2, 4), F32)))
    with pytest.raises(ShapeError, match="reads operands"):
        new_eqn(P.LINEAR, [x, w, r], form=LinearForm(True, F16, epilogue=bad))


def test_smollm2_decode_plan_has_no_elementwise_kernel_between_linears():
    """The 2-layer SmolLM2-shaped decode plan on the H200 profile: every RMSNorm, SwiGLU and
    residual Add is inside a Linear (5 fused rows, 4 residual adds, 2 SwiGLU products
    before: 30 kernels -> 19, listed ungrouped); the oracle's answer is kept bit for bit."""
    from pootvk.llm.model import SMOLLM2_135M, trace_llama

    cfg = dataclasses.replace(SMOLLM2_135M, layers=2, vocab=1024, capacity=64)
    g = trace_llama(cfg)
    c, u = compile_graph(g), without_linear_fuse(g)
    before = collections.Counter(k.label for k in plan_graph(u, H200, group=False).kernels)
    after = collections.Counter(k.label for k in plan_graph(c, H200, group=False).kernels)
    assert before["fused row"] == 5 and before["Add"] == 5
    assert after["fused row"] == 0 and after["Add"] == 1  # the live length's i32 add
    assert before["fused"] - after["fused"] == 2  # the SwiGLU products
    assert after["Linear"] == before["Linear"] == 9  # qkv, o, gate|up, down; the LM head
    assert sum(after.values()) == sum(before.values()) - 11
    check_graph(c)
    ins = random_inputs(g, np.random.default_rng(0), pos=5)
    want, got = evaluate(u, ins), evaluate(c, ins)
    assert same(want, got)


def test_a_prologue_keeps_a_gpu_gemv_n_unsplit():
    """4096x14336 F16 W[K, N] on the H200 is a split-K GEMV_N (plan.matmul_schedule); with
    a norm prologue, which reduces whole rows of K per workgroup, it runs unsplit."""
    for norm in (False, True):
        b = Builder()
        x = b.input("x", (1, 4096))
        a = rms_norm(b, x, b.param("g", (4096,))) if norm else x
        w = b.convert(b.param("w", (4096, 14336), F16), F32)
        b.export("y", b.matmul(a, w))
        (k, *rest) = plan_graph(compile_graph(b.build()), H200).kernels
        assert (k.request.splits == 1) is norm and (k.request.prologue is not None) is norm
        assert len(rest) == (0 if norm else 1)  # the combine


@settings(max_examples=40, deadline=None)
@given(g=linear_chains())
def test_random_chains_keep_the_answer_bit_for_bit(g):
    assert_keeps_answer(g)


@pytest.mark.parametrize("prof", list(recorded_profiles().values()), ids=lambda p: p.name)
def test_fused_linear_kernels_compile_within_each_profiles_workgroup_memory(prof):
    """The SmolLM2-shaped decode (1 row) and an 8-row prefill bucket on every recorded
    profile (subgroups of 8..64 lanes, or none): each fused Linear kernel compiles and its
    workgroup memory (row-prologue partials + the GEMV fold) fits the profile."""
    from pootvk.llm.model import SMOLLM2_135M, trace_llama, trace_prefill
    from pootvk.shaders.compiler import compile_glsl
    from pootvk.shaders.generate import generate
    from tests.shaders.test_shared_memory import workgroup_bytes

    wdt = "float16" if prof.extra.get("storage_buffer_16bit") else "float32"
    cfg = dataclasses.replace(SMOLLM2_135M, layers=1, vocab=1024, capacity=64,
                              weight_dtype=wdt)
    seen = set()
    for g in (trace_llama(cfg), trace_prefill(cfg, 8)):
        for k in plan_graph(compile_graph(g), prof).kernels:
            r = k.request
            if getattr(r, "prologue", None) is None and getattr(r, "epilogue", None) is None:
                continue
            src = generate(r)
            if src in seen:
                continue
            seen.add(src)
            assert workgroup_bytes(compile_glsl(src)) <= prof.max_workgroup_memory
    assert len(seen) >= 5


def test_prologues_are_planned_on_gpus_only():
    """runtime.linear_prologues: a CPU device (lavapipe) keeps a GEMV's input producers as
    kernels (each workgroup's recomputation costs it cycles), a GPU folds them;
    POOTVK_LINEAR_PROLOGUES overrides either way."""
    from pootvk.config import Config
    from pootvk.plan import recorded_profile
    from pootvk.runtime import linear_prologues

    cpu, gpu = recorded_profile("lavapipe"), recorded_profile("nvidia_h200")
    auto = Config.from_env({})
    assert auto.linear_prologues is None
    assert not linear_prologues(cpu, auto) and linear_prologues(gpu, auto)
    on = Config.from_env({"POOTVK_LINEAR_PROLOGUES": "1"})
    off = Config.from_env({"POOTVK_LINEAR_PROLOGUES": "0"})
    assert linear_prologues(cpu, on) and not linear_prologues(gpu, off)
    # without prologues the norms stay kernels, the residual epilogues still fold
    from pootvk.llm.model import SMOLLM2_135M, trace_llama

    cfg = dataclasses.replace(SMOLLM2_135M, layers=2, vocab=1024)
    with_p = compile_graph(trace_llama(cfg))
    without = compile_graph(trace_llama(cfg), linear_prologues=False)
    def count(g, prim):
        return sum(e.prim is prim for e in g.eqns)

    assert count(with_p, FUSED_ROW) == 0 and count(without, FUSED_ROW) == 2 * 2 + 1
    assert count(with_p, P.ADD) == count(without, P.ADD)  # residual adds folded in both
