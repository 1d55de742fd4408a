"""Paged KV as primitives: the write through a write map, the read through a read map.

A paged cache keeps each layer's K and V in pools ``[S, Hkv, D]`` of fixed slots shared by
every row of a step (shared/seeds "Paged KV"). Two per-step maps address them:

- ``write`` (WRITEMAP, ``[N]`` i32): the pool slot each new row goes to, or -1 (a padding row
  writes nothing). :func:`paged_write` is one ScatterUpdate; as a state update it runs in
  place on the donated pool at a cost that follows N, not S. The map is bound only as a
  checked ``ForwardSlotMap`` (a slot outside the pool or named twice is refused at bind).
- ``read`` (SLOTMAP, ``[B, Lk]`` i32, declared in ``[0, S)``): the pool slot of each row's
  logical key position. :func:`paged_view` states the read as Gather (pool rows by slot:
  ``[B, Lk, Hkv, D]``) and Transpose (``[B, Hkv, Lk, D]``), so every device and the oracle
  can run it, and :func:`paged_attention` runs the dense chain (``ops.attention``) over that
  view. The attention rewrite recognises the gathered-and-transposed pools and, when the
  read map's range proves every word a pool slot, forms the paged-key Attention (the kernel
  reads pool row ``read[b, t] * Hkv + g`` in place: no gather, no transpose).
"""

from __future__ import annotations

from ..errors import ShapeError
from ..ir import F32, I32, DType, Graph, SlotKind, Var
from ..ir.attention_form import paged_view_shapes
from .attention import _check_kv_dtype, attention_core, attention_live
from .builder import Builder


def paged_view(b: Builder, pool: Var, read: Var) -> Var:
    """The logical ``[B, Hkv, Lk, D]`` keys (or values) of ``pool [S, Hkv, D]`` read through
    ``read [B, Lk]``: Gather then Transpose. A word outside [0, S) would read the nearest
    slot (Gather clamps); a read map bound from a SLOTMAP slot is refused at bind instead."""
    if pool.ndim != 3 or read.ndim != 2 or read.dtype is not I32:
        raise ShapeError(f"a paged read takes a pool [S, Hkv, D] and an i32 read [B, Lk], "
                         f"got {pool.aval()} and {read.aval()}")
    return b.transpose(b.gather(pool, read), (0, 2, 1, 3))


def paged_attention(
    b: Builder,
    q: Var,
    k_pool: Var,
    v_pool: Var,
    read: Var,
    *,
    length: Var | None = None,
    mask: Var | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    guard: str = "len",
) -> Var:
    """Attention of ``q [B, Hq, Lq, Dk]`` over pools ``k [S, Hkv, Dk]``, ``v [S, Hkv, Dv]``
    read through ``read [B, Lk]`` i32 (key t of row b is pool slot ``read[b, t]``).

    Exactly the dense chain over the gathered view (:func:`paged_view`): GQA, the additive
    ``mask [B|1, Hq|1, Lq|1, Lk]``, softcap and scale mean what they mean for
    ``ops.attention_core``; with ``length`` (i32 [B]) it is ``ops.attention_live`` (row b
    sees keys ``t < length[b]``, the guard's witness declared as validation output
    ``guard``). 16-bit pools are gathered 16-bit and converted for the math, as a dense
    16-bit cache is."""
    if k_pool.dtype is not v_pool.dtype:
        raise ShapeError(f"pools differ in dtype: k {k_pool.aval()}, v {v_pool.aval()}")
    paged_view_shapes(k_pool.shape, v_pool.shape, read.shape)  # typed refusal of the pools
    if read.dtype is not I32 or read.shape[0] != q.shape[0]:
        raise ShapeError(f"read map must be i32 [B={q.shape[0]}, Lk], got {read.aval()}")
    k, v = paged_view(b, k_pool, read), paged_view(b, v_pool, read)
    if length is None:
        return attention_core(b, q, k, v, mask, scale, softcap)
    return attention_live(b, q, k, v, length, mask=mask, scale=scale, softcap=softcap,
                          guard=guard)


def paged_write(b: Builder, pool: Var, rows: Var, write: Var) -> Var:
    """``pool [S, Hkv, D]`` with ``rows [N, Hkv, D]`` written at the pool slots ``write [N]``
    (one ScatterUpdate; -1 writes nothing). Pass the result to ``set_state`` on the pool's
    slot: the write is then in place on the donated pool, costing N rows."""
    if pool.ndim != 3 or rows.shape[1:] != pool.shape[1:] or write.shape != rows.shape[:1]:
        raise ShapeError(f"a paged write takes a pool [S, Hkv, D], rows [N, Hkv, D] and a "
                         f"write map [N], got {pool.aval()}, {rows.aval()}, {write.aval()}")
    return b.scatter_update(pool, write, rows)


def trace_paged_step(
    batch: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    pool_slots: int,
    keys: int,
    *,
    value_dim: int | None = None,
    tokens: int = 1,
    live: bool = False,
    softcap: float | None = None,
    scale: float | None = None,
    kv_dtype: DType = F32,
) -> Graph:
    """One paged step: ``batch * tokens`` new K/V rows written into the pools, then
    ``tokens`` query rows per batch row attending over ``keys`` logical positions.

    Slots: q [B, Hq, T, Dk], k_new [B*T, Hkv, Dk], v_new [B*T, Hkv, Dv] (inputs; row
    n = b * T + i is token i of batch row b), k_pool [S, Hkv, Dk], v_pool [S, Hkv, Dv]
    (state, updated in place), ``write`` [B*T] (WRITEMAP in [-1, S)), ``read`` [B, keys]
    (SLOTMAP in [0, S)). The mask is an f32 input ``mask`` [B, 1, T, keys] (a driver's
    causal mask over its block table), or with ``live`` (T == 1) an i32 ``len`` [B] LEN slot
    declared in [1, keys], which proves the live bound (no guard remains after compile)."""
    _check_kv_dtype(kv_dtype)
    dv = head_dim if value_dim is None else value_dim
    n = batch * tokens
    b = Builder()
    q = b.input("q", (batch, q_heads, tokens, head_dim))
    k_new = b.input("k_new", (n, kv_heads, head_dim), kv_dtype)
    v_new = b.input("v_new", (n, kv_heads, dv), kv_dtype)
    kp = b.state("k_pool", (pool_slots, kv_heads, head_dim), kv_dtype)
    vp = b.state("v_pool", (pool_slots, kv_heads, dv), kv_dtype)
    write = b.writemap("write", n, pool_slots)
    read = b.slotmap("read", (batch, keys), pool_slots)
    kp2, vp2 = paged_write(b, kp, k_new, write), paged_write(b, vp, v_new, write)
    if live:
        if tokens != 1:
            raise ShapeError(f"the live form is a decode step (tokens == 1), got {tokens}")
        length = b.slot("len", SlotKind.LEN, (batch,), I32, (1, keys))
        out = paged_attention(b, q, kp2, vp2, read, length=length, scale=scale,
                              softcap=softcap)
    else:
        mask = b.input("mask", (batch, 1, tokens, keys))
        out = paged_attention(b, q, kp2, vp2, read, mask=mask, scale=scale, softcap=softcap)
    b.export("out", out)
    b.set_state("k_pool", kp2)
    b.set_state("v_pool", vp2)
    return b.build()
