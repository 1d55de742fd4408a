"""The layer helpers' chains on the device against the oracle: RMSNorm (F32 and F16
weights) and RoPE for one decode row and for a prefill chunk at an offset."""

import numpy as np
import pytest

import pootvk
from pootvk.ir import F16, F32
from pootvk.ops import Builder, rope_tables
from pootvk.oracle import evaluate
from tests.helpers import assert_close


def run_both(device, g, values):
    want = evaluate(g, values)
    with pootvk.compile(g, device) as prog:
        got = prog(**values)
    return got, want


@pytest.mark.parametrize("wdt", [F32, F16])
def test_rms_norm_on_the_device(device, wdt):
    rng = np.random.default_rng(2)
    b = Builder()
    b.export("y", b.rms_norm(b.input("x", (3, 96)), b.param("w", (96,), wdt), eps=1e-5))
    values = {"x": rng.standard_normal((3, 96)).astype(np.float32),
              "w": (1 + 0.1 * rng.standard_normal(96)).astype(wdt.numpy)}
    got, want = run_both(device, b.build(), values)
    assert_close(got["y"], want["y"], 1e-10)


@pytest.mark.parametrize("rows,pos", [(1, 13), (5, 3)])
def test_rope_on_the_device(device, rows, pos):
    rng = np.random.default_rng(rows)
    cos, sin = rope_tables(24, 16)
    b = Builder()
    p = b.pos("pos", 0, 24 - rows)
    x = b.input("x", (1, 3, rows, 16))
    b.export("y", b.rope(x, p, b.param("cos", cos.shape), b.param("sin", sin.shape)))
    values = {"x": rng.standard_normal((1, 3, rows, 16)).astype(np.float32),
              "pos": np.int32(pos), "cos": cos, "sin": sin}
    got, want = run_both(device, b.build(), values)
    assert_close(got["y"], want["y"], 1e-10)
