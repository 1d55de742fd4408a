"""The Builder's layer helpers in the oracle against hand-written float64 numpy (HF Llama's
definitions), and the attention helpers emit the chain the rewrite fuses."""

import numpy as np
import pytest

from pootvk.errors import ShapeError
from pootvk.ir import F16, F32
from pootvk.ir import prims as P
from pootvk.ops import Builder, rope_tables
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph
from tests.helpers import nse, reference_attention

rng = np.random.default_rng(11)


@pytest.mark.parametrize("wdt", [F32, F16])
def test_rms_norm(wdt):
    x = rng.standard_normal((3, 5, 24)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(24)).astype(wdt.numpy)
    b = Builder()
    b.export("y", b.rms_norm(b.input("x", x.shape), b.param("w", (24,), wdt), eps=1e-5))
    y = evaluate(b.build(), {"x": x, "w": w})["y"]
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5) * w.astype(np.float64)
    assert y.dtype == np.float32 and nse(y, want) < 1e-12


def hf_rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """HF Llama's apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, cos = cos(cat(f, f))."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    f = positions[:, None] * inv[None, :]
    emb = np.concatenate([f, f], -1)
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * np.cos(emb) + rot * np.sin(emb)


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("rows,pos", [(1, 0), (1, 37), (5, 20)])
def test_rope_is_hf_llamas_rotation(rows, pos, full):
    """Half-width tables and the folded full-width ones give HF's rotation."""
    d, cap, theta = 32, 64, 500000.0
    x = rng.standard_normal((2, 3, rows, d)).astype(np.float32)
    cos, sin = rope_tables(cap, d, theta, full=full)
    b = Builder()
    p = b.pos("pos", 0, cap - rows)
    y = b.rope(b.input("x", x.shape), p, b.param("cos", cos.shape), b.param("sin", sin.shape))
    b.export("y", y)
    got = evaluate(b.build(), {"x": x, "pos": np.int32(pos), "cos": cos, "sin": sin})["y"]
    want = hf_rope(x.astype(np.float64), np.arange(pos, pos + rows, dtype=np.float64), theta)
    assert nse(got, want) < 1e-12
    # a rotation keeps each (i, i + d/2) pair's norm
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=1e-5)


def test_rope_refuses_a_table_of_the_wrong_width():
    b = Builder()
    t = b.param("cos", (8, 3))
    with pytest.raises(ShapeError, match="table"):
        b.rope(b.input("x", (1, 1, 1, 8)), b.pos("pos", 0, 7), t, t)


def test_repeat_kv():
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    b = Builder()
    b.export("y", b.repeat_kv(b.input("x", x.shape), 3))
    y = evaluate(b.build(), {"x": x})["y"]
    np.testing.assert_array_equal(y, np.repeat(x, 3, axis=1))


def test_attention_helpers_emit_the_fused_chain():
    b = Builder()
    q = b.input("q", (1, 8, 1, 16))
    kn, vn = b.input("k", (1, 2, 1, 16)), b.input("v", (1, 2, 1, 16))
    kc, vc = b.state("kc", (1, 2, 32, 16)), b.state("vc", (1, 2, 32, 16))
    out, kc2, vc2 = b.attention_decode(q, kn, vn, kc, vc, b.pos("pos", 0, 31))
    b.set_state("kc", kc2)
    b.set_state("vc", vc2)
    b.export("out", out)
    b.export("plain", b.attention(q, kn, vn))
    g = compile_graph(b.build())
    assert g.count(P.ATTENTION) == 2 and g.count(P.MATMUL) == 0
    vals = {s.name: rng.standard_normal(s.var.shape).astype(np.float32)
            for s in g.slots if s.kind.bound and s.name != "pos"}
    vals["pos"] = np.int32(9)
    r = evaluate(g, vals)
    kfull = vals["kc"].copy()
    vfull = vals["vc"].copy()
    kfull[:, :, 9], vfull[:, :, 9] = vals["k"][:, :, 0], vals["v"][:, :, 0]
    want = reference_attention(vals["q"], kfull[:, :, :10], vfull[:, :, :10])
    assert nse(r["out"], want) < 1e-10


def test_unary_shortcuts_and_copy():
    x = np.abs(rng.standard_normal((3, 4)).astype(np.float32)) + 0.5
    b = Builder()
    v = b.input("x", x.shape)
    outs = {"neg": b.neg(v), "sqrt": b.sqrt(v), "rsqrt": b.rsqrt(v), "log": b.log(v),
            "recip": b.recip(v), "sigmoid": b.sigmoid(v), "silu": b.silu(v), "copy": b.copy(v)}
    for n, o in outs.items():
        b.export(n, o)
    r = evaluate(b.build(), {"x": x})
    x64 = x.astype(np.float64)
    want = {"neg": -x64, "sqrt": np.sqrt(x64), "rsqrt": 1 / np.sqrt(x64), "log": np.log(x64),
            "recip": 1 / x64, "sigmoid": 1 / (1 + np.exp(-x64)),
            "silu": x64 / (1 + np.exp(-x64)), "copy": x64}
    for n in outs:
        np.testing.assert_allclose(r[n], want[n], rtol=1e-6, err_msg=n)
