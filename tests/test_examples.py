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


def test_graph_api_example(capsys, device):
    from pootvk.llm import OracleLlama

    ns = runpy.run_path(str(ROOT / "examples" / "graph_api.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "colouring saves" in out and out.count("normalised squared error") == 5
    assert_close(ns["y"], ns["ref"]["y"])  # the last step, against the oracle
    oracle = OracleLlama(ns["cfg"], seed=0)
    assert ns["tokens"] == [t for t, _ in oracle.generate([1], 16)]


def test_readme_graph_api_block_runs(capsys, device):
    """The README's Builder/compile block, run as written: its last output is checked
    against the oracle with the caches the oracle carried over the same five steps."""
    from pootvk.oracle import evaluate

    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Your own graph"):]
    block = section[section.index("```python") + len("```python"):]
    block = block[: block.index("```")]
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 (the README's own code)
    assert "colouring saves" in capsys.readouterr().out
    g = ns["b"].build()
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(s).astype(np.float32) / 8 for n, s in
              [("norm", (64,)), ("wq", (64, 64)), ("wk", (64, 32)), ("wv", (64, 32)),
               ("wo", (64, 64))]}
    np.testing.assert_array_equal(params["wo"], ns["params"]["wo"])  # same draws
    params |= {"cos": ns["params"]["cos"], "sin": ns["params"]["sin"]}
    caches = {n: np.zeros((1, 2, 32, 16), np.float32) for n in ("k_cache", "v_cache")}
    for t in range(5):
        x = rng.standard_normal((1, 64)).astype(np.float32)
        ref = evaluate(g, {"x": x, "pos": np.int32(t), **params, **caches})
        caches = {n: ref[n] for n in caches}
    assert_close(ns["y"], ref["y"])


def test_readme_real_model_block_runs(capsys, device):
    """The README's ``pootvk.llm.load`` block, run as written on the real model: greedy
    text, then a seeded, sampled chat reply streamed piece by piece, and the stats it
    prints."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### A real model"):]
    block = section[section.index("```python") + len("```python"):]
    block = block[: block.index("```")]
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 (the README's own code)
    out = capsys.readouterr().out
    st = ns["tm"].stats
    assert st.prompt_tokens > 5 and 0 < st.generated <= 40 and "RunStats" in out
    assert len(out.strip()) > 40  # text came out


def test_readme_engine_block_runs(capsys, device):
    """The README's ``pootvk.llm.load_engine`` block, run as written on the real model:
    two prompts generated together, then two streamed piece by piece."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Several prompts at once"):]
    block = section[section.index("```python") + len("```python"):]
    block = block[: block.index("```")]
    ns: dict = {"pootvk": __import__("pootvk")}
    exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 (the README's own code)
    out = capsys.readouterr().out
    assert len(ns["texts"]) == 2 and all(len(t) > 20 for t in ns["texts"])
    assert out.count("0 ") >= 1 and out.count("1 ") >= 1  # pieces of both prompts
