"""An independent Llama forward in plain numpy, written straight from a GGUF file.

It shares nothing with pootvk (no IR, no oracle, no loader): the file is opened with
``gguf.GGUFReader``, every tensor dequantized with ``gguf.quants.dequantize``, and the
attention Q/K weights are used *as stored*, rows permuted by llama.cpp's converter, with
llama.cpp's own RoPE for them (mode 0: adjacent pairs (x[2i], x[2i+1]) rotated by
pos * base^(-2i/d)). pootvk un-permutes those rows and rotates HF's way (x[i] with
x[i + d/2]); agreement with this forward therefore checks the un-permutation too.

Use::

    ref = NumpyLlama(path)              # float32; dtype=np.float64 for a tighter reference
    logits = ref.prefill(prompt_ids)    # [len(prompt), vocab], causal, fills the KV cache
    nxt = ref.step(int(logits[-1].argmax()))  # [vocab], one token at the next position

``NumpyLlama.from_tensors(tensors, meta, rope="half")`` runs the same forward over other
tensors (HF-ordered Q/K rows rotated HF's way): the loader test feeds it pootvk's weights.
"""

from __future__ import annotations

import numpy as np


class NumpyLlama:
    """A llama-architecture GGUF run in numpy with a KV cache (batch 1)."""

    def __init__(self, path: str, dtype: type = np.float32, capacity: int = 4096) -> None:
        import gguf

        r = gguf.GGUFReader(str(path))
        meta = {k: f.contents() for k, f in r.fields.items()
                if not k.startswith("tokenizer.")}
        assert meta["general.architecture"] == "llama", meta["general.architecture"]
        tensors = {}
        for te in r.tensors:
            a = gguf.quants.dequantize(te.data, te.tensor_type)
            # ggml's ne is [in, out]: numpy rows are output features
            tensors[te.name] = np.asarray(a, dtype).reshape(tuple(int(n) for n in te.shape[::-1]))
        self._setup(tensors, meta, "adjacent", dtype, capacity)

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray], meta: dict, rope: str,
                     dtype: type = np.float32, capacity: int = 4096) -> NumpyLlama:
        """The same forward over given GGUF-named tensors and ``llama.*`` metadata, with
        ``rope`` "adjacent" (llama.cpp mode 0, for rows as GGUF stores them) or "half"
        (HF's x[i] with x[i + d/2], for HF-ordered rows)."""
        self = cls.__new__(cls)
        self._setup({k: np.asarray(v, dtype) for k, v in tensors.items()}, meta, rope, dtype,
                    capacity)
        return self

    def _setup(self, tensors: dict[str, np.ndarray], meta: dict, rope: str, dtype: type,
               capacity: int) -> None:
        assert rope in ("adjacent", "half"), rope
        self.rope = rope
        self.layers = int(meta["llama.block_count"])
        self.hidden = int(meta["llama.embedding_length"])
        self.n_head = int(meta["llama.attention.head_count"])
        self.n_kv = int(meta.get("llama.attention.head_count_kv", self.n_head))
        self.d = self.hidden // self.n_head
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        self.base = float(meta.get("llama.rope.freq_base", 10000.0))
        self.dtype = dtype
        self.embd = tensors["token_embd.weight"]  # [vocab, hidden]
        self.out = tensors.get("output.weight", self.embd)  # tied when absent
        self.out_norm = tensors["output_norm.weight"]
        self.blk = [{k: tensors[f"blk.{i}.{k}.weight"] for k in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
            "ffn_gate", "ffn_up", "ffn_down")} for i in range(self.layers)]
        self.capacity = capacity
        self.reset()

    def reset(self) -> None:
        """Empty the KV cache: the next token is at position 0."""
        shape = (self.n_kv, self.capacity, self.d)
        self.k = [np.zeros(shape, self.dtype) for _ in range(self.layers)]
        self.v = [np.zeros(shape, self.dtype) for _ in range(self.layers)]
        self.pos = 0

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Rotary embedding of x [n, heads, d]: pair i (angle pos * base^(-2i/d)) is
        (x[2i], x[2i+1]) for "adjacent" (llama.cpp mode 0), (x[i], x[i + d/2]) for "half"."""
        i = np.arange(self.d // 2, dtype=np.float64)
        ang = pos[:, None].astype(np.float64) * self.base ** (-2.0 * i / self.d)  # [n, d/2]
        cos = np.cos(ang).astype(self.dtype)[:, None, :]
        sin = np.sin(ang).astype(self.dtype)[:, None, :]
        first, second = ((slice(0, None, 2), slice(1, None, 2)) if self.rope == "adjacent"
                         else (slice(0, self.d // 2), slice(self.d // 2, None)))
        x0, x1 = x[..., first], x[..., second]
        out = np.empty_like(x)
        out[..., first] = x0 * cos - x1 * sin
        out[..., second] = x0 * sin + x1 * cos
        return out

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Run ``tokens`` at the next positions (causal among themselves and over the
        cache); their logits [n, vocab]."""
        n = len(tokens)
        assert self.pos + n <= self.capacity, (self.pos, n, self.capacity)
        pos = np.arange(self.pos, self.pos + n)
        end = self.pos + n
        group = self.n_head // self.n_kv
        # key j is visible to query row r (at position pos[r]) when j <= pos[r]
        mask = np.arange(end)[None, :] <= pos[:, None]  # [n, end]
        x = self.embd[np.asarray(tokens)]  # [n, hidden]
        for i, w in enumerate(self.blk):
            h = self._rms(x, w["attn_norm"])
            q = self._rope((h @ w["attn_q"].T).reshape(n, self.n_head, self.d), pos)
            k = self._rope((h @ w["attn_k"].T).reshape(n, self.n_kv, self.d), pos)
            v = (h @ w["attn_v"].T).reshape(n, self.n_kv, self.d)
            self.k[i][:, self.pos:end] = k.transpose(1, 0, 2)
            self.v[i][:, self.pos:end] = v.transpose(1, 0, 2)
            att = np.empty((n, self.n_head, self.d), self.dtype)
            for hq in range(self.n_head):
                kh, vh = self.k[i][hq // group, :end], self.v[i][hq // group, :end]
                s = (q[:, hq] @ kh.T) / np.sqrt(self.d)  # [n, end]
                s = np.where(mask, s, -np.inf)
                p = np.exp(s - s.max(axis=-1, keepdims=True))
                att[:, hq] = (p / p.sum(axis=-1, keepdims=True)) @ vh
            x = x + att.reshape(n, self.hidden) @ w["attn_output"].T
            h = self._rms(x, w["ffn_norm"])
            g = h @ w["ffn_gate"].T
            silu = g * 0.5 * (1 + np.tanh(g / 2))  # g * sigmoid(g), no overflow
            x = x + (silu * (h @ w["ffn_up"].T)) @ w["ffn_down"].T
        self.pos = end
        return self._rms(x, self.out_norm) @ self.out.T

    def prefill(self, tokens: list[int]) -> np.ndarray:
        """The prompt's logits [len(tokens), vocab] (the last row predicts the next
        token); appends to the cache (call :meth:`reset` first for a new sequence)."""
        return self.forward(list(tokens))

    def step(self, token: int) -> np.ndarray:
        """One token at the next position; its logits [vocab]."""
        return self.forward([int(token)])[0]

    def greedy(self, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
        """``steps`` greedy tokens after ``prompt`` (from a reset cache) and the logits
        that chose each."""
        self.reset()
        logits = [self.prefill(prompt)[-1]]
        out = [int(np.argmax(logits[-1]))]
        for _ in range(steps - 1):
            logits.append(self.step(out[-1]))
            out.append(int(np.argmax(logits[-1])))
        return out, logits
