"""Single primitives on the live device against numpy: every unary op (iterated from the
enum, so a new op is covered or fails here) and reductions over U32; every primitive of
its families at every dtype it types against the oracle (16-bit values within one 16-bit
rounding): unary, binary, Compare and Select broadcast at rank 6, Iota, the parallel
Reduce (subgroup and shared-memory paths), ScatterUpdate in place and copied."""

import numpy as np
import pytest

from pootvk.ir import BF16, BOOL, F16, F32, I32, U32, ReduceOp, UnaryOp
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.plan import ReduceRequest, ScatterRequest, plan_graph
from pootvk.runtime import build_replay
from tests.values import ALL, assert_matches, ids, run_on_device, values

#: numpy's definition of each op, and the inputs it is defined on (float64 reference).
UNARY_NUMPY = {
    UnaryOp.EXP: (np.exp, "any"),
    UnaryOp.TANH: (np.tanh, "any"),
    UnaryOp.NEG: (np.negative, "any"),
    UnaryOp.RSQRT: (lambda x: 1.0 / np.sqrt(x), "positive"),
    UnaryOp.SQRT: (np.sqrt, "positive"),
    UnaryOp.LOG: (np.log, "positive"),
    UnaryOp.ABS: (np.abs, "any"),
    UnaryOp.RECIP: (lambda x: 1.0 / x, "nonzero"),
    UnaryOp.SIGMOID: (lambda x: 1.0 / (1.0 + np.exp(-x)), "any"),
    UnaryOp.SILU: (lambda x: x / (1.0 + np.exp(-x)), "any"),
    UnaryOp.COS: (np.cos, "angle"),
    UnaryOp.SIN: (np.sin, "angle"),
}
#: Vulkan allows sin/cos an absolute error of 2**-11 on [-pi, pi] (drivers use fast
#: approximations), not the 2e-6 of the other functions
ATOL = {UnaryOp.COS: 2.0**-11, UnaryOp.SIN: 2.0**-11}


def domain_input(domain: str, shape, rng) -> np.ndarray:
    if domain == "positive":
        x = np.exp(rng.uniform(-6.0, 6.0, shape))  # 2.5e-3 .. 400, both sides of 1
    elif domain == "nonzero":
        x = rng.choice([-1.0, 1.0], shape) * np.exp(rng.uniform(-6.0, 6.0, shape))
    elif domain == "angle":
        x = rng.uniform(-np.pi, np.pi, shape)
    else:
        x = rng.uniform(-8.0, 8.0, shape)
    return x.astype(np.float32)


def run(device, g, values):
    assert g.count(P.UNARY) + g.count(P.REDUCE) == 1  # the one primitive under test
    with build_replay(g, device) as rp:
        assert [k.label for k in rp.plan.kernels] == [g.eqns[0].prim.name]
        return rp.step(values)


@pytest.mark.parametrize("op", list(UnaryOp), ids=lambda op: op.value)
def test_every_unary_op_on_the_device(device, op):
    assert op in UNARY_NUMPY, f"add numpy's {op} to UNARY_NUMPY"
    fn, domain = UNARY_NUMPY[op]
    x = domain_input(domain, (3, 67), np.random.default_rng(hash(op.value) % 2**32))
    b = Builder()
    b.export("y", b.unary(op, b.input("x", x.shape)))  # an input: nothing to fold
    y = run(device, b.build(), {"x": x})["y"]
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, fn(x.astype(np.float64)), rtol=2e-6,
                               atol=ATOL.get(op, 1e-7), err_msg=op.value)


def test_unary_table_names_exactly_the_ops():
    assert set(UNARY_NUMPY) == set(UnaryOp)


U32_CASES = [  # shape, axis, keepdim
    ((5, 70), 1, True),
    ((5, 70), 0, False),
    ((3, 4, 9), 1, True),
    ((3, 4, 9), 2, False),
    ((257,), 0, True),
    ((4, 96), 1, False),  # rows read 4 elements per load
]


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda op: op.value)
@pytest.mark.parametrize(("shape", "axis", "keepdim"), U32_CASES)
@pytest.mark.parametrize("high", [False, True], ids=["small", "high_bit"])
def test_u32_reduce_on_the_device(device, op, shape, axis, keepdim, high):
    """U32 is unsigned: values past 2**31 order above smaller ones, sums wrap mod 2**32.
    (This test found U32 Max starting from 2**31: -2**31 as a uint.)"""
    rng = np.random.default_rng(9)
    lo, hi = (2**31, 2**32) if high else (0, 1000)
    x = rng.integers(lo, hi, shape, dtype=np.uint64).astype(np.uint32)
    b = Builder()
    b.export("y", b.reduce(op, b.input("x", shape, U32), axis, keepdim=keepdim))
    y = run(device, b.build(), {"x": x})["y"]
    if op is ReduceOp.SUM:
        want = np.sum(x, axis=axis, keepdims=keepdim, dtype=np.uint32)  # wraps mod 2**32
    else:
        assert op is ReduceOp.MAX, f"add numpy's {op} here"
        want = np.max(x, axis=axis, keepdims=keepdim)
    assert y.dtype == np.uint32
    np.testing.assert_array_equal(y, want)


# --- every family at every dtype, against the oracle --------------------------------------


def check_graph_on_device(device, g, ins, dtypes, profile=None, **tol):
    """Run ``g`` on the device and compare every output with the oracle's."""
    want = evaluate(g, ins)
    got = run_on_device(device, g, ins, profile)
    assert set(got) == set(want)
    for name in want:
        assert_matches(got[name], want[name], dtypes[name], err_msg=name, **tol)
    return got


@pytest.mark.parametrize("dt", [F16, BF16], ids=ids)
def test_every_unary_op_at_16_bits(device, dt):
    """All ops in one graph: widened to F32, computed, rounded once at the store."""
    b, ins = Builder(), {}
    rng = np.random.default_rng(3)
    for op, (_, domain) in UNARY_NUMPY.items():
        ins[op.value] = values((5, 13), dt, rng) if domain == "any" else \
            np.asarray(domain_input(domain, (5, 13), rng), dt.numpy)
        b.export(op.value, b.unary(op, b.input(op.value, (5, 13), dt)))
    check_graph_on_device(device, b.build(), ins, dict.fromkeys(ins, dt), atol32=2.0**-11)


def test_neg_abs_on_i32(device):
    b = Builder()
    x = b.input("x", (70,), I32)
    b.export("neg", b.unary("Neg", x))
    b.export("abs", b.unary("Abs", x))
    ins = {"x": values((70,), I32, np.random.default_rng(4))}
    check_graph_on_device(device, b.build(), ins, {"neg": I32, "abs": I32})


#: right-aligned broadcasting up to rank 6: every operand has size-1 and missing axes
A6, B6, P6 = (2, 1, 3, 1, 2, 5), (3, 3, 4, 1, 5), (1, 4, 2, 1)
ARITH = (P.ADD, P.SUB, P.MUL, P.DIV)


@pytest.mark.parametrize("dt", ALL, ids=ids)
def test_binary_compare_select_broadcast_at_rank_6(device, dt):
    rng = np.random.default_rng(5)
    b = Builder()
    a, c = b.input("a", A6, dt), b.input("c", B6, dt)
    pred = b.input("p", P6, BOOL)
    out = {}
    for prim in P.BINARY:
        if dt is BOOL and prim in ARITH:
            continue
        out[prim.name] = b.emit(prim, [a, c])
    for op in ("Lt", "Le", "Gt", "Ge", "Eq", "Ne"):
        out[op] = b.compare(op, a, c)
    out["Select"] = b.select(pred, a, c)
    out["SelectLit"] = b.select(pred, c, 1 if dt.is_int else True if dt is BOOL else 1.5)
    for k, v in out.items():
        b.export(k, v)
    ins = {"a": values(A6, dt, rng), "c": values(B6, dt, rng), "p": values(P6, BOOL, rng)}
    if dt.is_int:
        ins["c"][ins["c"] == 0] = 3  # integer division by zero is undefined in GLSL
    if dt is not BOOL:
        ins["a"].flat[::7] = ins["c"].flat[: len(ins["a"].flat[::7])]  # some equal pairs
    got = check_graph_on_device(device, b.build(), ins,
                                {k: v.dtype for k, v in out.items()})
    assert got["Max"].shape == got["Select"].shape == (2, 3, 3, 4, 2, 5)


@pytest.mark.parametrize("dt", [F32, F16, BF16, I32, U32], ids=ids)
def test_iota_and_convert_at_every_dtype(device, dt):
    b = Builder()
    x = b.input("x", (3, 7), F32)
    b.export("iota", b.iota((2, 300), 1, dt))  # 300 is not an exact BF16: rounded
    b.export("to", b.convert(x, dt))
    b.export("back", b.convert(b.convert(x, dt), F32))
    lo = 0 if dt is U32 else -50  # a negative float as U32 is undefined (numpy wraps)
    ins = {"x": np.random.default_rng(6).uniform(lo, 50, (3, 7)).astype(np.float32)}
    check_graph_on_device(device, b.build(), ins, {"iota": dt, "to": dt, "back": F32})


REDUCE_CASES = [  # shape, axis: a row of each kind the layout chooser sees
    ((5, 70), 1),  # short rows: several outputs per workgroup
    ((5, 70), 0),  # reduced axis not last: outputs side by side
    ((3, 4, 9), 1),
    ((2, 1000), 1),  # long rows: a full workgroup of lanes per output
    ((600, 3), 0),  # tall: lanes stride 600 rows, 3 outputs
    ((257,), 0),
]


def reduce_graph(dt, cases, ops=tuple(ReduceOp)):
    b = Builder()
    for c, (shape, axis) in enumerate(cases):
        x = b.input(f"x{c}", shape, dt)
        for op in ops:
            for keep in (True, False):
                b.export(f"{op.value}{c}{'k' if keep else ''}", b.reduce(op, x, axis, keep))
    return b.build()


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
def test_reduce_f32_subgroup_and_shared_paths(device, subgroup):
    """Every layout, both combine paths; NaN propagates through Max (and Sum), -inf rows
    stay -inf."""
    g = reduce_graph(F32, REDUCE_CASES)
    profile = device.profile.with_(subgroup_shuffle=subgroup and device.profile.subgroup_shuffle)
    reqs = [k.request for k in plan_graph(g, profile).kernels]
    assert all(isinstance(r, ReduceRequest) and r.subgroup == profile.subgroup_shuffle
               for r in reqs)
    assert {r.cols > 1 for r in reqs} == {True, False} and max(r.lanes for r in reqs) >= 64
    assert {r.vec for r in reqs} == {1, 4}  # (2, 1000): rows read 4 elements per load
    rng = np.random.default_rng(7)
    ins = {s.name: values(s.var.shape, F32, rng) for s in g.slots}
    ins["x0"][2, 33] = np.nan
    ins["x4"][:, 1] = -np.inf
    ins["x4"][100, 2] = np.nan
    got = check_graph_on_device(device, g, ins, dict.fromkeys(g.outputs(), F32), profile,
                                rtol32=1e-5, atol32=1e-4)
    assert np.isnan(got["Max0k"][2, 0]) and np.isnan(got["Max4"][2])
    assert got["Max4"][1] == -np.inf


@pytest.mark.parametrize("dt", [F16, BF16, I32, BOOL], ids=ids)
def test_reduce_at_every_dtype(device, dt):
    g = reduce_graph(dt, REDUCE_CASES[1:4])
    rng = np.random.default_rng(8)
    ins = {s.name: values(s.var.shape, dt, rng) for s in g.slots}
    check_graph_on_device(device, g, ins, dict.fromkeys(g.outputs(), dt), atol32=1e-3)


@pytest.mark.parametrize("dt", ALL, ids=ids)
def test_scatter_update_in_place_and_copied(device, dt):
    """A state updated in place (no copy kernel) and an input scattered into a copy; 40
    updates with repeated rows, -1s and out-of-range rows, more than the scan's lanes."""
    rows, row, n = 24, (3, 5), 40
    b = Builder()
    cache = b.state("cache", (rows, *row), dt)
    idx, up = b.input("idx", (n,), I32), b.input("up", (n, *row), dt)
    b.set_state("cache", b.scatter_update(cache, idx, up))
    b.export("copied", b.scatter_update(b.input("x", (rows, *row), dt), idx, up))
    g = b.build()
    plan = plan_graph(g, device.profile)
    assert [k.label for k in plan.kernels] == ["ScatterUpdate", "copy", "ScatterUpdate"]
    assert all(isinstance(k.request, ScatterRequest) for k in plan.kernels[::2])
    assert plan.kernels[0].request.lanes < n
    rng = np.random.default_rng(9)
    ins = {"cache": values((rows, *row), dt, rng), "x": values((rows, *row), dt, rng),
           "up": values((n, *row), dt, rng),
           "idx": rng.integers(-3, rows + 3, n).astype(np.int32)}
    ins["idx"][[0, 5, 39]] = 7  # row 7 three times: update 39 wins
    ins["idx"][1::9] = -1
    check_graph_on_device(device, g, ins, {"copied": dt, "cache": dt})


@pytest.mark.parametrize("dt", ALL, ids=ids)
def test_data_movement_at_every_dtype(device, dt):
    """Transpose, Slice, Concat, Broadcast, a copied Reshape, DynamicUpdateSlice (copied
    first) and Copy move stored words: exact at every dtype."""
    b = Builder()
    x, u = b.input("x", (3, 4, 5), dt), b.input("u", (2, 2, 5), dt)
    pos = b.pos("pos", 0, 9)
    b.export("t", b.transpose(x, (2, 0, 1)))
    b.export("s", b.slice(x, (1, 0, 2), (3, 3, 5)))
    b.export("c", b.concat([x, b.slice(x, (0, 0, 0), (3, 4, 2))], 2))
    b.export("b", b.broadcast(b.slice(x, (0, 0, 0), (1, 4, 5)), (2, 3, 4, 5)))
    b.export("r", b.reshape(x, (12, 5)))  # an input exported: a copy, not a view
    b.export("d", b.dynamic_update_slice(x, u, (1, pos, 0)))  # clamped past 2
    g = b.build()
    plan = plan_graph(g, device.profile, group=False)  # the graph's order
    assert [k.label for k in plan.kernels][-3:] == ["Reshape", "copy", "DynamicUpdateSlice"]
    rng = np.random.default_rng(10)
    for p in (1, 9):
        ins = {"x": values((3, 4, 5), dt, rng), "u": values((2, 2, 5), dt, rng),
               "pos": np.int32(p)}
        check_graph_on_device(device, g, ins, dict.fromkeys(g.outputs(), dt))


@pytest.mark.parametrize("dt", [F32, BF16, I32, BOOL], ids=ids)
def test_split_reduction_of_few_long_rows(device, dt):
    """Few outputs over long rows fill too few workgroups: two passes, the chunks'
    partials (F32 for 16-bit input) in declared scratch, then each row's partials."""
    b = Builder()
    x, y = b.input("x", (2, 1 << 17), dt), b.input("y", (1 << 17, 3), dt)
    for op in ReduceOp:
        b.export(f"{op.value}_rows", b.reduce(op, x, 1, keepdim=False))
        b.export(f"{op.value}_cols", b.reduce(op, y, 0))
    g = b.build()
    plan = plan_graph(g, device.profile.with_(compute_units=2))
    reqs = [k.request for k in plan.kernels]
    assert len(reqs) == 8 and all(isinstance(r, ReduceRequest) for r in reqs)
    acc = F32 if dt is BF16 else dt
    assert all(r.stored is acc and r.n < 1 << 17 for r in reqs[::2])  # chunk partials
    assert all(r.dtype is acc and r.stored is dt for r in reqs[1::2])
    rng = np.random.default_rng(13)
    ins = {"x": values((2, 1 << 17), dt, rng), "y": values((1 << 17, 3), dt, rng)}
    if dt is F32:
        ins["x"][1, 99999] = np.nan
    got = check_graph_on_device(device, g, ins, dict.fromkeys(g.outputs(), dt),
                                device.profile.with_(compute_units=2), atol32=0.05)
    if dt is F32:
        assert np.isnan(got["Max_rows"][1]) and np.isnan(got["Sum_rows"][1])
