"""Linears with a prologue and an epilogue (``passes.linear_fuse``) on the live device
(lavapipe in CI) against the oracle of the same graph unfused: RMSNorm, SwiGLU and a 16-bit
elementwise producer computed on A's loads of GEMV_T and GEMV_N (subgroup and shared-memory
reductions, several rows), a residual Add (and a 16-bit store) in the epilogue of GEMV_T,
GEMV_N, GEMM and split-K launches, F32/F16/BF16 weights."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pootvk.ir import BF16, F16, F32, DType
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.passes import canonicalize, compile_graph
from pootvk.plan import MatMulCombineRequest, MatMulRequest, forced_matmul
from pootvk.runtime import build_replay
from tests.helpers import assert_close, examples, random_inputs
from tests.random_graphs import rms_norm


@pytest.fixture(autouse=True)
def prologues_everywhere(device, monkeypatch):
    """The prologue kernels run here on every device: lavapipe plans none by default
    (``runtime.linear_prologues``: a CPU pays the recomputation), so CI would never run them."""
    monkeypatch.setattr(device, "config", replace(device.config, linear_prologues=True))

TOL = 1e-6  # normalised squared error against the unfused oracle (F32 sums over K)


def block(rows: int, k: int, n: int, dt: DType, transpose: bool = True, *, norm: bool = True,
          residual: bool = True, glu: bool = False, packed: bool = False, x16: bool = False,
          y16: bool = False):
    """A Llama-block-shaped chain around one or two Linears: [RMSNorm | x16 -> F32] ->
    x @ W (or SwiGLU of two) -> [+ residual] -> [Convert to F16]."""
    b = Builder()
    x = b.input("x", (rows, k), F16 if x16 else F32)
    xf = b.convert(x, F32) if x16 else x
    a = rms_norm(b, xf, b.param("g", (k,))) if norm else (b.mul(xf, 2.0) if x16 else xf)

    def lin(v, name, kk, nn):
        w = b.param(name, (nn, kk) if transpose else (kk, nn), dt)
        wf = w if dt is F32 else b.convert(w, F32)
        return b.matmul(v, b.transpose(wf, (1, 0)) if transpose else wf)

    if glu and packed:  # gate|up as one Linear, the halves sliced apart (llm.model's form)
        gu = lin(a, "wgu", k, 4 * n)
        h = b.mul(b.silu(b.slice(gu, (0, 0), (rows, 2 * n))),
                  b.slice(gu, (0, 2 * n), (rows, 4 * n)))
        y = lin(h, "wd", 2 * n, n)
    elif glu:  # silu(a @ Wg) * (a @ Wu) -> @ Wd: the product is the down Linear's prologue
        h = b.mul(b.silu(lin(a, "wg", k, 2 * n)), lin(a, "wu", k, 2 * n))
        y = lin(h, "wd", 2 * n, n)
    else:
        y = lin(a, "w", k, n)
    if residual:
        y = b.add(b.input("r", (rows, n)), y)
    b.export("y", b.convert(y, F16) if y16 else y)
    return b.build()


def check(device, g, kind=None, seed=0, **fields):
    """Run the compiled graph; compare with the oracle of the unfused graph. Returns the
    plan's kernel requests."""
    ins = random_inputs(g, np.random.default_rng(seed))
    want = evaluate(canonicalize(g), ins)
    with forced_matmul(kind, **fields), build_replay(g, device) as rp:
        reqs = [k.request for k in rp.plan.kernels]
        rp.set_params({s.name: ins[s.name] for s in g.slots if s.kind.value == "param"})
        got = rp.step({s.name: ins[s.name] for s in g.slots if s.kind.per_step})
    for name in want:
        assert_close(got[name].astype(np.float32), want[name].astype(np.float32), TOL)
    return reqs


def linears(reqs):
    return [r for r in reqs if isinstance(r, MatMulRequest)]


@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=lambda d: d.value)
@pytest.mark.parametrize("transpose", [True, False], ids=["gemv_t", "gemv_n"])
def test_rms_norm_prologue_and_residual_epilogue_are_one_kernel(device, dt, transpose):
    g = block(1, 72, 40, dt, transpose)
    reqs = check(device, g)
    assert len(reqs) == 1, [r.describe() for r in reqs]
    (r,) = linears(reqs)
    assert r.prologue is not None and r.prologue.row is not None and r.epilogue is not None


@pytest.mark.parametrize("rows", [3, 8])
def test_prologue_over_several_rows(device, rows):
    g = block(rows, 96, 24, F16)
    (r,) = linears(check(device, g))
    assert r.m == rows and r.prologue is not None


@pytest.mark.parametrize("subgroup", [True, False])
@pytest.mark.parametrize("transpose", [True, False], ids=["gemv_t", "gemv_n"])
def test_prologue_reduction_with_and_without_shuffles(device, transpose, subgroup):
    """The row reduction over the workgroup: shuffles then a tree, or a tree of all lanes
    (forced: lanes/groups change the workgroup the reduction spans)."""
    g = block(2, 200, 48, F32, transpose)
    kind = "gemv_t" if transpose else "gemv_n"
    fields = {"lanes": 8, "groups": 4} if transpose else {"lanes": 4, "groups": 16}
    check(device, g, kind, subgroup=subgroup, **fields)


@pytest.mark.parametrize("transpose", [True, False], ids=["gemv_t", "gemv_n"])
def test_swiglu_is_the_down_projections_prologue(device, transpose):
    g = block(1, 64, 32, F16, transpose, glu=True)
    reqs = check(device, g)
    assert [type(r) for r in reqs] == [MatMulRequest] * 3, [r.describe() for r in reqs]
    down = reqs[-1]
    assert down.prologue is not None and down.prologue.row is None
    assert down.epilogue is not None


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("transpose", [True, False], ids=["gemv_t", "gemv_n"])
def test_swiglu_over_the_halves_of_one_packed_linear(device, transpose, rows):
    """gate|up as one Linear whose output's two halves are sliced apart: the down
    projection's prologue reads both halves of it through the slices (an index-moving
    body), so the step is two kernels."""
    g = block(rows, 64, 32, F16, transpose, glu=True, packed=True)
    reqs = check(device, g)
    assert [type(r) for r in reqs] == [MatMulRequest] * 2, [r.describe() for r in reqs]
    down = reqs[-1]
    assert down.prologue is not None and down.prologue.body.moves
    assert down.epilogue is not None


def test_16bit_prologue_leaf_and_16bit_epilogue_store(device):
    """A's producer reads F16 x (widened in the kernel); the epilogue ends in a Convert to
    F16, stored rounded."""
    g = block(2, 64, 40, F16, norm=False, x16=True, y16=True)
    (r,) = linears(check(device, g))
    assert r.pro_dtypes == (F16,) and r.out_dtype is F16


def test_gemm_epilogue(device):
    g = block(24, 64, 40, F32, norm=False)
    reqs = check(device, g, "gemm", tile_m=32, tile_n=32, tile_k=8)
    (r,) = reqs
    assert r.epilogue is not None and r.prologue is None


def test_gemm_epilogue_16bit_store(device):
    g = block(24, 64, 40, F32, norm=False, y16=True)
    (r,) = check(device, g, "gemm", tile_m=32, tile_n=32, tile_k=8)
    assert r.epilogue is not None and r.out_dtype is F16


@pytest.mark.parametrize("kind", ["gemm", "gemv_n"])
def test_split_k_epilogue_runs_in_the_combine(device, kind):
    g = block(2 if kind == "gemv_n" else 16, 96, 40, F16, transpose=kind == "gemm",
              norm=False)
    fields = {"tile_m": 32, "tile_n": 32, "tile_k": 8} if kind == "gemm" else {}
    reqs = check(device, g, kind, splits=3, **fields)
    part, comb = reqs
    assert isinstance(comb, MatMulCombineRequest) and comb.partial.epilogue is not None
    assert [b.name for b in comb.bindings()] == ["part", "ye0", "y"]
    assert [b.name for b in part.bindings()] == ["a", "b", "part"]


def test_prefill_gemm_keeps_its_norm_and_fuses_swiglu_and_residual(device):
    """16 rows: a GEMM has no prologue, so RMSNorm stays its own kernel; SwiGLU becomes the
    gate projection's epilogue, the residual the down projection's."""
    g = block(16, 64, 32, F16, glu=True)
    reqs = check(device, g, "gemm", tile_m=32, tile_n=32, tile_k=8)
    c = compile_graph(g)
    assert c.count(P.LINEAR) == 3 and len(c.eqns) == 4, c
    assert sum(isinstance(r, MatMulRequest) for r in reqs) == 3


def test_one_buffer_read_by_the_prologue_and_the_epilogue(device):
    """``x + rmsnorm(x) @ W``: x is a prologue operand and the epilogue's residual."""
    b = Builder()
    x = b.input("x", (1, 48))
    w = b.param("w", (48, 48), F16)
    y = b.matmul(rms_norm(b, x, b.param("g", (48,))), b.transpose(b.convert(w, F32), (1, 0)))
    b.export("y", b.add(x, y))
    g = b.build()
    (r,) = check(device, g)
    assert [bd.name for bd in r.bindings()] == ["pa0", "pa1", "b", "ye0", "y"]
    c = compile_graph(g)
    (lin,) = c.eqns
    assert lin.inputs[0] is lin.inputs[3]  # the same x, bound twice


@pytest.mark.parametrize("kind", ["gemv_n", "gemm"])
def test_batched_weights(device, kind):
    """A batched F32 matmul (weights with a batch dim: per-batch strides, no row folding)
    becomes a Linear with a prologue (GEMV) and an epilogue (both)."""
    rows = 3 if kind == "gemv_n" else 20
    b = Builder()
    x = b.input("x", (2, rows, 16))
    y = b.matmul(b.unary("Tanh", x), b.param("w", (2, 16, 12)))
    b.export("y", b.mul(y, b.input("s", (1, 1, 12))))
    g = b.build()
    fields = {"tile_m": 32, "tile_n": 32, "tile_k": 8} if kind == "gemm" else {}
    (r,) = linears(check(device, g, kind, **fields))
    assert r.batch == (2,) and r.epilogue is not None
    assert (r.prologue is not None) == (kind == "gemv_n")


def test_rank3_rows_fold_through_the_prologue_and_epilogue(device):
    """x[2, 3, K] @ W[K, N]: the batch folds into 6 GEMV rows; the prologue's operands
    broadcast over the leading axes (a [3, K] scale), the epilogue's too ([2, 1, N])."""
    b = Builder()
    x = b.input("x", (2, 3, 40))
    a = b.mul(b.unary("Tanh", x), b.input("s", (3, 40)))
    y = b.matmul(a, b.param("w", (40, 24)))
    b.export("y", b.sub(y, b.input("r", (2, 1, 24))))
    (r,) = check(device, b.build(), "gemv_n")
    assert r.m == 6 and r.batch == () and r.prologue is not None and r.epilogue is not None


@st.composite
def linear_chains(draw: st.DrawFn):
    """x[R, K] -> 1-4 random elementwise steps (a norm-like row step among them) -> @ W
    (F32/F16, either layout) -> 0-3 random elementwise steps with extra inputs broadcast to
    [R, N]; R a GEMV's or a GEMM's rows."""
    rows = draw(st.sampled_from([1, 2, 5, 12]))
    k, n = draw(st.sampled_from([16, 24, 40])), draw(st.sampled_from([8, 12, 20]))
    b = Builder()
    x = b.input("x", (rows, k))
    a = x
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["unary", "binary", "row", "select", "f16"]))
        if kind == "unary":
            a = b.unary(draw(st.sampled_from(["Tanh", "Sigmoid", "Silu", "Neg"])), a)
        elif kind == "binary":
            other = b.input(f"p{len(b.slots)}", draw(st.sampled_from([(k,), (rows, 1),
                                                                       (rows, k)])))
            a = getattr(b, draw(st.sampled_from(["add", "mul", "max", "min"])))(a, other)
        elif kind == "row":
            a = rms_norm(b, a, b.param(f"g{len(b.slots)}", (k,)))
        elif kind == "select":
            a = b.select(b.compare("Lt", a, 0.25), a, b.mul(a, -0.5))
        else:
            a = b.convert(b.convert(a, F16), F32)
    dt = draw(st.sampled_from([F32, F16]))
    transpose = draw(st.booleans())
    w = b.param("w", (n, k) if transpose else (k, n), dt)
    wf = w if dt is F32 else b.convert(w, F32)
    y = b.matmul(a, b.transpose(wf, (1, 0)) if transpose else wf)
    for _ in range(draw(st.integers(0, 3))):
        other = b.input(f"q{len(b.slots)}", draw(st.sampled_from([(n,), (rows, 1), (rows, n)])))
        y = getattr(b, draw(st.sampled_from(["add", "mul", "sub"])))(y, other)
        if draw(st.booleans()):
            y = b.unary(draw(st.sampled_from(["Tanh", "Silu"])), y)
    b.export("y", y)
    return b.build()


@settings(max_examples=examples(12), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(g=linear_chains())
def test_random_chains_around_a_linear(device, g):
    check(device, g)


def test_a_single_eqn_reading_one_value_twice_is_one_leaf(device):
    """``(x * x) @ W``: the Mul (one eqn, not a Fused) becomes a prologue with one leaf."""
    b = Builder()
    x = b.input("x", (2, 32))
    b.export("y", b.matmul(b.mul(x, x), b.param("w", (32, 8))))
    g = b.build()
    (r,) = check(device, g)
    assert r.prologue is not None and r.pro_dtypes == (F32,)
    assert str(r.prologue.body) == "Mul(x0, x0)"


def test_prologues_with_index_moves(device):
    """Bodies with index-moving nodes as prologues: A read through a transpose, and an F16
    embedding row gathered (clamped) and widened on A's loads."""
    b = Builder()
    x = b.input("x", (24, 3))
    b.export("t", b.matmul(b.unary("Exp", b.transpose(x, (1, 0))), b.param("w", (24, 8))))
    table = b.param("table", (10, 24), F16)
    tok = b.tokens("tok", (2,), 10)
    e = b.convert(b.gather(table, tok), F32)
    b.export("g", b.add(b.matmul(e, b.param("w2", (24, 8))), 1.0))
    g = b.build()
    reqs = linears(check(device, g))
    assert len(reqs) == 2 and all(r.prologue is not None and r.prologue.body.moves
                                  for r in reqs)
