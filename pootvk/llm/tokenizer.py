"""The model's tokenizer and chat template, built from GGUF metadata.

GGUF ``tokenizer.ggml.model = "gpt2"`` is byte-level BPE: ``tokens`` is the vocabulary
(byte-level strings, id = index), ``merges`` the ranked merge rules ("a b"), and
``tokenizer.ggml.pre`` names the pre-tokenizer (the regex split before BPE). They are
rebuilt here with the ``tokenizers`` library into the tokenizer HF ships with the model:
for ``pre = "smollm"`` (llama.cpp: split every digit, then GPT-2's regex) that is HF's
``Digits(individual_digits=True)`` then ``ByteLevel(add_prefix_space=False)``. Control
tokens (token type 3: ``<|im_start|>`` ...) are special tokens, matched whole in the input.

The chat template (``tokenizer.chat_template``, Jinja) is rendered in a sandboxed jinja2
environment with HF's settings (``trim_blocks``, ``lstrip_blocks``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UnsupportedModel
from .gguf import GGUFFile

CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


def _gpt2_pre() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm_pre() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    _gpt2_pre()])


#: ``tokenizer.ggml.pre`` -> the pre-tokenizer llama.cpp runs for it, in ``tokenizers``.
PRE_TOKENIZERS: dict[str, Callable[[], Any]] = {
    "gpt2": _gpt2_pre, "smollm": _smollm_pre, "starcoder": _smollm_pre,
}


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], pre: str,
                 token_types: Sequence[int] | None = None, *, bos_id: int | None = None,
                 eos_id: int | None = None, add_bos: bool = False,
                 chat_template: str | None = None, source: str = "<memory>") -> None:
        from tokenizers import AddedToken, decoders, models
        from tokenizers import Tokenizer as HFTokenizer

        if pre not in PRE_TOKENIZERS:
            raise UnsupportedModel(source, "tokenizer.ggml.pre", pre, sorted(PRE_TOKENIZERS))
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        self._tok = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                                           byte_fallback=False))
        self._tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
        self._tok.decoder = decoders.ByteLevel()
        if token_types is not None:
            self._tok.add_special_tokens([
                AddedToken(t, special=True, normalized=False)
                for t, kind in zip(tokens, token_types, strict=True) if kind == CONTROL])
        self.tokens = list(tokens)
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
        self.chat_template = chat_template

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Tokenizer:
        """The tokenizer a GGUF file's metadata describes (byte-level BPE only)."""
        kind = f.field("tokenizer.ggml.model")
        if kind != "gpt2":
            raise UnsupportedModel(str(f.path), "tokenizer.ggml.model", kind,
                                   ["gpt2 (byte-level BPE)"])
        return cls(
            f.field("tokenizer.ggml.tokens"), f.field("tokenizer.ggml.merges"),
            str(f.field("tokenizer.ggml.pre", "default")),
            f.field("tokenizer.ggml.token_type", None),
            bos_id=_opt_int(f.field("tokenizer.ggml.bos_token_id", None)),
            eos_id=_opt_int(f.field("tokenizer.ggml.eos_token_id", None)),
            add_bos=bool(f.field("tokenizer.ggml.add_bos_token", False)),
            chat_template=f.field("tokenizer.chat_template", None),
            source=str(f.path),
        )

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of ``text``; BOS first when the model asks for it (``add_bos_token``)
        and ``add_special``. Control tokens written in the text (``<|im_start|>``) encode
        to their ids."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of ``ids`` (bytes that are not yet valid UTF-8 decode to U+FFFD: decode a
        growing prefix, not one token at a time, to stream text)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def token_text(self, i: int) -> str:
        """Vocabulary entry ``i`` as stored (byte-level: a space is ``Ġ``)."""
        return self.tokens[i]

    def render_chat(self, messages: Sequence[dict[str, str]],
                    add_generation_prompt: bool = True) -> str:
        """``messages`` ([{"role": ..., "content": ...}]) through the model's chat
        template; with ``add_generation_prompt`` the text ends where the reply starts."""
        if self.chat_template is None:
            raise UnsupportedModel("<tokenizer>", "tokenizer.chat_template", None,
                                   ["a Jinja chat template"])
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise ValueError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        special = {"bos_token": self._text(self.bos_id), "eos_token": self._text(self.eos_id)}
        return env.from_string(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **special)

    def _text(self, i: int | None) -> str:
        return "" if i is None else self.tokens[i]


def _opt_int(v: object) -> int | None:
    return None if v is None else int(v)  # type: ignore[arg-type]
