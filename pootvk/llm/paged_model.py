"""The Llama graph over a paged KV cache: several sequences per step, their K/V in per-layer
pools of fixed slots shared by every row (issue 11; shared/seeds "Paged KV").

Each step runs ``batch`` rows of ``tokens`` new tokens each (``tokens == 1``: a decode step,
live over each row's length; ``tokens > 1``: a prefill chunk under an additive mask the
driver builds from its block tables). The layers are :func:`~pootvk.llm.model.decoder_layers`
with this attention: the packed q/k/v projection split per token, RoPE at each token's own
position (``pos [n]``), k and v written into the layer's pools through the ``write`` map
(``ops.paged_write``: one ScatterUpdate, in place, -1 writes nothing) and attention read
through ``read`` (``ops.paged_attention``; the rewrite forms the paged-key Attention, the
read map being a SLOTMAP declared in the pool). Weight params are the fixed-capacity graph's
(``LlamaConfig.param_shapes``), so the same ``model_params`` bind both.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ..ir import I32, Graph, SlotKind, Var
from ..ops import Builder
from ..ops.paged import paged_attention, paged_write
from .model import LlamaConfig, as_f32, declare_weights, decoder_layers, lm_logits


def pool_names(cfg: LlamaConfig) -> list[str]:
    """The state slots of the paged graph: each layer's K and V pool."""
    return [f"l{i}.{kv}_pool" for i in range(cfg.layers) for kv in "kv"]


def trace_llama_paged(cfg: LlamaConfig, batch: int, tokens: int, pool_slots: int,
                      keys: int) -> Graph:
    """One paged step of ``batch`` rows x ``tokens`` tokens over ``keys`` logical positions.

    Slots: ``tokens`` i32 [n] (n = batch * tokens; row r's token i is entry r * tokens + i),
    ``pos`` i32 [n] (each token's position, for RoPE: in [0, capacity)), ``write`` (WRITEMAP
    [n]: the pool slot each token's K/V goes to, -1 for padding), ``read`` (SLOTMAP
    [batch, keys] in [0, pool_slots)), and ``len`` i32 [batch] in [1, keys] (decode) or
    ``mask`` f32 [batch, 1, tokens, keys] (a prefill chunk: 0 where a token sees a key,
    -inf elsewhere) plus ``last`` i32 [batch] (the entry whose logits each row exports);
    the pools ``l{i}.k_pool`` / ``l{i}.v_pool`` [pool_slots, kv_heads, head_dim] (state).
    Exports ``logits`` f32 [batch, vocab]."""
    if batch < 1 or tokens < 1 or not 1 <= keys <= cfg.capacity or pool_slots < 1:
        raise InvalidArgument("paged step", "batch, tokens, pool_slots >= 1 and keys in "
                              f"[1, capacity={cfg.capacity}]",
                              (batch, tokens, pool_slots, keys))
    b = Builder()
    w = declare_weights(b, cfg)
    hq, hkv, d = cfg.q_heads, cfg.kv_heads, cfg.head_dim
    n = batch * tokens
    token = b.tokens("tokens", (n,), cfg.vocab)
    pos = b.slot("pos", SlotKind.POS, (n,), I32, (0, cfg.capacity - 1))
    write = b.writemap("write", n, pool_slots)
    read = b.slotmap("read", (batch, keys), pool_slots)
    if tokens == 1:
        length, mask, last = b.slot("len", SlotKind.LEN, (batch,), I32, (1, keys)), None, None
    else:
        length, mask = None, b.input("mask", (batch, 1, tokens, keys))
        last = b.slot("last", SlotKind.POS, (batch,), I32, (0, n - 1))
    # each token's RoPE rows, broadcast over the heads: [n, 1, d]
    cs = b.reshape(as_f32(b, b.gather(w["rope_cos"], pos)), (n, 1, d))
    sn = b.reshape(as_f32(b, b.gather(w["rope_sin"], pos)), (n, 1, d))

    def rotate(x: Var) -> Var:  # x [n, H, d]: x * cos + concat(hi, lo) * sin (folded tables)
        h = x.shape[1]
        lo = b.slice(x, (0, 0, 0), (n, h, d // 2))
        hi = b.slice(x, (0, 0, d // 2), (n, h, d))
        return b.add(b.mul(x, cs), b.mul(b.concat([hi, lo], axis=2), sn))

    def per_row(x: Var, h: int) -> Var:  # [n, h, d] -> [batch, h, tokens, d]
        if tokens == 1:
            return b.reshape(x, (batch, h, 1, d))
        return b.transpose(b.reshape(x, (batch, tokens, h, d)), (0, 2, 1, 3))

    def attend(i: int, packed: Var) -> Var:
        qkv = b.reshape(packed, (n, hq + 2 * hkv, d))
        q = rotate(b.slice(qkv, (0, 0, 0), (n, hq, d)))
        k = rotate(b.slice(qkv, (0, hq, 0), (n, hq + hkv, d)))
        v = b.slice(qkv, (0, hq + hkv, 0), (n, hq + 2 * hkv, d))
        if cfg.cache_dtype.is_16bit:
            k, v = b.convert(k, cfg.cache_dtype), b.convert(v, cfg.cache_dtype)
        pools = []
        for name, rows in (("k", k), ("v", v)):
            pool = b.state(f"l{i}.{name}_pool", (pool_slots, hkv, d), cfg.cache_dtype)
            pool = paged_write(b, pool, rows, write)
            b.set_state(f"l{i}.{name}_pool", pool)
            pools.append(pool)
        att = paged_attention(b, per_row(q, hq), pools[0], pools[1], read, length=length,
                              mask=mask, guard=f"l{i}.len")  # [batch, hq, tokens, d]
        if tokens > 1:
            att = b.transpose(att, (0, 2, 1, 3))  # [batch, tokens, hq, d]
        return b.reshape(att, (n, hq * d))

    x = decoder_layers(b, cfg, w, as_f32(b, b.gather(w["embed"], token)), attend)
    if last is not None:
        x = b.gather(x, last)  # [batch, hidden]: each row's last real token
    b.export("logits", lm_logits(b, cfg, w, x))
    return b.build()
