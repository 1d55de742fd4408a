"""Single primitives on the live device against numpy: every unary op (iterated from the
enum, so a new op is covered or fails here) and reductions over U32."""

import numpy as np
import pytest

from pootvk.ir import U32, ReduceOp, UnaryOp
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.runtime import build_replay

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
}


def domain_input(domain: str, shape, rng) -> np.ndarray:
    if domain == "positive":
        x = np.exp(rng.uniform(-6.0, 6.0, shape))  # 2.5e-3 .. 400, both sides of 1
    elif domain == "nonzero":
        x = rng.choice([-1.0, 1.0], shape) * np.exp(rng.uniform(-6.0, 6.0, shape))
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
    np.testing.assert_allclose(y, fn(x.astype(np.float64)), rtol=2e-6, atol=1e-7,
                               err_msg=op.value)


def test_unary_table_names_exactly_the_ops():
    assert set(UNARY_NUMPY) == set(UnaryOp)


U32_CASES = [  # shape, axis, keepdim
    ((5, 70), 1, True),
    ((5, 70), 0, False),
    ((3, 4, 9), 1, True),
    ((3, 4, 9), 2, False),
    ((257,), 0, True),
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
