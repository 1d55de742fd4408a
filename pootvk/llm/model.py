"""A Llama-shaped decoder as one pootvk graph: the test model of issue 9.

Per layer: RMSNorm -> q/k/v projections -> RoPE (HF's non-interleaved convention) ->
GQA attention over a KV cache held as state (the new row written at ``pos`` by
DynamicUpdateSlice, the causal mask built in-graph, the chain the rewrite fuses into one
Attention kernel) -> output projection + residual -> RMSNorm -> SwiGLU MLP
(down(silu(gate) * up)) + residual; then a final RMSNorm and the LM head. One token per step
(batch 1): the graph is recorded once and replayed for every token; greedy decoding takes
the logits' argmax on the host.

Weights are [in, out] matrices (``x @ W``; HF stores [out, in]) and may be stored F16: a
16-bit weight is a 16-bit param converted to F32 right before its use, so the math is F32.
The KV caches are F32.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import CapacityExceeded, InvalidArgument
from ..ir import F16, F32, DType, Graph, Var
from ..ops import Builder, rope_tables
from ..oracle import evaluate
from ..runtime.program import Program
from ..vk import Device

WEIGHT_DTYPES: dict[str, DType] = {"float32": F32, "float16": F16}


@dataclass(frozen=True)
class LlamaConfig:
    layers: int = 4
    q_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    hidden: int = 256
    intermediate: int = 512
    vocab: int = 512
    capacity: int = 512
    rope_theta: float = 10000.0
    eps: float = 1e-5
    weight_dtype: str = "float32"  # or "float16"

    def __post_init__(self) -> None:
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise InvalidArgument("weight_dtype", f"one of {sorted(WEIGHT_DTYPES)}",
                                  self.weight_dtype)
        if self.q_heads % self.kv_heads:
            raise InvalidArgument("q_heads", f"a multiple of kv_heads={self.kv_heads}",
                                  self.q_heads)

    @property
    def dtype(self) -> DType:
        return WEIGHT_DTYPES[self.weight_dtype]

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight param (stored in ``dtype``) by name."""
        h, f, d = self.hidden, self.intermediate, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab, h)}
        for i in range(self.layers):
            shapes |= {
                f"l{i}.attn_norm": (h,), f"l{i}.wq": (h, self.q_heads * d),
                f"l{i}.wk": (h, self.kv_heads * d), f"l{i}.wv": (h, self.kv_heads * d),
                f"l{i}.wo": (self.q_heads * d, h), f"l{i}.mlp_norm": (h,),
                f"l{i}.w_gate": (h, f), f"l{i}.w_up": (h, f), f"l{i}.w_down": (f, h),
            }
        return shapes | {"norm": (h,), "lm_head": (h, self.vocab)}

    def cache_names(self) -> list[str]:
        return [f"l{i}.{kv}_cache" for i in range(self.layers) for kv in "kv"]


def trace_llama(cfg: LlamaConfig) -> Graph:
    """One decode step: slots ``token`` (i32[1] in [0, vocab)), ``pos`` (in [0, capacity)),
    the weights, ``rope_cos``/``rope_sin`` tables (F32 params) and the caches (state);
    exports ``logits`` f32[1, vocab]."""
    b = Builder()
    w = {n: b.param(n, s, cfg.dtype) for n, s in cfg.weight_shapes().items()}
    cos = b.param("rope_cos", (cfg.capacity, cfg.head_dim // 2))
    sin = b.param("rope_sin", (cfg.capacity, cfg.head_dim // 2))
    token = b.tokens("token", (1,), cfg.vocab)
    pos = b.pos("pos", 0, cfg.capacity - 1)
    hq, hkv, d = cfg.q_heads, cfg.kv_heads, cfg.head_dim

    def f32(v: Var) -> Var:
        return v if v.dtype is F32 else b.convert(v, F32)

    def linear(x: Var, name: str) -> Var:
        return b.matmul(x, f32(w[name]))

    x = f32(b.gather(w["embed"], token))  # [1, hidden]
    for i in range(cfg.layers):
        h = b.rms_norm(x, w[f"l{i}.attn_norm"], cfg.eps)
        q = b.rope(b.reshape(linear(h, f"l{i}.wq"), (1, hq, 1, d)), pos, cos, sin)
        k = b.rope(b.reshape(linear(h, f"l{i}.wk"), (1, hkv, 1, d)), pos, cos, sin)
        v = b.reshape(linear(h, f"l{i}.wv"), (1, hkv, 1, d))
        kc = b.state(f"l{i}.k_cache", (1, hkv, cfg.capacity, d))
        vc = b.state(f"l{i}.v_cache", (1, hkv, cfg.capacity, d))
        att, kc2, vc2 = b.attention_decode(q, k, v, kc, vc, pos)
        b.set_state(f"l{i}.k_cache", kc2)
        b.set_state(f"l{i}.v_cache", vc2)
        x = b.add(x, linear(b.reshape(att, (1, hq * d)), f"l{i}.wo"))
        h = b.rms_norm(x, w[f"l{i}.mlp_norm"], cfg.eps)
        gate = b.silu(linear(h, f"l{i}.w_gate"))
        x = b.add(x, linear(b.mul(gate, linear(h, f"l{i}.w_up")), f"l{i}.w_down"))
    b.export("logits", linear(b.rms_norm(x, w["norm"], cfg.eps), "lm_head"))
    return b.build()


def random_weights(cfg: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded weights in their storage dtype (matrices ~ N(0, 1/fan_in), norm weights near
    1, an embedding of unit rows) and the RoPE tables: every param of :func:`trace_llama`."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in cfg.weight_shapes().items():
        if len(shape) == 1:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "embed":
            a = rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[0])
        out[name] = a.astype(cfg.dtype.numpy)
    out["rope_cos"], out["rope_sin"] = rope_tables(cfg.capacity, cfg.head_dim, cfg.rope_theta)
    return out


class _Decoder(ABC):
    """Greedy decoding over a step function ``(token, pos) -> logits [vocab]``: the device
    model and its oracle twin share the position bookkeeping and the greedy loop."""

    cfg: LlamaConfig
    position: int

    @abstractmethod
    def _step(self, token: int, pos: int) -> np.ndarray:
        """Run one token at ``pos``; the logits f32[vocab]."""

    def step(self, token: int) -> np.ndarray:
        """Feed one token at the next position; returns its logits f32[vocab]."""
        if self.position >= self.cfg.capacity:
            raise CapacityExceeded(self.position, 1, self.cfg.capacity)
        logits = self._step(int(token), self.position)
        self.position += 1
        return logits

    def generate(self, prompt: list[int], steps: int) -> Iterator[tuple[int, np.ndarray]]:
        """Feed ``prompt`` then ``steps`` greedy tokens; yields (next token, its logits) once
        per generated token (the prompt's last token's logits give the first)."""
        for t in prompt[:-1]:
            self.step(t)
        token = prompt[-1]
        for _ in range(steps):
            logits = self.step(token)
            token = int(np.argmax(logits))
            yield token, logits


class LlamaModel(_Decoder):
    """The model on a Vulkan device: traced, compiled and recorded once (``recordings``
    stays 1), weights written once, caches kept on the device between steps."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, np.ndarray] | None = None,
                 device: Device | int | str | None = None, *, seed: int = 0,
                 timestamps: bool = False) -> None:
        self.cfg = cfg
        self.graph = trace_llama(cfg)
        self.program = Program(self.graph, device, timestamps=timestamps)
        self.program.set_params(**(weights if weights is not None else
                                   random_weights(cfg, seed)))
        self.position = 0

    @property
    def recordings(self) -> int:
        return self.program.recordings

    def _step(self, token: int, pos: int) -> np.ndarray:
        out = self.program(token=np.array([token], np.int32), pos=np.int32(pos))
        return out["logits"][0]

    def reset(self) -> None:
        """A new sequence: position 0, caches zeroed."""
        for name in self.cfg.cache_names():
            s = self.graph.slot(name)
            self.program.set_state(name, np.zeros(s.var.shape, np.float32))
        self.position = 0

    def close(self) -> None:
        self.program.close()

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OracleLlama(_Decoder):
    """The same graph run by the numpy oracle, the caches carried from step to step: the
    reference the device model is tested against."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, np.ndarray] | None = None, *,
                 seed: int = 0, graph: Graph | None = None,
                 run: Callable[[Graph, dict], dict] = evaluate) -> None:
        self.cfg = cfg
        self.graph = graph if graph is not None else trace_llama(cfg)
        self.weights = dict(weights if weights is not None else random_weights(cfg, seed))
        self.states = {n: np.zeros(self.graph.slot(n).var.shape, np.float32)
                       for n in cfg.cache_names()}
        self._run = run
        self.position = 0

    def _step(self, token: int, pos: int) -> np.ndarray:
        out = self._run(self.graph, {**self.weights, **self.states,
                                     "token": np.array([token], np.int32),
                                     "pos": np.int32(pos)})
        self.states = {n: out[n] for n in self.states}
        return out["logits"][0]
