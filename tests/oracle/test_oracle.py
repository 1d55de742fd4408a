import math

import numpy as np
import pytest

from pootvk.ir import F32, I32
from pootvk.ops import Builder, trace_attention
from pootvk.oracle import evaluate
from tests.helpers import reference_attention

rng = np.random.default_rng(7)


def run1(build, *arrays):
    b = Builder()
    xs = [b.input(f"x{i}", a.shape, F32 if a.dtype == np.float32 else I32)
          for i, a in enumerate(arrays)]
    b.export("y", build(b, *xs))
    return evaluate(b.build(), {f"x{i}": a for i, a in enumerate(arrays)})["y"]


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_elementwise_and_broadcast():
    a, c = f32(2, 3, 4), f32(3, 1)
    np.testing.assert_array_equal(run1(lambda b, x, y: b.add(x, y), a, c), a + c)
    np.testing.assert_array_equal(run1(lambda b, x, y: b.div(x, y), a, c), a / c)
    np.testing.assert_array_equal(run1(lambda b, x: b.max(x, 0.0), a), np.maximum(a, 0))
    np.testing.assert_array_equal(run1(lambda b, x: b.exp(x), a), np.exp(a))
    np.testing.assert_array_equal(run1(lambda b, x: b.unary("Rsqrt", b.unary("Abs", x)), a),
                                  1 / np.sqrt(np.abs(a)))


def test_compare_select_iota_convert():
    a = f32(4, 5)
    y = run1(lambda b, x: b.select(b.compare("Gt", x, 0.0), x, -1.0), a)
    np.testing.assert_array_equal(y, np.where(a > 0, a, -1))
    io = run1(lambda b, x: b.convert(b.iota((4, 5), axis=1), F32), a)
    np.testing.assert_array_equal(io, np.broadcast_to(np.arange(5, dtype=np.float32), (4, 5)))


def test_shape_primitives():
    a = f32(2, 3, 4)
    np.testing.assert_array_equal(run1(lambda b, x: b.transpose(x, (2, 0, 1)), a),
                                  a.transpose(2, 0, 1))
    np.testing.assert_array_equal(run1(lambda b, x: b.reshape(x, (6, 4)), a), a.reshape(6, 4))
    np.testing.assert_array_equal(run1(lambda b, x: b.broadcast(x, (5, 2, 3, 4)), a),
                                  np.broadcast_to(a, (5, 2, 3, 4)))
    np.testing.assert_array_equal(run1(lambda b, x: b.slice(x, (0, 1, 1), (2, 3, 3)), a),
                                  a[:, 1:3, 1:3])
    np.testing.assert_array_equal(run1(lambda b, x: b.concat([x, x], 1), a),
                                  np.concatenate([a, a], 1))


def test_matmul_reduce():
    a, c = f32(2, 3, 4), f32(4, 5)
    np.testing.assert_array_equal(run1(lambda b, x, y: b.matmul(x, y), a, c), a @ c)
    np.testing.assert_array_equal(run1(lambda b, x: b.reduce("Sum", x, 1, False), a),
                                  a.sum(1))
    np.testing.assert_array_equal(run1(lambda b, x: b.reduce("Max", x, -1), a),
                                  a.max(-1, keepdims=True))


def test_dynamic_update_slice_clamps_like_xla():
    op, up = f32(2, 6, 3), f32(2, 2, 3)
    for start, at in ((1, 1), (5, 4), (-3, 0)):
        y = run1(lambda b, o, u, s=start: b.dynamic_update_slice(o, u, (0, s, 0)), op, up)
        want = op.copy()
        want[:, at : at + 2] = up
        np.testing.assert_array_equal(y, want)


def naive_attention(q, k, v, mask=None, scale=None, softcap=None):
    """A float64 double loop, written without any of the oracle's code."""
    b, hq, lq, dk = q.shape
    hkv = k.shape[1]
    scale = 1 / math.sqrt(dk) if scale is None else scale
    out = np.zeros((b, hq, lq, v.shape[3]))
    for bi in range(b):
        for h in range(hq):
            g = h // (hq // hkv)
            for i in range(lq):
                s = (k[bi, g].astype(np.float64) @ q[bi, h, i]) * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if mask is not None:
                    s = s + mask[min(bi, mask.shape[0] - 1), min(h, mask.shape[1] - 1),
                                 min(i, mask.shape[2] - 1)]
                w = np.exp(s - s.max())
                out[bi, h, i] = (w / w.sum()) @ v[bi, g]
    return out


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_attention_chain_matches_naive(softcap):
    q, k, v = f32(2, 8, 3, 16), f32(2, 2, 11, 16), f32(2, 2, 11, 24)
    mask = np.where(rng.random((1, 8, 3, 11)) < 0.3, -np.inf, rng.standard_normal((1, 8, 3, 11)))
    mask[..., 0] = 0.0
    mask = mask.astype(np.float32)
    g = trace_attention(q.shape, k.shape, v.shape, mask.shape, softcap=softcap)
    got = evaluate(g, {"q": q, "k": k, "v": v, "mask": mask})["out"]
    np.testing.assert_allclose(got, naive_attention(q, k, v, mask, softcap=softcap),
                               rtol=2e-5, atol=2e-6)


def test_row_that_sees_no_key_is_nan():
    q, k, v = f32(1, 1, 2, 4), f32(1, 1, 3, 4), f32(1, 1, 3, 4)
    mask = np.zeros((1, 1, 2, 3), np.float32)
    mask[0, 0, 1] = -np.inf
    g = trace_attention(q.shape, k.shape, v.shape, mask.shape)
    out = evaluate(g, {"q": q, "k": k, "v": v, "mask": mask})["out"]
    assert np.isfinite(out[0, 0, 0]).all() and np.isnan(out[0, 0, 1]).all()


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_kernel_tests_reference_matches_naive(softcap):
    """tests.helpers.reference_attention, what kernel tests compare the device against,
    agrees with the double loop: GQA, scale, softcap, -inf weights and NaN rows."""
    q, k, v = f32(2, 8, 3, 16), f32(2, 2, 11, 16), f32(2, 2, 11, 24)
    mask = np.where(rng.random((1, 8, 3, 11)) < 0.3, -np.inf, rng.standard_normal((1, 8, 3, 11)))
    mask[0, 2, 1] = -np.inf  # head 2, row 1 sees no key
    with np.errstate(invalid="ignore"):
        want = naive_attention(q, k, v, mask, scale=0.7, softcap=softcap)
    got = reference_attention(q, k, v, mask, scale=0.7, softcap=softcap)
    assert np.isnan(got).sum() == 2 * 24 and np.isnan(got[:, 2, 1]).all()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)  # NaNs compare equal
