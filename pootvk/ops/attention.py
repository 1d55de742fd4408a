"""Attention as primitive equations, exactly the chain of the seed document.

No attention opcode is emitted here: ``passes.attention_rewrite`` recognises the chain and
fuses it. The causal mask is built in the graph from Iota against the position slot, so
nothing per-step is baked into a kernel.
"""

from __future__ import annotations

import math
import numbers

from ..errors import ShapeError
from ..ir import BF16, F16, F32, I32, CompareOp, DType, Graph, ReduceOp, Var, check_attention
from .builder import Builder

NEG_INF = float("-inf")


KV_DTYPES = (F32, F16, BF16)


def _check_kv_dtype(kv_dtype: object) -> None:
    if kv_dtype not in KV_DTYPES:
        raise ShapeError(f"K/V storage dtype {kv_dtype!r} is not one of {list(KV_DTYPES)}")


def repeat_kv(b: Builder, x: Var, n_rep: int) -> Var:
    """GQA repeat over the head axis: Reshape -> Broadcast -> Reshape; nothing when n_rep == 1."""
    if n_rep == 1:
        return x
    bb, hkv, length, d = x.shape
    y = b.reshape(x, (bb, hkv, 1, length, d))
    y = b.broadcast(y, (bb, hkv, n_rep, length, d))
    return b.reshape(y, (bb, hkv * n_rep, length, d))


def causal_mask(b: Builder, pos: Var, lq: int, lk: int) -> Var:
    """Additive [1, 1, lq, lk] mask: 0 where key j <= pos + i, -inf past it."""
    key = b.iota((1, 1, lq, lk), axis=3)
    limit: Var = pos
    if lq > 1:
        limit = b.add(b.iota((1, 1, lq, lk), axis=2), pos)
    visible = b.compare(CompareOp.LE, key, limit)
    return b.select(visible, 0.0, NEG_INF)


def softmax(b: Builder, x: Var) -> Var:
    """Max-subtracted softmax over the last axis."""
    m = b.reduce(ReduceOp.MAX, x, axis=-1, keepdim=True)
    ex = b.exp(b.sub(x, m))
    s = b.reduce(ReduceOp.SUM, ex, axis=-1, keepdim=True)
    return b.div(ex, s)


def split_key(b: Builder, k: Var, k_shared: Var) -> Var:
    """The whole key of a split-key (latent) attention: concat(k, broadcast(k_shared)) on
    the last axis, k [B,Hkv,Lk,Dk-s], k_shared [B,1,Lk,s] -> [B,Hkv,Lk,Dk]. The rewrite
    recognises this and keeps the two parts as operands (the broadcast key is never built)."""
    bb, hkv, lk, _ = k.shape
    shared = b.broadcast(k_shared, (bb, hkv, lk, k_shared.shape[3]))
    return b.concat([k, shared], axis=3)


def attention_core(
    b: Builder,
    q: Var,
    k: Var,
    v: Var,
    mask: Var | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    k_shared: Var | None = None,
) -> Var:
    """softmax(cap(q k^T * scale) + mask) v over [B, H, L, D] operands (GQA by repeat_kv).

    With ``k_shared`` [B,1,Lk,s] the key is split: head g's key is concat(k[:, g],
    k_shared[:, 0]) (:func:`split_key`), q has the whole width Dk = k's width + s, and the
    scale defaults to 1/sqrt(Dk). Operands are validated by the one attention validator
    (``ir.check_attention``)."""
    return _attend(b, q, k, v, mask, scale, softcap, None, k_shared)


def _attend(
    b: Builder, q: Var, k: Var, v: Var, mask: Var | None, scale: float | None,
    softcap: float | None, length: Var | None, k_shared: Var | None = None,
) -> Var:
    """The chain itself; with ``length`` (an I32 [B] already guarded) the live selects."""
    check_attention(
        q.shape, k.shape, v.shape, None if mask is None else mask.shape, softcap=softcap,
        k_shared=None if k_shared is None else k_shared.shape,
    )
    n_rep = q.shape[1] // k.shape[1]
    if k_shared is not None:
        if k_shared.dtype is not k.dtype:
            raise ShapeError(f"k_shared is {k_shared.dtype.value} but k is {k.dtype.value}")
        k = split_key(b, k, k_shared)  # in the storage dtype: Convert below sees one key
    # 16-bit K/V (storage) are converted to F32 for the math; the rewrite folds the
    # conversion into the fused kernel, which reads them 16-bit
    if k.dtype is not F32:
        k = b.convert(k, F32)
    if v.dtype is not F32:
        v = b.convert(v, F32)
    live_keys: Var | None = None
    if length is not None:
        bb, lk = k.shape[0], k.shape[2]
        lb = b.reshape(length, (bb, 1, 1, 1))
        # inactive K/V rows are selected to zero (a NaN there must not reach a matmul:
        # multiplying it by a zero weight would keep it) and inactive scores to -inf
        rows = b.compare(CompareOp.LT, b.iota((1, 1, lk, 1), axis=2), lb)
        k, v = b.select(rows, k, 0.0), b.select(rows, v, 0.0)
        live_keys = b.compare(CompareOp.LT, b.iota((1, 1, 1, lk), axis=3), lb)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    k_exp = repeat_kv(b, k, n_rep)
    v_exp = repeat_kv(b, v, n_rep)
    scores = b.matmul(q, b.transpose(k_exp, (0, 1, 3, 2)))
    scores = b.mul(scores, scale)
    if softcap is not None:
        scores = b.mul(b.tanh(b.div(scores, float(softcap))), float(softcap))
    if mask is not None:
        scores = b.add(scores, mask)
    if live_keys is not None:
        scores = b.select(live_keys, scores, NEG_INF)
    return b.matmul(softmax(b, scores), v_exp)


def attention_live(
    b: Builder,
    q: Var,
    k: Var,
    v: Var,
    length: Var,
    *,
    mask: Var | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    guard: str = "len",
    k_shared: Var | None = None,
) -> Var:
    """Attention over the live prefix of each batch row: row b sees keys ``t < length[b]``.

    The one definition of the live form (shared/seeds "Live length"). ``length`` is I32 [B]
    and must satisfy ``1 <= length[b] <= Lk``: an IndexGuard clamps it, with its witness
    declared as validation output ``guard``, so an out-of-range length fails the step
    (GuardFailed) and publishes nothing. The inactive key and value rows are then selected
    to zero before either matmul (a true select: a NaN in an unused row cannot reach the
    output) and the inactive scores to -inf before the softmax. Everything else (scale,
    softcap, additive ``mask``, GQA, 16-bit K/V, a split key's ``k_shared``) is
    :func:`attention_core`'s.
    """
    if length.dtype is not I32 or length.shape != (q.shape[0],):
        raise ShapeError(f"live length must be i32[{q.shape[0]}], got {length.aval()}")
    length = b.index_guard(length, 1, k.shape[2], guard)
    return _attend(b, q, k, v, mask, scale, softcap, length, k_shared)


def attention_prefill(
    b: Builder,
    q: Var,
    k_new: Var,
    v_new: Var,
    k_cache: Var,
    v_cache: Var,
    pos: Var,
    *,
    mask: Var | None = None,
    scale: float | None = None,
    softcap: float | None = None,
) -> tuple[Var, Var, Var]:
    """Lq rows written at ``pos`` and attended causally over the whole cache (row i sees
    keys <= pos + i): a prompt chunk, or with Lq == 1 a decode step.

    q [B,Hq,Lq,Dk]; k_new/v_new [B,Hkv,Lq,D]; caches [B,Hkv,cap,D] (state); pos i32[].
    ``mask`` is an optional extra additive mask [B|1, Hq|1, Lq|1, cap] (ALiBi), added to
    the causal one. Returns (out, k_cache', v_cache').
    """
    lq, cap = q.shape[2], k_cache.shape[2]
    if k_new.shape[2] != lq or v_new.shape[2] != lq:
        raise ShapeError(f"{lq} query rows but k_new {k_new.shape}, v_new {v_new.shape}")
    k_cache = b.dynamic_update_slice(k_cache, k_new, (0, 0, pos, 0))
    v_cache = b.dynamic_update_slice(v_cache, v_new, (0, 0, pos, 0))
    full = causal_mask(b, pos, lq, cap)
    if mask is not None:
        full = b.add(mask, full)
    out = attention_core(b, q, k_cache, v_cache, full, scale, softcap)
    return out, k_cache, v_cache


def attention_masked(b: Builder, q: Var, *args: Var, **kw: object) -> tuple[Var, Var, Var]:
    """One fixed-capacity decode step (Lq == 1): :func:`attention_prefill` with one row
    (same operands and keywords)."""
    if q.ndim != 4 or q.shape[2] != 1:
        raise ShapeError(f"attention_masked is a decode step (Lq == 1), got q {q.shape}")
    return attention_prefill(b, q, *args, **kw)  # type: ignore[arg-type]


def trace_attention(
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    mask_shape: tuple[int, ...] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    kv_dtype: DType = F32,
    lengths: bool = False,
    k_shared_shape: tuple[int, ...] | None = None,
    pool_slots: int | None = None,
) -> Graph:
    """A graph of plain attention over bound q/k/v (and mask): what ``pootvk.attention`` runs.
    ``kv_dtype`` F16/BF16 stores K/V 16-bit (the math stays F32). With ``lengths`` an I32
    [B] input ``lengths`` bounds each row's keys (:func:`attention_live`; its guard and
    validation output are named ``lengths``). ``k_shared_shape`` [B,1,Lk,s] binds a split
    key's shared part (input ``k_shared``, stored like k). ``pool_slots`` S pages the keys:
    k and v are bound as pools [S, Hkv, D] (k_shape/v_shape still give the logical
    [B, Hkv, Lk, D]) read through a SLOTMAP ``read`` [B, Lk] declared in [0, S)
    (``ops.paged_attention``)."""
    _check_kv_dtype(kv_dtype)
    b = Builder()
    q = b.input("q", q_shape, F32)
    read = None
    if pool_slots is not None:
        if k_shared_shape is not None or len(k_shape) != 4 or len(v_shape) != 4:
            raise ShapeError("a paged key takes rank-4 logical k/v shapes and no k_shared")
        k = b.input("k", (pool_slots, k_shape[1], k_shape[3]), kv_dtype)
        v = b.input("v", (pool_slots, v_shape[1], v_shape[3]), kv_dtype)
        read = b.slotmap("read", (k_shape[0], k_shape[2]), pool_slots)
    else:
        k = b.input("k", k_shape, kv_dtype)
        v = b.input("v", v_shape, kv_dtype)
    m = b.input("mask", mask_shape, F32) if mask_shape is not None else None
    ks = b.input("k_shared", k_shared_shape, kv_dtype) if k_shared_shape is not None else None
    if read is not None:
        from .paged import paged_attention

        n = b.input("lengths", (q_shape[0],), I32) if lengths else None
        out = paged_attention(b, q, k, v, read, length=n, mask=m, scale=scale,
                              softcap=softcap, guard="lengths")
    elif lengths:
        n = b.input("lengths", (q_shape[0],), I32)
        out = attention_live(b, q, k, v, n, mask=m, scale=scale, softcap=softcap,
                             guard="lengths", k_shared=ks)
    else:
        out = attention_core(b, q, k, v, m, scale, softcap, k_shared=ks)
    b.export("out", out)
    return b.build()


def trace_decode_step(
    batch: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    capacity: int,
    *,
    value_dim: int | None = None,
    q_rows: int = 1,
    softcap: float | None = None,
    alibi: bool = False,
    scale: float | None = None,
    kv_dtype: DType = F32,
    live: bool = False,
) -> Graph:
    """The graph of one fixed-capacity step (decode, or a prefill chunk of ``q_rows``).

    Slots: q, k_new, v_new (inputs), k_cache, v_cache (state), pos (pos, declared in
    [0, capacity - q_rows]), and with ``alibi`` a per-head additive mask param. With
    ``kv_dtype`` F16/BF16 the caches and the new k/v rows are stored 16-bit. ``live``
    (decode only, ``q_rows == 1``) attends through :func:`attention_live` with
    ``len = pos + 1`` for every row instead of a causal mask over the capacity: the pos
    slot's declared range proves ``1 <= len <= capacity``, so the step visits the live keys.
    """
    _check_kv_dtype(kv_dtype)
    dv = head_dim if value_dim is None else value_dim
    dims = {"batch": batch, "q_heads": q_heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "value_dim": dv, "q_rows": q_rows, "capacity": capacity}
    # numpy integers are ints here (np.int64 from a shape): normalised, bools refused
    dims = {k: int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
            for k, v in dims.items()}
    bad = {k: v for k, v in dims.items() if not isinstance(v, int) or isinstance(v, bool)
           or v < 1}
    if bad:
        raise ShapeError(f"decode step dimensions must be positive ints, got {bad}")
    if q_heads % kv_heads:
        raise ShapeError(f"q_heads={q_heads} is not a multiple of kv_heads={kv_heads}")
    if q_rows > capacity:
        raise ShapeError(f"{q_rows} query rows do not fit a capacity of {capacity}")
    batch, q_heads, kv_heads, head_dim, capacity, q_rows = (
        dims[n] for n in ("batch", "q_heads", "kv_heads", "head_dim", "capacity", "q_rows"))
    dv = dims["value_dim"]
    b = Builder()
    q = b.input("q", (batch, q_heads, q_rows, head_dim))
    k_new = b.input("k_new", (batch, kv_heads, q_rows, head_dim), kv_dtype)
    v_new = b.input("v_new", (batch, kv_heads, q_rows, dv), kv_dtype)
    kc = b.state("k_cache", (batch, kv_heads, capacity, head_dim), kv_dtype)
    vc = b.state("v_cache", (batch, kv_heads, capacity, dv), kv_dtype)
    pos = b.pos("pos", 0, capacity - q_rows)
    mask = b.param("alibi", (1, q_heads, q_rows, capacity)) if alibi else None
    if live:
        if q_rows != 1:
            raise ShapeError(f"the live form is a decode step (q_rows == 1), got {q_rows}")
        kc2 = b.dynamic_update_slice(kc, k_new, (0, 0, pos, 0))
        vc2 = b.dynamic_update_slice(vc, v_new, (0, 0, pos, 0))
        # len = pos + 1 for every row, as one Add of pos and a [B] of ones (folded to a
        # constant at compile time: one scalar-sized kernel per step)
        ones = b.add(b.mul(b.iota((batch,), axis=0), 0), 1)
        length = b.add(pos, ones)
        out = attention_live(b, q, kc2, vc2, length, mask=mask, scale=scale, softcap=softcap)
    else:
        fn = attention_masked if q_rows == 1 else attention_prefill
        out, kc2, vc2 = fn(b, q, k_new, v_new, kc, vc, pos, mask=mask, scale=scale,
                           softcap=softcap)
    b.export("out", out)
    b.set_state("k_cache", kc2)
    b.set_state("v_cache", vc2)
    return b.build()
