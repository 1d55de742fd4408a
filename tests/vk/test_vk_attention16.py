"""An attention chain computed wholly at F16/BF16 (q, K, V, mask, scores and softmax all
16-bit values, every op computed in F32 and rounded at its store): the fused kernel does
not take it (its q is not F32), so it stays primitive, and still runs: 16-bit MatMul,
Reduce, Exp, Div, GQA repeat (Reshape views and Broadcast), a converted causal mask."""

import numpy as np
import pytest

from pootvk.ir import BF16, F16
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.ops.attention import causal_mask, repeat_kv, softmax
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph
from tests.helpers import assert_close, reference_attention
from tests.values import run_on_device, values

B, HQ, HKV, LQ, CAP, D = 1, 4, 2, 3, 12, 16


def chain(dt):
    b = Builder()
    q = b.input("q", (B, HQ, LQ, D), dt)
    k, v = b.input("k", (B, HKV, CAP, D), dt), b.input("v", (B, HKV, CAP, D), dt)
    pos = b.pos("pos", 0, CAP - LQ)
    mask = b.convert(causal_mask(b, pos, LQ, CAP), dt)  # 0 / -inf, exact at 16 bits
    kx, vx = repeat_kv(b, k, HQ // HKV), repeat_kv(b, v, HQ // HKV)
    s = b.add(b.mul(b.matmul(q, b.transpose(kx, (0, 1, 3, 2))), 0.25), mask)
    b.export("out", b.matmul(softmax(b, s), vx))
    return b.build()


@pytest.mark.parametrize("dt", [F16, BF16], ids=lambda d: d.value)
def test_a_16bit_attention_chain_stays_primitive_and_runs(device, dt):
    g = chain(dt)
    c = compile_graph(g)
    assert c.count(P.ATTENTION) == 0 and c.count(P.MATMUL) == 2
    assert all(e.out.dtype is dt for e in c.eqns if e.prim in (P.MATMUL, P.REDUCE))
    rng = np.random.default_rng(12)
    ins = {n: values(s, dt, rng, -1.0, 1.0) for n, s in
           (("q", (B, HQ, LQ, D)), ("k", (B, HKV, CAP, D)), ("v", (B, HKV, CAP, D)))}
    ins["pos"] = np.int32(5)
    got = run_on_device(device, c, ins)["out"]
    want = evaluate(g, ins)["out"]
    assert got.dtype == want.dtype and np.isfinite(got).all()
    # the device and the oracle round the same F32 values: a few 16-bit roundings apart
    assert_close(got, want, tol=1e-6 if dt is F16 else 1e-5)
    # and the chain at 16 bits is attention (float64, from the definition)
    visible = np.arange(CAP)[None, :] <= 5 + np.arange(LQ)[:, None]
    mask = np.where(visible, 0.0, -np.inf)[None, None]
    ref = reference_attention(*(ins[n].astype(np.float64) for n in "qkv"), mask, scale=0.25)
    assert_close(got.astype(np.float64), ref, tol=2e-6 if dt is F16 else 1e-4)
