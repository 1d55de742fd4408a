"""Block-sparse attention as primitive equations: the block selection and the attention over
the selected blocks (the semantics: ``ir.sparse_form``).

No fused op is emitted here: ``passes.selection`` recognises :func:`block_topk` and
:func:`selected_attention` and forms BlockTopK and SelectedAttention, the way the attention
rewrite forms Attention. Unfused, the chains run on every device: the selection is one TopK
over the scores with the incomplete blocks at -inf, and the attention gathers each row's
``(K + 1) * bs`` key and value rows (so a key the row does not visit never reaches its
arithmetic, not even as a NaN times a zero weight) and runs Attention's softmax over them.
"""

from __future__ import annotations

import math

from ..errors import ShapeError
from ..ir import F32, I32, CompareOp, DType, Graph, ReduceOp, SlotKind, Var
from ..ir.sparse_form import SelectedForm, check_selected, check_selection
from .attention import KV_DTYPES, NEG_INF, softmax
from .builder import Builder


def block_eligible(b: Builder, qpos: Var, blocks: int, block_size: int) -> tuple[Var, Var]:
    """The positions as [B, 1, Lq, 1] and bool [B, 1, Lq, NB]: block j is complete for row
    (b, l), ``(j + 1) * bs <= qpos``."""
    bb, lq = qpos.shape
    qp = b.reshape(qpos, (bb, 1, lq, 1))
    ends = b.mul(b.add(b.iota((1, 1, 1, blocks), axis=3), 1), block_size)
    return qp, b.compare(CompareOp.LE, ends, qp)


def block_topk(b: Builder, scores: Var, qpos: Var, block_size: int, top_k: int) -> Var:
    """I32 [B, Hs, Lq, K]: the ``top_k`` complete blocks of highest score per row, ascending,
    then -1 where fewer are complete (BlockTopK's chain). NaN scores read as -inf."""
    check_selection(scores.shape, qpos.shape, block_size, top_k)
    if scores.dtype is not F32 or qpos.dtype is not I32:
        raise ShapeError(f"block scores must be f32 and positions i32, got "
                         f"{scores.dtype.value} and {qpos.dtype.value}")
    qp, eligible = block_eligible(b, qpos, scores.shape[3], block_size)
    clean = b.select(b.compare(CompareOp.EQ, scores, scores), scores, NEG_INF)
    masked = b.select(eligible, clean, NEG_INF)
    idx = b.topk(masked, top_k)
    ok = b.compare(CompareOp.LE, b.mul(b.add(idx, 1), block_size), qp)
    return b.select(ok, idx, -1)


def selected_attention(
    b: Builder, q: Var, k: Var, v: Var, ids: Var, qpos: Var, block_size: int,
    scale: float | None = None, softcap: float | None = None, k_shared: Var | None = None,
) -> Var:
    """Attention of each row over its selected blocks ``ids`` [B, Hs, Lq, K] and its own
    unfinished block (SelectedAttention's chain): positions ``c * bs + j`` of each slot's
    block c, visible where ``0 <= pos <= qpos``; gathered rows, Attention's softmax.

    q [B, Hq, Lq, Dk] f32; k, v [B, Hkv, Lk, D] stored F32/F16/BF16; qpos [B, Lq] i32 (the
    caller bounds it into [0, Lk - 1], :func:`attention_block_sparse` guards it). With
    ``k_shared`` [B, 1, Lk, s] the key is split (latent attention, ``ops.split_key``): k
    holds its first Dk - s channels and each gathered key row is concat(k's, k_shared's)."""
    if k.dtype not in KV_DTYPES or v.dtype is not k.dtype or \
            (k_shared is not None and k_shared.dtype is not k.dtype):
        raise ShapeError(f"k is {k.dtype.value}, v {v.dtype.value}: K/V are stored as one "
                         f"of {[d.value for d in KV_DTYPES]} (k_shared too)")
    bsz, hq, lq, dk = q.shape
    hkv = k.shape[1] if k.ndim == 4 else 1
    ops = [x for x in (q, k, v, ids, qpos, k_shared) if x is not None]
    form = SelectedForm(
        scale=1.0 / math.sqrt(dk) if scale is None else float(scale), block_size=block_size,
        softcap=None if softcap is None else float(softcap),
        n_rep=hq // hkv if hkv and hq % hkv == 0 else 0, kv_dtype=k.dtype,
        shared_width=0 if k_shared is None or k_shared.ndim != 4 else k_shared.shape[3],
    )
    check_selected(form, [x.shape for x in ops], [x.dtype for x in ops])
    lk, dv, hs, top = k.shape[2], v.shape[3], ids.shape[1], ids.shape[3]
    n_rep, nk = form.n_rep, (top + 1) * block_size
    qp, eligible = block_eligible(b, qpos, lk // block_size, block_size)
    own = b.reduce(ReduceOp.SUM, b.convert(eligible, I32), axis=3, keepdim=True)
    blocks = b.concat([ids, b.broadcast(own, (bsz, hs, lq, 1))], axis=3)  # [B,Hs,Lq,K+1]
    pos = b.add(b.mul(b.reshape(blocks, (bsz, hs, lq, top + 1, 1)), block_size),
                b.iota((1, 1, 1, 1, block_size), axis=4))
    pos = b.reshape(pos, (bsz, hs, lq, nk))
    visible = b.min(b.compare(CompareOp.GE, pos, 0), b.compare(CompareOp.LE, pos, qp))
    # row (b * Hkv + g) * Lk + pos of k and v viewed as [B * Hkv * Lk, D]
    first = b.mul(b.add(b.mul(b.iota((bsz, hkv, 1, 1), axis=0), hkv),
                        b.iota((bsz, hkv, 1, 1), axis=1)), lk)
    key = b.max(b.min(pos, lk - 1), 0)  # each position clamped into the keys
    rows = b.add(first, key)  # [B, Hkv, Lq, NK]
    keep = b.reshape(visible, (bsz, hs, lq, nk, 1))

    def gathered(x: Var, shared: Var | None = None) -> Var:
        y = b.gather(b.reshape(x, (bsz * hkv * lk, x.shape[3])), rows)
        if shared is not None:  # the batch row's shared part at the same keys, every head
            s = shared.shape[3]
            first_s = b.mul(b.iota((bsz, 1, 1, 1), axis=0), lk)
            ys = b.gather(b.reshape(shared, (bsz * lk, s)),
                          b.add(first_s, key))  # [B, Hs, Lq, NK, s]
            y = b.concat([y, b.broadcast(ys, (bsz, hkv, lq, nk, s))], axis=4)
        if y.dtype is not F32:
            y = b.convert(y, F32)
        return b.select(keep, y, 0.0)  # [B, Hkv, Lq, NK, D]

    kg, vg = gathered(k, k_shared), gathered(v)
    qg = b.transpose(b.reshape(q, (bsz, hkv, n_rep, lq, dk)), (0, 1, 3, 2, 4))
    s = b.matmul(qg, b.transpose(kg, (0, 1, 2, 4, 3)))  # [B, Hkv, Lq, n_rep, NK]
    s = b.mul(s, form.scale)
    if form.softcap is not None:
        s = b.mul(b.tanh(b.div(s, form.softcap)), form.softcap)
    s = b.select(b.reshape(visible, (bsz, hs, lq, 1, nk)), s, NEG_INF)
    o = b.matmul(softmax(b, s), vg)  # [B, Hkv, Lq, n_rep, Dv]
    return b.reshape(b.transpose(o, (0, 1, 3, 2, 4)), (bsz, hq, lq, dv))


def block_summary_scores(b: Builder, q: Var, k: Var, block_size: int,
                         k_shared: Var | None = None) -> Var:
    """An indexer's block scores [B, Hkv, Lq, NB]: each block's mean key dotted with the sum
    of its KV group's queries (one selection per group), computed as the mean over the block
    of the keys' scores against that sum (the same number: the dot is linear), so the keys
    are read once by one GEMV in their stored layout and dtype. It reads every key: a model
    that keeps per-block summaries in a cache passes its own scores instead."""
    bsz, hq, lq, dk = q.shape
    _, hkv, lk, _ = k.shape
    if lk % block_size:
        raise ShapeError(f"key length {lk} is not a multiple of the block size {block_size}")
    nb = lk // block_size
    qs = b.reduce(ReduceOp.SUM, b.reshape(q, (bsz, hkv, hq // hkv, lq, dk)), axis=2,
                  keepdim=False)  # [B, Hkv, Lq, Dk]

    def keys_t(x: Var) -> Var:  # [B, H, D, Lk] in F32
        return b.transpose(x if x.dtype is F32 else b.convert(x, F32), (0, 1, 3, 2))

    if k_shared is None:
        s = b.matmul(qs, keys_t(k))  # [B, Hkv, Lq, Lk]
    else:  # a split key: its own channels' scores plus the shared channels' (every head)
        dn = k.shape[3]
        s = b.add(b.matmul(b.slice(qs, (0, 0, 0, 0), (bsz, hkv, lq, dn)), keys_t(k)),
                  b.matmul(b.slice(qs, (0, 0, 0, dn), (bsz, hkv, lq, dk)), keys_t(k_shared)))
    blocks = b.reduce(ReduceOp.SUM, b.reshape(s, (bsz, hkv, lq, nb, block_size)), axis=4,
                      keepdim=False)
    return b.mul(blocks, 1.0 / block_size)


def attention_block_sparse(
    b: Builder, q: Var, k: Var, v: Var, qpos: Var, *, block_size: int, top_k: int,
    block_scores: Var | None = None, scale: float | None = None,
    softcap: float | None = None, guard: str = "qpos", k_shared: Var | None = None,
) -> Var:
    """Block-sparse attention: each query row visits its ``top_k`` best complete blocks and
    its own unfinished block, ``(top_k + 1) * block_size`` positions instead of all Lk.

    ``qpos`` i32 [B, Lq] are the rows' positions, bounded into [0, Lk - 1] by an IndexGuard
    whose witness is validation output ``guard`` (an out-of-range position fails the step
    and publishes nothing). ``block_scores`` [B, Hs, Lq, NB] (Hs = 1 or Hkv) are the
    caller's; None scores blocks by :func:`block_summary_scores`. ``top_k`` above the block
    count keeps every block. ``k_shared`` [B, 1, Lk, s] splits the key (latent attention):
    q has the whole width, k the first Dk - s channels."""
    if qpos.dtype is not I32 or qpos.shape != (q.shape[0], q.shape[2]):
        raise ShapeError(f"query positions must be i32[{q.shape[0]}, {q.shape[2]}], got "
                         f"{qpos.aval()}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ShapeError(f"block_size must be an int >= 1, got {block_size!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ShapeError(f"top_k must be an int >= 1, got {top_k!r}")
    if k.ndim != 4 or k.shape[2] % block_size:
        raise ShapeError(f"keys {k.shape}: the length is not a multiple of the block size "
                         f"{block_size}")
    qpos = b.index_guard(qpos, 0, k.shape[2] - 1, guard)
    scores = block_summary_scores(b, q, k, block_size, k_shared) if block_scores is None \
        else block_scores
    ids = block_topk(b, scores, qpos, block_size, min(top_k, scores.shape[3]))
    return selected_attention(b, q, k, v, ids, qpos, block_size, scale, softcap, k_shared)


def trace_block_sparse(
    q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...], *,
    block_size: int, top_k: int, scores_shape: tuple[int, ...] | None = None,
    scale: float | None = None, softcap: float | None = None, kv_dtype: DType = F32,
    k_shared_shape: tuple[int, ...] | None = None,
) -> Graph:
    """The graph ``pootvk.attention(..., block_size=, top_k=)`` runs: inputs q, k, v (stored
    ``kv_dtype``), ``positions`` i32 [B, Lq] declared in [0, Lk - 1] (the bind refuses a
    position outside with SlotRangeError before anything runs, so the graph's guard is
    proven and elided: no guard kernel per call) and, with ``scores_shape``, the caller's
    ``block_scores``; with ``k_shared_shape`` a split key's ``k_shared`` input."""
    b = Builder()
    q = b.input("q", q_shape, F32)
    k = b.input("k", k_shape, kv_dtype)
    v = b.input("v", v_shape, kv_dtype)
    qpos = b.slot("positions", SlotKind.INPUT, (q_shape[0], q_shape[2]), I32,
                  (0, k_shape[2] - 1))
    sc = None if scores_shape is None else b.input("block_scores", scores_shape, F32)
    ks = None if k_shared_shape is None else b.input("k_shared", k_shared_shape, kv_dtype)
    b.export("out", attention_block_sparse(b, q, k, v, qpos, block_size=block_size,
                                           top_k=top_k, block_scores=sc, scale=scale,
                                           softcap=softcap, guard="positions", k_shared=ks))
    return b.build()
