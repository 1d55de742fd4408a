"""The real model on the device: SmolLM2-135M-Instruct from its GGUF (F16 weights after
dequantisation), prefilled and decoded by pootvk, against the independent numpy forward
(tests/llm/numpy_llama.py: the file's tensors as stored, llama.cpp's RoPE, float32): logits
within nse 5e-4 over a 16-token prompt and 32 decoded tokens, identical greedy tokens. Also
``load`` + ``generate`` end to end and the CLI's typed refusals."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pootvk.cli import main
from pootvk.llm import LlamaModel, Tokenizer, load_gguf
from tests.helpers import nse

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a"
STEPS = 32


@pytest.fixture(scope="module")
def smollm2_device(smollm2_path, device):  # type: ignore[no-untyped-def]
    gm = load_gguf(smollm2_path, weight_dtype="float16", capacity=64)
    cfg = replace(gm.config, tied_embeddings=gm.tied_embeddings)
    weights = {n: w for n, w in gm.weights.items() if n in cfg.weight_shapes()}
    with LlamaModel(cfg, weights, device) as model:
        yield model, Tokenizer.from_gguf(gm.file)


def test_device_model_matches_the_independent_forward(smollm2_device, smollm2_reference):
    model, tok = smollm2_device
    prompt = tok.encode(PROMPT)[:16]
    assert len(prompt) == 16
    ref = smollm2_reference
    ref.reset()
    model.reset()
    errs, got, want = [], [], []
    dev, r = model.prefill(prompt), ref.prefill(prompt)[-1]
    for i in range(STEPS):
        errs.append(nse(dev, r))
        got.append(int(np.argmax(dev)))
        want.append(int(np.argmax(r)))
        if i + 1 < STEPS:
            dev, r = model.step(want[-1]), ref.step(want[-1])
    assert got == want, (got, want)
    assert max(errs) <= 5e-4, max(errs)
    assert len(set(want)) > 8  # real text, not one repeated token
    assert model.recordings == 2  # decode + one prefill bucket, each recorded once


def test_generate_and_the_cli(smollm2_path, capsys):
    from pootvk.llm import load

    with load(smollm2_path, context=64) as tm:
        text = tm.generate("The capital of France is", 6)
        assert "Paris" in text, text
        assert tm.stats.prompt_tokens > 3 and tm.stats.generated == 6
    assert main(["generate", "x " * 80, "--context", "64", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PromptTooLong" in err[0] and "64" in err[0], err


def test_cli_refuses_a_missing_model_in_one_line(tmp_path, capsys):
    assert main(["generate", "hi", "--model", str(tmp_path / "no.gguf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ModelNotFound" in err[0] and "no.gguf" in err[0], err
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    assert main(["generate", "hi", "--model", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "UnsupportedModel" in err[0], err


def test_several_prompts_generate_together_as_each_alone(smollm2_path, capsys):
    """``pootvk generate P1 P2 P3``: the batched engine (paged KV, continuous batching)
    prints each prompt's greedy continuation, the same text each prompt gives alone."""
    from pootvk.llm import load

    prompts = ["The capital of France is", "Once upon a time", "def add(a, b):"]
    with load(smollm2_path, context=64) as tm:
        alone = [tm.generate(p, 6) for p in prompts]
    assert main(["generate", *prompts, "--context", "64", "--max-tokens", "6"]) == 0
    out = capsys.readouterr().out
    for i, (p, text) in enumerate(zip(prompts, alone, strict=True)):
        assert f"[{i}] {p}{text}" in out, (out, text)
    assert "Paris" in alone[0]
    assert main(["generate", "hi", "x " * 80, "--context", "64", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "InvalidArgument" in err[0] and "64" in err[0], err
