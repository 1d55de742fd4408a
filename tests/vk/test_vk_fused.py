"""Fused kernels on the device against the oracle: RMSNorm (one row kernel: the sum of
squares computed on load, then the scale per element), softmax (two row kernels), SwiGLU,
reductions of every kind with their input fused, 16-bit operands and intermediates, and
random elementwise graphs."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

from pootvk.ir import BF16, F16, F32, I32
from pootvk.ir.fused import FUSED, FUSED_REDUCE, FUSED_ROW
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph
from pootvk.plan import FusedReduceRequest, plan_graph
from tests.helpers import assert_close, examples, random_inputs
from tests.random_graphs import elementwise_graphs, rms_norm, swiglu
from tests.vk.test_vk_graphs import run_on_device


def check(device, g, ins, tol=1e-6, scale=0.0):
    """Compile (fusing), run on the device, compare every output with the oracle on ``g``
    (``scale``: ``assert_close``'s floor on the values' scale)."""
    c = compile_graph(g)
    ref = evaluate(g, ins)
    out, _ = run_on_device(device, c, ins)
    for k, r in ref.items():
        got = out[k]
        if r.dtype.kind in "iub":
            np.testing.assert_array_equal(got, r, err_msg=k)
        else:
            assert_close(got.astype(np.float32), r.astype(np.float32), tol, scale)
    return c


@pytest.mark.parametrize("hidden", [16, 40, 700])  # one lane per element, idle lanes, a fold
def test_rms_norm_one_kernel(device, hidden):
    b = Builder()
    x = b.input("x", (3, hidden))
    b.export("y", rms_norm(b, x, b.param("w", (hidden,))))
    g = b.build()
    c = check(device, g, random_inputs(g, np.random.default_rng(hidden)))
    p = plan_graph(c, device.profile)
    assert [k.label for k in p.kernels] == ["fused row"]
    assert p.kernels[0].request.lanes == min(256, 1 << (hidden - 1).bit_length())


@pytest.mark.parametrize("dt", [F16, BF16])
def test_rms_norm_16bit_storage(device, dt):
    b = Builder()
    x = b.convert(b.input("x", (2, 64), dt), F32)
    w = b.convert(b.param("w", (64,), dt), F32)
    b.export("y", b.convert(rms_norm(b, x, w), dt))
    g = b.build()
    rng = np.random.default_rng(1)
    np_dt = np.float16 if dt is F16 else ml_dtypes.bfloat16
    ins = {"x": rng.standard_normal((2, 64)).astype(np_dt),
           "w": rng.standard_normal(64).astype(np_dt)}
    check(device, g, ins, tol=1e-4)  # one 16-bit rounding of y may differ by an ulp


def test_softmax_two_row_kernels(device):
    b = Builder()
    s = b.input("s", (5, 300))
    m = b.reduce("Max", s, 1)
    ex = b.unary("Exp", b.sub(s, m))
    b.export("p", b.div(ex, b.reduce("Sum", ex, 1)))
    g = b.build()
    ins = random_inputs(g, np.random.default_rng(4))
    ins["s"][2, :] = -np.inf  # a row that sees nothing: 0/0, NaN (the oracle's answer too)
    ins["s"][3, 7] = np.nan
    c = check(device, g, ins)
    assert c.count(FUSED_ROW) == 2


def test_swiglu_one_kernel(device):
    b = Builder()
    x = b.input("x", (2, 8))
    b.export("y", swiglu(b, x, b.param("wg", (8, 24)), b.param("wu", (8, 24)), False))
    g = b.build()
    c = check(device, g, random_inputs(g, np.random.default_rng(2)))
    # one Fused (passes.fuse), which passes.linear_fuse makes the gate matmul's epilogue
    assert c.count(FUSED) == 0 and len(c.eqns) == 2
    assert c.eqns[1].params["form"].epilogue is not None


def test_fused_reductions_of_every_kind(device):
    b = Builder()
    x = b.input("x", (3, 5, 7))
    y = b.input("y", (5, 1))
    i = b.input("i", (4, 9), I32)
    b.export("max_mid", b.reduce("Max", b.mul(b.add(x, y), 2.0), 1, keepdim=False))  # [3,7]
    b.export("sum_first", b.reduce("Sum", b.unary("Tanh", x), 0))  # [1,5,7]
    b.export("isum", b.reduce("Sum", b.mul(i, 3), 1))  # [4,1] int
    b.export("imax", b.reduce("Max", b.sub(i, 7), 0, keepdim=False))  # [9] negative ints
    b.export("f16", b.reduce("Sum", b.convert(b.convert(x, F16), F32), 2))  # rounded on load
    h = b.input("h", (6, 33), F16)
    b.export("hsum", b.reduce("Sum", b.mul(h, 0.5), 1))  # an F16 reduction: f16[6,1]
    g = b.build()
    ins = random_inputs(g, np.random.default_rng(3))
    ins["x"][1, 2, 3] = np.nan  # Max and Sum keep a NaN; the NaN row is only that row
    c = check(device, g, ins, tol=1e-5)  # hsum: the F16 sum rounds once, numpy's pairwise
    assert c.count(FUSED_REDUCE) == 6
    reqs = [k.request for k in plan_graph(c, device.profile).kernels]
    assert all(isinstance(r, FusedReduceRequest) for r in reqs)


def test_16bit_intermediates_round_like_stored_ones(device):
    """An F16 node inside a body is rounded to half after it is computed, as storing it
    would: x + 2048 - 2048 in F16 loses x's fraction (in F32 it would not)."""
    b = Builder()
    x = b.input("x", (64,), F16)
    big = b.add(x, 2048.0)  # half spacing at 2048 is 2: x's fraction goes
    b.export("y", b.convert(b.sub(big, 2048.0), F32))
    g = b.build()
    ins = {"x": (np.arange(64, dtype=np.float32) * 0.37 - 5).astype(np.float16)}
    c = compile_graph(g)
    assert len(c.eqns) == 1 and c.eqns[0].prim is FUSED
    out, _ = run_on_device(device, c, ins)
    ref = evaluate(g, ins)["y"]
    assert not np.array_equal(ref, ins["x"].astype(np.float32))  # the rounding is visible
    np.testing.assert_array_equal(out["y"], ref)


def test_a_16bit_reduction_input_is_rounded_before_it_is_summed(device):
    """Sum(h + g) in F16: 1 + 2**-12 is 1 in half, so the row [1 + 2**-12, -1] sums to 0
    exactly; summing the unrounded values would give 2**-12 (a half can hold it)."""
    b = Builder()
    h, g = b.input("h", (3, 2), F16), b.input("g", (3, 2), F16)
    b.export("s", b.reduce("Sum", b.add(h, g), 1))
    graph = b.build()
    ins = {"h": np.array([[1, -1]] * 3, np.float16),
           "g": np.array([[2**-12, 0]] * 3, np.float16)}
    c = compile_graph(graph)
    assert [e.prim for e in c.eqns] == [FUSED_REDUCE]
    out, _ = run_on_device(device, c, ins)
    np.testing.assert_array_equal(evaluate(graph, ins)["s"], np.zeros((3, 1), np.float16))
    np.testing.assert_array_equal(out["s"], np.zeros((3, 1), np.float16))


@settings(max_examples=examples(10), deadline=None)
@given(g=elementwise_graphs(tame=True))
def test_random_graphs_fused_on_the_device(device, g):
    """Errors against the inputs' scale (standard normal: 1): a graph whose output cancels
    to ~1e-7 (``tanh(s) - s``) is held to the operands' rounding, not to its own size."""
    ins = random_inputs(g, np.random.default_rng(0))
    check(device, g, ins, tol=1e-5, scale=1.0)


def test_folded_grids_on_the_device(device):
    """300 rows over a grid of at most 64 workgroups in X: rows and elements are found from
    the 2-D workgroup id."""
    b = Builder()
    x = b.input("x", (300, 8))
    b.export("y", rms_norm(b, x, b.param("w", (8,))))
    b.export("z", b.mul(b.unary("Silu", x), 3.0))  # 2400 elements: 38 groups of 64
    g = b.build()
    small = device.profile.with_(max_grid=(16, 65535, 65535))
    c = compile_graph(g)
    plan = plan_graph(c, small)
    assert all(k.request.grid[1] > 1 for k in plan.kernels)
    ins = random_inputs(g, np.random.default_rng(9))
    out, _ = run_on_device(device, c, ins, profile=small)
    ref = evaluate(g, ins)
    for k in ("y", "z"):
        assert_close(out[k], ref[k], 1e-6)


@pytest.mark.parametrize("subgroup", [True, False])
def test_row_kernels_with_and_without_subgroup_shuffles(device, subgroup):
    """The lanes' partials combine through subgroup shuffles then a tree, or through the
    tree alone (a device without shuffles): the same answers, rows short and long."""
    b = Builder()
    for n in (5, 64, 700):
        x = b.input(f"x{n}", (3, n))
        b.export(f"rms{n}", rms_norm(b, x, b.param(f"w{n}", (n,))))
        ex = b.unary("Exp", b.sub(x, b.reduce("Max", x, 1)))
        b.export(f"sm{n}", b.div(ex, b.reduce("Sum", ex, 1)))
    g = b.build()
    prof = device.profile.with_(subgroup_shuffle=subgroup and device.profile.subgroup_shuffle)
    c = compile_graph(g)
    plan = plan_graph(c, prof)
    rows = [k.request for k in plan.kernels if isinstance(k.request, FusedReduceRequest)]
    assert len(rows) == 9 and all(r.subgroup is prof.subgroup_shuffle for r in rows)
    ins = random_inputs(g, np.random.default_rng(10))
    out, _ = run_on_device(device, c, ins, profile=prof)
    ref = evaluate(g, ins)
    for k in ref:
        assert_close(out[k], ref[k], 1e-6)
