"""The tokenizer and chat template from GGUF metadata (issue 10 item 2), on SmolLM2's real
vocabulary: round trips, ids derived without the ``tokenizers`` library (vocabulary
look-ups and a by-hand BPE over the file's merges), control tokens, the chat template, and
refusals."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.errors import UnsupportedModel
from pootvk.llm.gguf import GGUFFile
from pootvk.llm.tokenizer import Tokenizer

TEXT = ("Once upon a time, in 2024, a naïve café owner said: \"Hello,   world!\"\n\n"
        "\tIndented line — 日本語, emoji 🙂 and trailing spaces   \n")


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table (bytes_to_unicode)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _hand_bpe(piece: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Byte-level BPE of one pre-tokenized piece, by definition: start from one symbol per
    byte, repeatedly merge the adjacent pair of lowest rank."""
    table = _byte_chars()
    syms = [table[b] for b in piece.encode("utf-8")]
    while len(syms) > 1:
        best = min(range(len(syms) - 1),
                   key=lambda i: ranks.get((syms[i], syms[i + 1]), 1 << 30))
        if (syms[best], syms[best + 1]) not in ranks:
            break
        syms[best:best + 2] = [syms[best] + syms[best + 1]]
    return syms


def test_round_trip_of_a_fixed_text(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert all(0 <= i < tok.vocab_size for i in ids) and len(ids) < len(TEXT.encode())
    assert tok.decode([]) == "" and tok.encode("") == []


def test_known_ids_from_the_vocabulary(smollm2_tokenizer):
    """Whole words are single vocabulary entries; digits come one by one (the vocabulary
    has no multi-digit token); Ġ is a leading space, Ċ a newline."""
    tok = smollm2_tokenizer
    v = {t: i for i, t in enumerate(tok.tokens)}
    assert tok.encode("Once upon a time") == [v["Once"], v["Ġupon"], v["Ġa"], v["Ġtime"]]
    assert tok.encode("Hello world\n") == [v["Hello"], v["Ġworld"], v["Ċ"]]
    assert tok.encode("in 2024") == [v["in"], v["Ġ"], v["2"], v["0"], v["2"], v["4"]]
    assert [tok.token_text(i) for i in tok.encode("Once upon")] == ["Once", "Ġupon"]


def test_multibyte_words_match_a_by_hand_bpe(smollm2_tokenizer, smollm2_file):
    """Words the vocabulary does not hold whole: the library's BPE gives the by-hand BPE
    over the file's ranked merges."""
    f = smollm2_file
    ranks = {tuple(m.split(" ", 1)): r
             for r, m in enumerate(f.field("tokenizer.ggml.merges"))}
    v = {t: i for i, t in enumerate(smollm2_tokenizer.tokens)}
    for pieces in [["naïve", " café"], [" 日本語"], [" emoji", " 🙂"], ["Tokenization"],
                   [" unbelievably", " supercalifragilistic"]]:
        want = [v[s] for p in pieces for s in _hand_bpe(p, ranks)]
        assert smollm2_tokenizer.encode("".join(pieces)) == want, pieces


def test_control_tokens_and_the_chat_template(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, False)
    assert tok.tokens[1] == "<|im_start|>" and tok.tokens[2] == "<|im_end|>"
    msgs = [{"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."}]
    text = tok.render_chat(msgs, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\nParis.<|im_end|>\n")
    prompt = tok.render_chat(msgs[:1])
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(prompt)
    v = {t: i for i, t in enumerate(tok.tokens)}
    last = len(ids) - 1 - ids[::-1].index(1)  # the last <|im_start|>
    assert ids[:3] == [1, v["system"], v["Ċ"]] and tok.decode(ids[last + 1:]) == "assistant\n"
    assert ids.count(1) == 3 and ids.count(2) == 2
    assert tok.decode(ids) == prompt
    assert tok.decode(ids, skip_special=True).startswith("system\nYou are")
    own = tok.render_chat([{"role": "system", "content": "Be brief."}, *msgs[:1]])
    assert own.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")


def test_add_bos_and_refusals(tmp_path):
    tokens = ["<s>", "a", "b", "ab", "Ġ", "Ġab"]
    tok = Tokenizer(tokens, ["a b", "Ġ ab"], "gpt2", [3, 1, 1, 1, 1, 1], bos_id=0,
                    add_bos=True)
    assert tok.encode("ab ab") == [0, 3, 5] and tok.encode("ab", add_special=False) == [3]
    assert tok.decode(tok.encode("ab ab"), skip_special=True) == "ab ab"
    with pytest.raises(UnsupportedModel, match="tokenizer.ggml.pre = 'qwen2'"):
        Tokenizer(tokens, [], "qwen2")
    import gguf

    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "▁a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModel, match="tokenizer.ggml.model = 'llama'"):
        Tokenizer.from_gguf(GGUFFile(path))
    with pytest.raises(UnsupportedModel, match="chat_template"):
        tok.render_chat([{"role": "user", "content": "x"}])
    assert np.array_equal(tok.encode("ba"), [0, 2, 1])


def test_chat_template_tokenizer_and_reference_answer_a_question(smollm2_tokenizer,
                                                                  smollm2_reference):
    """End to end through the independent forward: the rendered chat prompt, encoded, gets
    the model's (greedy) answer, and it ends at <|im_end|>. A broken template, special-token
    handling or BPE gives the model text it was not trained on, and this answer goes."""
    tok = smollm2_tokenizer
    ids = tok.encode(tok.render_chat([{"role": "user",
                                       "content": "What is the capital of France?"}]))
    out, _ = smollm2_reference.greedy(ids, 10)
    assert tok.eos_id in out
    answer = tok.decode(out[:out.index(tok.eos_id)])
    assert "Paris" in answer, answer
