"""The oracle's rules for Cos/Sin, ScatterUpdate, Reduce and the 16-bit contract, against
numpy written out by hand (loops and float64, none of the oracle's code)."""

import ml_dtypes
import numpy as np
import pytest

from pootvk.errors import ShapeError
from pootvk.ir import BF16, BOOL, F16, F32, I32, U32
from pootvk.ir.dtypes import storage_values
from pootvk.ops import Builder
from pootvk.oracle import evaluate

rng = np.random.default_rng(11)


def run(build, **inputs):
    """Export ``build(b, *slots)``; inputs given as (array, dtype) by name."""
    b = Builder()
    xs = [b.input(name, a.shape, dt) for name, (a, dt) in inputs.items()]
    b.export("y", build(b, *xs))
    return evaluate(b.build(), {name: a for name, (a, _) in inputs.items()})["y"]


@pytest.mark.parametrize("op,fn", [("Cos", np.cos), ("Sin", np.sin)])
def test_cos_sin(op, fn):
    x = rng.uniform(-10, 10, (4, 9)).astype(np.float32)
    y = run(lambda b, x: b.unary(op, x), x=(x, F32))
    np.testing.assert_allclose(y, fn(x.astype(np.float64)), rtol=1e-6, atol=1e-7)
    h = x.astype(np.float16)  # F16: computed in F32, rounded once
    y16 = run(lambda b, x: b.unary(op, x), x=(h, F16))
    assert y16.dtype == np.float16
    np.testing.assert_array_equal(y16, fn(h.astype(np.float32)).astype(np.float16))


def scatter_by_hand(operand, indices, updates):
    out = operand.copy()
    for n in range(len(indices)):
        i = int(indices[n])
        if 0 <= i < operand.shape[0]:  # -1 and every other out-of-range index: no write
            out[i] = updates[n]
    return out


@pytest.mark.parametrize("dt", [F32, F16, BF16, I32, U32, BOOL], ids=lambda d: d.value)
def test_scatter_update(dt):
    op = storage_values(rng.standard_normal((6, 2, 3)) * 10, dt)
    up = storage_values(rng.standard_normal((7, 2, 3)) * 10, dt)
    idx = np.array([2, -1, 5, 6, 2, -7, 0], np.int32)  # row 2 twice: the later wins
    y = run(lambda b, o, i, u: b.scatter_update(o, i, u),
            o=(op, dt), i=(idx, I32), u=(up, dt))
    want = op.copy()
    want[2], want[5], want[0] = up[4], up[2], up[6]
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(y, scatter_by_hand(op, idx, up))


def test_scatter_update_shapes():
    b = Builder()
    o, i = b.input("o", (4, 3)), b.input("i", (2,), I32)
    with pytest.raises(ShapeError, match="updates"):
        b.scatter_update(o, i, b.input("u", (2, 4)))
    with pytest.raises(ShapeError, match="i32"):
        b.scatter_update(o, b.input("f", (2,)), b.input("u2", (2, 3)))
    with pytest.raises(ShapeError, match="dtypes differ"):
        b.scatter_update(o, i, b.input("u3", (2, 3), F16))


def test_reduce_max_propagates_nan_and_sums_16bit_in_f32():
    x = rng.standard_normal((5, 3000)).astype(np.float32)
    x[1, 17] = np.nan
    m = run(lambda b, x: b.reduce("Max", x, 1), x=(x, F32))
    assert np.isnan(m[1, 0]) and not np.isnan(np.delete(m, 1, 0)).any()
    h = x.T.astype(np.float16).copy()  # [3000, 5]: reduce axis 0
    s = run(lambda b, x: b.reduce("Sum", x, 0, keepdim=False), x=(h, F16))
    by_hand = np.zeros(5)
    for j in range(h.shape[0]):
        by_hand += h[j].astype(np.float64)
    ok = ~np.isnan(by_hand)
    # numpy's own float16 sum accumulates in float16 and is off by tenths here
    np.testing.assert_allclose(s[ok].astype(np.float64), by_hand[ok], rtol=2**-10, atol=1e-3)


def test_bool_reductions_are_any():
    x = rng.random((4, 6)) < 0.2
    x[2] = False
    for op in ("Max", "Sum"):
        y = run(lambda b, x, op=op: b.reduce(op, x, 1, keepdim=False), x=(x, BOOL))
        np.testing.assert_array_equal(y, [bool(r.any()) for r in x])


def bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def test_every_bf16_result_is_rounded_to_bf16():
    """BF16 is held in float32 by the oracle, but each result is a bfloat16 value (rounded
    once to nearest even), as the device stores it: Add, Exp, MatMul, Convert, Reduce."""
    a, c = bf16(rng.standard_normal((3, 8))), bf16(rng.standard_normal((8, 2)))
    assert np.any(bf16(a[:, :2] + 1e-3) != a[:, :2] + np.float32(1e-3))  # rounding matters
    got = run(lambda b, x: b.add(x, 1e-3), x=(a, BF16))
    np.testing.assert_array_equal(got, bf16(a + bf16(1e-3)))
    np.testing.assert_array_equal(run(lambda b, x: b.exp(x), x=(a, BF16)), bf16(np.exp(a)))
    np.testing.assert_array_equal(run(lambda b, x, y: b.matmul(x, y), x=(a, BF16), y=(c, BF16)),
                                  bf16(a @ c))
    f = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(lambda b, x: b.convert(x, BF16), x=(f, F32)), bf16(f))
    np.testing.assert_array_equal(run(lambda b, x: b.reduce("Sum", x, 1), x=(a, BF16)),
                                  bf16(a.sum(1, keepdims=True)))


def test_typing_refuses_undefined_ops():
    b = Builder()
    i, p = b.input("i", (3,), I32), b.input("p", (3,), BOOL)
    with pytest.raises(ShapeError, match="Exp is not defined on i32"):
        b.exp(i)
    with pytest.raises(ShapeError, match="bool"):
        b.add(p, p)
    b.unary("Neg", i)  # Neg and Abs are defined on I32
    b.max(p, p)  # Bool's Or
    with pytest.raises(ShapeError, match="Neg is not defined on u32"):
        b.unary("Neg", b.input("u", (3,), U32))
