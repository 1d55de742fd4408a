"""Text generation around the model: sampling, the TextModel loop (prefill, decode,
streaming, end of text, context limit) on a random-weight model with a byte tokenizer, and
the CLI's refusals."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.errors import InvalidArgument, PromptTooLong
from pootvk.llm import LlamaConfig, LlamaModel, OracleLlama, TextModel, random_weights, sample


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, end of text 256: a real (if tiny) tokenizer for a
    random-weight model of vocab 257."""

    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)


CFG = LlamaConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, hidden=64, intermediate=96,
                  vocab=257, capacity=48, weight_dtype="float16", tied_embeddings=True)


def test_sample_greedy_topk_topp_and_seed():
    logits = np.array([1.0, 3.0, 2.0, 0.5], np.float32)
    assert sample(logits) == 1
    rng = np.random.default_rng(0)
    assert {sample(logits, rng, temperature=1.0, top_k=1) for _ in range(20)} == {1}
    assert {sample(logits, rng, temperature=1.0, top_p=0.1) for _ in range(20)} == {1}
    # top_p 0.9: p = softmax = [.08, .61, .23, .05]; the nucleus is {1, 2} (.84 < .9) + 0
    assert {sample(logits, rng, temperature=1.0, top_p=0.9) for _ in range(300)} == {0, 1, 2}
    draws = [sample(logits, np.random.default_rng(7), temperature=0.8) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same draw
    p = np.exp(logits - logits.max())
    p /= p.sum()
    counts = np.bincount([sample(logits, rng, temperature=1.0) for _ in range(4000)],
                         minlength=4) / 4000
    np.testing.assert_allclose(counts, p, atol=0.03)
    for bad in (dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0)):
        with pytest.raises(InvalidArgument):
            sample(logits, rng, **bad)


def test_text_model_streams_the_oracles_greedy_text(device):
    w = random_weights(CFG, seed=2)
    prompt = "Once upon a time"
    oracle = OracleLlama(CFG, w)
    want = [t for t, _ in oracle.generate(list(prompt.encode()), 12)]
    want = want[:want.index(256)] if 256 in want else want
    tm = TextModel(LlamaModel(CFG, w, device), ByteTokenizer())
    with tm:
        assert list(tm.tokens(prompt, 12)) == want
        assert tm.stats.prompt_tokens == len(prompt) and tm.stats.generated == len(want)
        text = "".join(tm.stream(prompt, 12))
        assert text == tm.generate(prompt, 12) == ByteTokenizer().decode(want)
        a = tm.generate(prompt, 12, temperature=1.0, top_k=50, seed=3)
        assert a == tm.generate(prompt, 12, temperature=1.0, top_k=50, seed=3)
        assert tm.model.recordings == 2  # decode + one prefill bucket, replayed
        # the context ends the text: 40 prompt bytes leave 48 - 40 + 1 tokens at most
        long = "x" * 40
        assert len(list(tm.tokens(long, 100))) <= 9
        with pytest.raises(PromptTooLong) as e:
            tm.generate("y" * 48, 4)
        assert (e.value.prompt_tokens, e.value.context) == (48, 48)
        chat = [t for t, _ in OracleLlama(CFG, w).generate(list(b"<user>chat</user>"), 3)]
        chat = chat[:chat.index(256)] if 256 in chat else chat
        assert tm.generate("chat", 3, chat=True) == ByteTokenizer().decode(chat)
