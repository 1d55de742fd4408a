"""The examples a user copies from must run as written, and their answers must be right
(checked against the independent float64 reference, not the example's own oracle check)."""

import runpy
import sys
from pathlib import Path

import numpy as np

from tests.helpers import assert_close, reference_attention

ROOT = Path(__file__).resolve().parent.parent


def test_attention_example(capsys, device):
    ns = runpy.run_path(str(ROOT / "examples" / "attention.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "Attention[" in out and "normalised squared error" in out
    ref = reference_attention(ns["q"], ns["k"], ns["v"], ns["alibi"], softcap=30.0)
    assert ns["out"].shape == (1, 8, 4, 96)
    assert_close(ns["out"], ref)


def test_decode_loop_example(capsys, device, monkeypatch):
    steps = 24
    monkeypatch.setattr(sys, "argv", ["decode_loop.py", str(steps)])
    ns = runpy.run_path(str(ROOT / "examples" / "decode_loop.py"), run_name="__main__")
    assert f"{steps} steps, 1 recording" in capsys.readouterr().out
    # Replay the example's draws: its last step attends over every key it wrote.
    rng = np.random.default_rng(0)
    draws = [
        [rng.standard_normal(s, dtype=np.float32)
         for s in ((1, 16, 1, 64), (1, 4, 1, 64), (1, 4, 1, 64))]
        for _ in range(steps)
    ]
    np.testing.assert_array_equal(draws[-1][0], ns["q"])  # the draws were replayed in order
    keys = np.concatenate([d[1] for d in draws], axis=2)
    values = np.concatenate([d[2] for d in draws], axis=2)
    assert_close(ns["out"], reference_attention(ns["q"], keys, values))
