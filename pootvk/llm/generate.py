"""Text in, text out: a Llama model on a device with its tokenizer.

``load("smollm2")`` (a packaged model) or ``load(path)`` (any llama-architecture GGUF)
reads the file (``llm.gguf``: config, weights dequantized to F16, the tokenizer and chat
template from its metadata), builds a :class:`~pootvk.llm.model.LlamaModel` (decode graph
recorded at once, prefill buckets on first use, one KV cache on the device) and returns a
:class:`TextModel`. Each ``generate``/``stream`` call is a new sequence: the prompt is
prefilled in one graph (padded to a bucket), then each token is one replay of the decode
graph and a host-side draw (``llm.sampling``) from its logits.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import PromptTooLong
from ..vk import Device
from .gguf import Progress
from .model import LlamaConfig, LlamaModel
from .sampling import check_sampling, sample

if TYPE_CHECKING:
    from .engine import Engine


class Tokenizer(Protocol):
    """What generation needs of a tokenizer (``llm.tokenizer.Tokenizer`` has it)."""

    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def render_chat(self, messages: list[dict[str, str]]) -> str: ...


@dataclass
class RunStats:
    """The last call's counts and times (prefill: the prompt's one graph; decode: every
    later token, sampling and detokenising included)."""

    prompt_tokens: int = 0
    prefill_s: float = 0.0
    generated: int = 0
    decode_s: float = 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first (the first comes from the prefill's logits)."""
        n = self.generated - 1
        return n / self.decode_s if n > 0 and self.decode_s else 0.0


def encode_prompt(tokenizer: Tokenizer, prompt: str, chat: bool = False) -> list[int]:
    """The prompt's ids; with ``chat`` it is one user message through the model's chat
    template, ending where the assistant's reply starts."""
    if chat:
        prompt = tokenizer.render_chat([{"role": "user", "content": prompt}])
    return tokenizer.encode(prompt)


class TextModel:
    """A model and its tokenizer: ``generate`` returns the text, ``stream`` yields it piece
    by piece as tokens are produced, ``tokens`` yields the ids."""

    def __init__(self, model: LlamaModel, tokenizer: Tokenizer, name: str = "model") -> None:
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.stats = RunStats()

    @property
    def config(self) -> LlamaConfig:
        return self.model.cfg

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat)

    def tokens(self, prompt: str, max_tokens: int = 64, *, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
               chat: bool = False) -> Iterator[int]:
        """Generated token ids, one per decode step, up to ``max_tokens``, the end-of-text
        token (not yielded) or the context's end. A prompt that leaves no room for one
        token raises PromptTooLong before anything runs."""
        check_sampling(temperature, top_k, top_p)
        ids = self.encode(prompt, chat)
        cap = self.model.cfg.capacity
        if len(ids) >= cap:
            raise PromptTooLong(len(ids), cap)
        rng = np.random.default_rng(seed)
        m, st = self.model, RunStats(prompt_tokens=len(ids))
        self.stats = st
        m.reset()
        m.prepare(len(ids))  # a bucket's first use compiles: not prefill time
        t0 = time.perf_counter()
        logits = m.prefill(ids)
        st.prefill_s = time.perf_counter() - t0
        t0, token = time.perf_counter(), -1
        for i in range(min(int(max_tokens), cap - len(ids) + 1)):
            if i:
                logits = m.step(token)
            token = sample(logits, rng, temperature=temperature, top_k=top_k, top_p=top_p)
            if token == self.tokenizer.eos_id:
                break
            st.generated += 1
            st.decode_s = time.perf_counter() - t0
            yield token
            t0 = time.perf_counter() - st.decode_s  # time spent by the caller not counted

    def stream(self, prompt: str, max_tokens: int = 64, **kw: object) -> Iterator[str]:
        """The text as it is produced: each yield is what the tokens so far add (a piece
        holds back an incomplete UTF-8 character until its last byte arrives)."""
        ids: list[int] = []
        shown = ""
        for t in self.tokens(prompt, max_tokens, **kw):  # type: ignore[arg-type]
            ids.append(t)
            text = self.tokenizer.decode(ids)
            if text.endswith("\ufffd"):
                continue
            if text.startswith(shown):
                yield text[len(shown):]
                shown = text
        text = self.tokenizer.decode(ids)
        if text != shown and text.startswith(shown):
            yield text[len(shown):]

    def generate(self, prompt: str, max_tokens: int = 64, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 chat: bool = False) -> str:
        """The generated text (the prompt not included)."""
        return "".join(self.stream(prompt, max_tokens, temperature=temperature, top_k=top_k,
                                   top_p=top_p, seed=seed, chat=chat))

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> TextModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: KV cache rows ``load`` gives a model unless told (the file's context may be far larger)
DEFAULT_CONTEXT = 2048


def load(model: str | os.PathLike[str] = "smollm2",
         device: Device | int | str | None = None, *, context: int = DEFAULT_CONTEXT,
         weight_dtype: str = "float16", kv_dtype: str = "float32",
         timestamps: bool = False, progress: Progress | None = None) -> TextModel:
    """A packaged model by name (``"smollm2"``) or a llama-architecture GGUF by path, on
    ``device``, with a KV cache of ``context`` rows. Refusals are typed (``errors``): an
    unknown name or path, a file of another architecture or an unreadable tensor type.
    ``progress`` (``llm.gguf.Progress``) hears of each loaded layer."""
    from .gguf import load_gguf
    from .tokenizer import Tokenizer as GGUFTokenizer

    gm = load_gguf(model, weight_dtype=weight_dtype, capacity=context, progress=progress)
    cfg = replace(gm.config, tied_embeddings=gm.tied_embeddings, kv_dtype=kv_dtype)
    weights = {n: w for n, w in gm.weights.items() if n in cfg.weight_shapes()}
    tok = GGUFTokenizer.from_gguf(gm.file)
    return TextModel(LlamaModel(cfg, weights, device, timestamps=timestamps), tok,
                     name=gm.path.name)


class TextEngine:
    """Several prompts at once through the batched engine (``llm.engine.Engine``: paged KV,
    continuous batching, prefix caching) with the model's tokenizer. ``stream``
    yields ``(prompt index, text piece)`` as each request produces it, ``generate`` returns
    the texts (prompts not included)."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, name: str = "model") -> None:
        self.engine, self.tokenizer, self.name = engine, tokenizer, name
        self.generated_tokens = 0  # of the last stream/generate call (end-of-text not counted)

    def stream(self, prompts: Sequence[str], max_tokens: int = 64, *, chat: bool = False,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None) -> Iterator[tuple[int, str]]:
        """(prompt index, text piece) as the requests produce them; sampling as
        ``Engine.submit`` (a ``seed`` s gives prompt i the seed s + i)."""
        ids = [encode_prompt(self.tokenizer, p, chat) for p in prompts]
        index = {self.engine.submit(x, max_tokens, temperature=temperature, top_k=top_k,
                                    top_p=top_p, seed=None if seed is None else seed + i): i
                 for i, x in enumerate(ids)}
        got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
        shown = dict.fromkeys(range(len(prompts)), "")
        eos = self.tokenizer.eos_id
        self.generated_tokens = 0
        while self.engine.busy:
            for rid, tok in self.engine.step():
                i = index[rid]
                if tok == eos:
                    continue
                self.generated_tokens += 1
                got[i].append(tok)
                text = self.tokenizer.decode(got[i])
                if not text.endswith("\ufffd") and text.startswith(shown[i]):
                    yield i, text[len(shown[i]):]
                    shown[i] = text

    def generate(self, prompts: Sequence[str], max_tokens: int = 64, *, chat: bool = False,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None) -> list[str]:
        out = [""] * len(prompts)
        for i, piece in self.stream(prompts, max_tokens, chat=chat, temperature=temperature,
                                    top_k=top_k, top_p=top_p, seed=seed):
            out[i] += piece
        return out

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> TextEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_engine(model: str | os.PathLike[str] = "smollm2",
                device: Device | int | str | None = None, *, context: int = DEFAULT_CONTEXT,
                max_batch: int = 8, pool_tokens: int | None = None, chunk: int | None = None,
                weight_dtype: str = "float16", kv_dtype: str = "float32",
                progress: Progress | None = None) -> TextEngine:
    """``load``'s model as a batched :class:`TextEngine` of ``max_batch`` rows, ``context``
    positions a request, K/V in a pool of ``pool_tokens`` slots (default: ``max_batch x
    context``); its prefix cache keyed to the file's digest."""
    from .engine import Engine
    from .gguf import load_gguf
    from .prefix_cache import WeightsIdentity
    from .tokenizer import Tokenizer as GGUFTokenizer

    gm = load_gguf(model, weight_dtype=weight_dtype, capacity=context, progress=progress)
    cfg = replace(gm.config, tied_embeddings=gm.tied_embeddings, kv_dtype=kv_dtype)
    weights = {n: w for n, w in gm.weights.items() if n in cfg.weight_shapes()}
    tok = GGUFTokenizer.from_gguf(gm.file)
    eng = Engine(cfg, weights, max_batch=max_batch, pool_tokens=pool_tokens, chunk=chunk,
                 device=device, identity=WeightsIdentity.of_file(gm.path), eos_id=tok.eos_id)
    return TextEngine(eng, tok, name=gm.path.name)
