"""Item 9: a fuzz of the public API. Random shapes, dtypes, values and argument types:
every outcome is a correct result or a PootvkError, never another exception or a crash."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pootvk
from pootvk.errors import PootvkError
from tests.helpers import examples, nse

DTYPES = [np.float32, np.float16, np.float64, np.int32, np.bool_, np.complex64, object]


def reference(q, k, v, mask, scale, softcap):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        s = s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


@st.composite
def calls(draw):
    b, hkv, rep = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2]))
    lq, lk, d = draw(st.sampled_from([1, 3])), draw(st.sampled_from([1, 5, 9])), draw(
        st.sampled_from([4, 8]))
    shapes = {"q": [b, hkv * rep, lq, d], "k": [b, hkv, lk, d], "v": [b, hkv, lk, d]}
    if draw(st.integers(0, 9)) == 0:  # a wrong shape somewhere
        name, axis = draw(st.sampled_from("qkv")), draw(st.integers(0, 3))
        shapes[name][axis] = draw(st.sampled_from([0, 3, 7]))
    dtype = draw(st.sampled_from(DTYPES)) if draw(st.integers(0, 3)) == 0 else np.float32
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    amp = draw(st.sampled_from([1e-3, 1.0, 4.0]))
    args = {n: (rng.standard_normal(s) * amp).astype(dtype) for n, s in shapes.items()}
    if draw(st.integers(0, 19)) == 0:
        args[draw(st.sampled_from("qkv"))] = draw(st.sampled_from(
            [None, "abc", 3, [[1.0], [1.0, 2.0]], np.ones(3, np.float32)]))
    mask = None
    if draw(st.booleans()):
        mshape = (draw(st.sampled_from([1, b])), draw(st.sampled_from([1, hkv * rep])),
                  draw(st.sampled_from([1, lq])), draw(st.sampled_from([lk, lk + 1])))
        mask = rng.standard_normal(mshape).astype(np.float32)
    scale = draw(st.sampled_from([None, None, 0.5, 2, np.float32(0.25), "x", float("nan"), True]))
    softcap = draw(st.sampled_from([None, None, 5.0, 0.0, -1.0, [1]]))
    device = draw(st.sampled_from([None, None, 0, "0", 1.5, "no-such-gpu", 99]))
    return args, mask, scale, softcap, device


@settings(max_examples=examples(120), deadline=None, suppress_health_check=list(HealthCheck))
@given(call=calls())
def test_every_outcome_is_a_result_or_a_pootvk_error(call, device) -> None:
    args, mask, scale, softcap, dev = call
    try:
        out = pootvk.attention(args["q"], args["k"], args["v"], mask=mask, scale=scale,
                               softcap=softcap, device=dev)
    except PootvkError:
        return
    q, k, v = (np.asarray(args[n]).astype(np.float32) for n in "qkv")
    ref = reference(q, k, v, mask, None if scale is None else float(scale),
                    None if softcap is None else float(softcap))
    assert out.shape == ref.shape and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert nse(out, ref) <= 5e-4, (nse(out, ref), q.shape, k.shape, mask, scale, softcap)
