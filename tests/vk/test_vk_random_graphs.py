"""Random small graphs (hypothesis): elementwise, Reduce, Transpose, Slice, Concat,
Broadcast, Reshape and Select chains at F32, F16 and BF16, compiled by the full pass
pipeline and run on the device, agree with the oracle on the uncompiled graph.

Chains only use functions that are continuous in their operands (Compare reads graph
inputs, so a last-bit difference between two computed values can never flip a Select), and
bounded unary functions, so the device and the oracle differ by at most a few roundings
of the values' scale."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pootvk.ir import BF16, F16, F32, DType, Var
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph
from tests.helpers import examples
from tests.values import ULP, run_on_device, values

UNARY = ("Tanh", "Sigmoid", "Neg", "Abs", "Sin", "Cos", "Silu")
BINARY = ("add", "sub", "mul", "max", "min")
KINDS = ("unary", "binary", "reduce", "transpose", "slice", "concat", "broadcast",
         "reshape", "select")

shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


def _reshape_target(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Flatten, merge two neighbouring axes, or put a new unit axis somewhere."""
    how = draw(st.sampled_from(("flat", "merge", "unit")))
    if how == "flat" or len(shape) == 1:
        return (math.prod(shape),) if how != "unit" else (1, *shape)
    i = draw(st.integers(0, len(shape) - (2 if how == "merge" else 0)))
    if how == "merge":
        return (*shape[:i], shape[i] * shape[i + 1], *shape[i + 2:])
    return (*shape[:i], 1, *shape[i:])


@st.composite
def graphs(draw):
    dt: DType = draw(st.sampled_from((F32, F16, BF16)))
    b = Builder()
    inputs = [b.input(f"x{i}", draw(shapes), dt) for i in range(draw(st.integers(1, 3)))]
    pool: list[Var] = list(inputs)
    for _ in range(draw(st.integers(2, 6))):
        v = draw(st.sampled_from(pool))
        kind = draw(st.sampled_from(KINDS))
        if kind == "unary":
            out = b.unary(draw(st.sampled_from(UNARY)), v)
        elif kind == "binary":
            fits = [w for w in pool if _broadcasts(v.shape, w.shape)]
            w = draw(st.sampled_from(fits)) if draw(st.booleans()) else 0.5
            out = getattr(b, draw(st.sampled_from(BINARY)))(v, w)
        elif kind == "reduce":
            axis = draw(st.integers(0, v.ndim - 1))
            if v.ndim == 1 and not draw(st.booleans()):
                continue  # keep ranks >= 1
            out = b.reduce(draw(st.sampled_from(("Max", "Sum"))), v, axis,
                           keepdim=v.ndim == 1 or draw(st.booleans()))
        elif kind == "transpose":
            out = b.transpose(v, draw(st.permutations(range(v.ndim))))
        elif kind == "slice":
            start = [draw(st.integers(0, n - 1)) for n in v.shape]
            limit = [draw(st.integers(s + 1, n)) for s, n in zip(start, v.shape, strict=True)]
            out = b.slice(v, start, limit)
        elif kind == "concat":
            axis = draw(st.integers(0, v.ndim - 1))
            fits = [w for w in pool if w.ndim == v.ndim and all(
                a == c for i, (a, c) in enumerate(zip(w.shape, v.shape, strict=True))
                if i != axis)]
            out = b.concat([v, draw(st.sampled_from(fits))], axis)
        elif kind == "broadcast":
            lead = draw(st.lists(st.integers(1, 3), max_size=2))
            out = b.broadcast(v, (*lead, *(draw(st.integers(1, 3)) if n == 1 else n
                                           for n in v.shape)))
        elif kind == "reshape":
            out = b.reshape(v, _reshape_target(draw, v.shape))
        else:  # select on a comparison of graph inputs only (see the module's docstring)
            p, q = draw(st.sampled_from(inputs)), draw(st.sampled_from(inputs))
            if not _broadcasts(p.shape, q.shape):
                q = p
            pred = b.compare(draw(st.sampled_from(("Lt", "Ge", "Ne"))), p, q)
            w = draw(st.sampled_from([w for w in pool if _broadcasts(pred.shape, w.shape)]
                                     or [v]))
            if not _broadcasts(pred.shape, v.shape, w.shape):  # all three together
                continue
            out = b.select(pred, v, w)
        pool.append(out)
    b.export("out", pool[-1])
    for i, v in enumerate(draw(st.lists(st.sampled_from(pool[len(inputs):] or pool),
                                        max_size=2))):
        b.export(f"extra{i}", v)  # intermediates and views exported too
    return b.build(), dt


def _broadcasts(*shapes: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(*shapes)
        return True
    except ValueError:
        return False


@settings(max_examples=examples(25), deadline=None, suppress_health_check=list(HealthCheck))
@given(case=graphs(), seed=st.integers(0, 2**16))
def test_random_graphs_agree_with_the_oracle(device, case, seed):
    g, dt = case
    rng = np.random.default_rng(seed)
    ins = {s.name: values(s.var.shape, dt, rng, -2.0, 2.0) for s in g.slots}
    want = evaluate(g, ins)
    got = run_on_device(device, compile_graph(g), ins)
    for name, w in want.items():
        w64 = w.astype(np.float64)
        scale = max(1.0, float(np.abs(w64).max(initial=0.0)))
        if dt is F32:
            tol = 1e-5 * scale
        else:  # a few roundings where F32 results straddle a 16-bit rounding boundary
            tol = 4 * ULP[dt] * scale
        np.testing.assert_allclose(got[name].astype(np.float64), w64, rtol=0, atol=tol,
                                   err_msg=f"{name} of\n{g}")
