"""The examples a user copies from must run as written."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_attention_example(capsys, device):
    runpy.run_path(str(ROOT / "examples" / "attention.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "Attention[" in out and "normalised squared error" in out


def test_decode_loop_example(capsys, device, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["decode_loop.py", "24"])
    runpy.run_path(str(ROOT / "examples" / "decode_loop.py"), run_name="__main__")
    assert "24 steps, 1 recording" in capsys.readouterr().out
