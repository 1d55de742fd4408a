"""The attention rewrite: recognise the traced chain and replace it with one Attention eqn.

Matched (after canonicalization), from the output back:

    out = MatMul(Div(ex, Reduce[Sum,-1](ex)), rep(v))      ex = Exp(Sub(s, Reduce[Max,-1](s)))
    s   = [Add(., mask)] [Mul(Tanh(Div(., cap)), cap)] Mul(MatMul(q, Transpose(rep(k))), scale)

where ``rep`` is the GQA repeat (Reshape -> Broadcast -> Reshape, or nothing). The live form
(``ops.attention_live``) adds ``Select(t < len, s, -inf)`` around the scores and
``Select(t < len, k|v, 0)`` on the K/V rows before the repeat; it fuses to a form with
``live`` and the ``len [B]`` operand only when value ranges (``passes.ranges``) prove
``1 <= len <= Lk``, else the chain stays primitive (same answer). The fused eqn
reuses the chain's output Var, so nothing downstream is renamed. A chain is left alone when
it cannot be typed as Attention (rank, batch broadcast, mask shape, non-literal scale), is
not F32 (the generated kernel is F32 only), or when one of its scores intermediates is used
outside the chain or observed (fusing would compute it twice).

A key built as ``concat(k_nope, broadcast(k_shared))`` on its last axis (``ops.split_key``,
k_shared [B, 1, Lk, s]) becomes the split-key form: the two parts are operands and the
broadcast key is never built. A split the op cannot type falls back to the dense form (the
key materialised by its primitives), and a chain neither form types keeps its primitives.

K and V that are pools read through one map, ``Transpose[0,2,1,3](Gather(pool, read))``
(``ops.paged_view``: pools [S, Hkv, D], read [B, Lk] i32), become the paged-key form: the
pools and ``read`` are operands and the kernel reads pool row ``read[b, t] * Hkv + g`` in
place. The form's contract is a map of pool slots (a kernel's own clamp only keeps it
inside its bindings), so it is taken only when value ranges prove every word of ``read`` in
``[0, S)`` (a SLOTMAP slot's declared range, which the bind enforces); otherwise the
attention stays over the gathered view, where Gather's clamp is the defined answer (dense,
same result as the primitives).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PootvkError
from ..ir import (
    BF16,
    F16,
    F32,
    I32,
    AttentionForm,
    DType,
    Eqn,
    Graph,
    KeyLayout,
    Literal,
    MaskKind,
    Params,
    Prim,
    ReduceOp,
    SlotKind,
    UnaryOp,
    Var,
    type_eqn,
)
from ..ir.attention_form import mask_bcast
from ..ir.prims import (
    ADD,
    ATTENTION,
    BROADCAST,
    COMPARE,
    CONCAT,
    CONVERT,
    DIV,
    GATHER,
    IOTA,
    MATMUL,
    MUL,
    REDUCE,
    RESHAPE,
    SELECT,
    SUB,
    TRANSPOSE,
    UNARY,
    CompareOp,
)
from .canonicalize import dead_code_elimination
from .ranges import value_ranges
from .walk import literal as _lit
from .walk import producer_eqn


@dataclass
class _Ctx:
    g: Graph
    prod: dict[Var, int]
    uses: dict[Var, list[int]]
    observed: frozenset[Var]
    ranges: dict[Var, tuple[int, int]]
    consts: dict[Var, np.ndarray]


def _eq(ctx: _Ctx, v: Var, prim: Prim, **params: object) -> Eqn | None:
    return producer_eqn(ctx.g.eqns, ctx.prod, v, prim, **params)


def _positions(ctx: _Ctx, v: Var, axis: int, lk: int) -> bool:
    """Whether ``v`` holds the key positions 0..lk-1 along ``axis`` (extent 1 elsewhere): an
    Iota, or the constant it was folded into."""
    if v.ndim != 4 or v.shape[axis] != lk or v.size != lk or v.dtype is not I32:
        return False
    if _eq(ctx, v, IOTA, axis=axis) is not None:
        return True
    c = ctx.consts.get(v)
    return c is not None and np.array_equal(c.reshape(-1), np.arange(lk))


def _live_len(ctx: _Ctx, pred: Var, axis: int, lk: int) -> Var | None:
    """The ``len [B]`` of a live predicate ``Compare[Lt](positions, Reshape(len))``."""
    cmp = _eq(ctx, pred, COMPARE, op=CompareOp.LT)
    if cmp is None or not _positions(ctx, cmp.inputs[0], axis, lk):
        return None
    r = _eq(ctx, cmp.inputs[1], RESHAPE)
    n = r.inputs[0] if r else None
    if n is None or n.dtype is not I32 or n.ndim != 1 or r.out.shape != (n.shape[0], 1, 1, 1):
        return None
    return n


def _unselect(ctx: _Ctx, x: Var, fill: float) -> tuple[Var, Var] | None:
    """(value, predicate) of ``Select(pred, value, fill)``."""
    sel = _eq(ctx, x, SELECT)
    if sel is None or _lit(sel.inputs[2]) != fill or isinstance(sel.inputs[1], Literal):
        return None
    return sel.inputs[1], sel.inputs[0]


def _unrepeat(ctx: _Ctx, x: Var) -> tuple[Var, int]:
    """Undo repeat_kv: the [B,Hkv,L,D] source and n_rep (1 when no repeat is traced)."""
    r2 = _eq(ctx, x, RESHAPE)
    bc = r2 and _eq(ctx, r2.inputs[0], BROADCAST)
    r1 = bc and _eq(ctx, bc.inputs[0], RESHAPE)
    if r1 and x.ndim == 4:
        src = r1.inputs[0]
        b, h, length, d = x.shape
        if src.ndim == 4 and h % max(src.shape[1], 1) == 0:
            n = h // src.shape[1]
            if (
                r1.out.shape == (b, src.shape[1], 1, length, d)
                and bc.out.shape == (b, src.shape[1], n, length, d)
                and src.shape == (b, src.shape[1], length, d)
            ):
                return src, n
    return x, 1


def _match(ctx: _Ctx, mm: Eqn) -> tuple[Eqn, list[Eqn]] | None:
    probs, v_exp = mm.inputs
    div = _eq(ctx, probs, DIV)
    if div is None:
        return None
    ex, den = div.inputs
    rsum = _eq(ctx, den, REDUCE, op=ReduceOp.SUM, keepdim=True)
    exp = _eq(ctx, ex, UNARY, op=UnaryOp.EXP)
    if rsum is None or exp is None or rsum.inputs[0] is not ex or ex.ndim != 4:
        return None
    sub = _eq(ctx, exp.inputs[0], SUB)
    if sub is None or rsum.params["axis"] != ex.ndim - 1:
        return None
    s, mx = sub.inputs
    rmax = _eq(ctx, mx, REDUCE, op=ReduceOp.MAX, keepdim=True, axis=3)
    if rmax is None or rmax.inputs[0] is not s:
        return None
    chain = [mm, div, rsum, exp, sub, rmax]

    live_pred: Var | None = None  # the live form: inactive scores selected to -inf
    live = _unselect(ctx, s, float("-inf"))
    if live is not None:
        s, live_pred = live
        chain.append(ctx.g.eqns[ctx.prod[sub.inputs[0]]])

    mask: Var | None = None
    add = _eq(ctx, s, ADD)
    if add is not None:
        a, b = add.inputs
        for scores, m in ((a, b), (b, a)):
            if _eq(ctx, scores, MUL) is not None and not isinstance(m, Literal):
                s, mask = scores, m
                chain.append(add)
                break
        else:
            return None

    softcap: float | None = None
    outer = _eq(ctx, s, MUL)
    tanh = outer and _eq(ctx, outer.inputs[0], UNARY, op=UnaryOp.TANH)
    inner = tanh and _eq(ctx, tanh.inputs[0], DIV)
    if outer and tanh and inner:
        cap, cap2 = _lit(outer.inputs[1]), _lit(inner.inputs[1])
        if cap is None or cap != cap2:
            return None
        softcap = cap
        chain += [outer, tanh, inner]
        s = inner.inputs[0]

    smul = _eq(ctx, s, MUL)
    if smul is None or _lit(smul.inputs[1]) is None:
        return None
    scale = _lit(smul.inputs[1])
    qk = _eq(ctx, smul.inputs[0], MATMUL)
    if qk is None:
        return None
    q, kt = qk.inputs
    tr = _eq(ctx, kt, TRANSPOSE, perm=(0, 1, 3, 2))
    if tr is None:
        return None
    chain += [smul, qk, tr]

    k, n_rep = _unrepeat(ctx, tr.inputs[0])
    v, n_rep_v = _unrepeat(ctx, v_exp)
    length: Var | None = None
    if live_pred is not None:
        # K/V rows selected to zero by the same predicate, over a length the ranges prove
        ks, vs = _unselect(ctx, k, 0.0), _unselect(ctx, v, 0.0)
        if ks is None or vs is None or ks[1] is not vs[1] or k.ndim != 4:
            return None
        lk = k.shape[2]
        (k, kv_pred), (v, _) = ks, vs
        length = _live_len(ctx, live_pred, 3, lk)
        if length is None or _live_len(ctx, kv_pred, 2, lk) is not length:
            return None
        rng = ctx.ranges.get(length)
        if rng is None or not 1 <= rng[0] <= rng[1] <= lk:
            return None
    if n_rep != n_rep_v or q.dtype is not F32:
        return None
    if mask is not None and (mask.dtype is not F32 or mask.ndim != 4):
        return None

    # Every scores intermediate must be private to the chain.
    members = {id(e) for e in chain}
    for e in chain:
        if e is mm:
            continue
        users = ctx.uses.get(e.out, [])
        if e.out in ctx.observed or any(id(ctx.g.eqns[u]) not in members for u in users):
            return None

    # The pools of a proven read map first (read in place), then a split key (its parts
    # as operands), else the key as one dense operand; each with its K/V storage dtype
    # resolved. The first form the op types wins; none: the chain keeps its primitives.
    paged = _paged_key(ctx, k, v)
    split = _split_key(ctx, k)
    cands: list[tuple[list[Var], Var, Var | None]] = []
    if paged is not None:
        cands.append(([paged[0]], paged[1], paged[2]))
    if split is not None:
        cands.append((split, v, None))
    cands.append(([k], v, None))
    for key, val, read in cands:
        stored = _storage(ctx, [*key, val])
        if stored is None:
            continue
        kv_dtype, (*key_ops, v_op) = stored
        fused = _fused(q, key_ops, v_op, mask, length, mm, float(scale), softcap, n_rep,
                       kv_dtype, read)
        if fused is not None:
            return fused, chain
    return None


def _peel_convert(ctx: _Ctx, x: Var) -> Var | None:
    """The 16-bit source of Convert(x16 -> F32), or None."""
    c = _eq(ctx, x, CONVERT, dtype=F32)
    return c.inputs[0] if c is not None and c.inputs[0].dtype in (F16, BF16) else None


def _split_key(ctx: _Ctx, k: Var) -> list[Var] | None:
    """[k_nope, k_shared] when the key is concat(k_nope, broadcast(k_shared)) on its last axis
    with k_shared [B, 1, Lk, s] (the broadcast is gone when Hkv == 1: canonicalize drops an
    identity broadcast), possibly under a Convert to F32; else None."""
    if k.ndim != 4:
        return None
    b, _, lk, _ = k.shape
    peeled = _peel_convert(ctx, k)
    for cand in (k, peeled) if peeled is not None else (k,):
        cat = _eq(ctx, cand, CONCAT, axis=3)
        if cat is None or len(cat.inputs) != 2:
            continue
        nope, shared = cat.inputs
        for part in (shared, _peel_convert(ctx, shared)):
            bc = part is not None and _eq(ctx, part, BROADCAST)
            src = bc.inputs[0] if bc else part
            if src is not None and src.shape == (b, 1, lk, shared.shape[3]):
                return [nope, src]
    return None


def _paged_key(ctx: _Ctx, k: Var, v: Var) -> tuple[Var, Var, Var] | None:
    """(k_pool, v_pool, read) when K and V are ``Transpose[0,2,1,3](Gather(pool, read))``
    (``ops.paged_view``), each possibly under a Convert to F32, through one read map whose
    proven range lies inside the pools ``[0, S)``; else None (unknown or wider range: the
    attention stays over the gathered view, where Gather's clamp is the semantics)."""
    pools: list[Var] = []
    read: Var | None = None
    for x in (k, v):
        peeled = _peel_convert(ctx, x)
        tr = _eq(ctx, x if peeled is None else peeled, TRANSPOSE, perm=(0, 2, 1, 3))
        ga = tr and _eq(ctx, tr.inputs[0], GATHER)
        if not ga:
            return None
        pool, idx = ga.inputs
        if pool.ndim != 3 or idx.ndim != 2 or (read is not None and idx is not read):
            return None
        pools.append(pool)
        read = idx
    assert read is not None
    rng = ctx.ranges.get(read)
    slots = min(p.shape[0] for p in pools)
    if rng is None or not 0 <= rng[0] <= rng[1] < slots:
        return None
    return pools[0], pools[1], read


def _storage(ctx: _Ctx, xs: list[Var]) -> tuple[DType, list[Var]] | None:
    """The K/V operands as stored: all 16-bit of one dtype (a Convert(x16 -> F32) feeding the
    chain folds into the form's storage dtype, the kernel reads them 16-bit), else all F32
    as they are; None when neither holds."""
    for dt in (F16, BF16):
        stored = [x if x.dtype is dt else _peel_convert(ctx, x) for x in xs]
        if all(x is not None and x.dtype is dt for x in stored):
            return dt, stored  # type: ignore[return-value]
    return (F32, xs) if all(x.dtype is F32 for x in xs) else None


def _fused(q: Var, key: list[Var], v: Var, mask: Var | None, length: Var | None, mm: Eqn,
           scale: float, softcap: float | None, n_rep: int, kv_dtype: DType,
           read: Var | None = None) -> Eqn | None:
    """The Attention eqn over these operands, if the op types it to the chain's output:
    a split key when ``key`` has two parts, a paged key (k and v the pools) with ``read``."""
    split = len(key) == 2
    keys = KeyLayout.PAGED if read is not None else \
        KeyLayout.SPLIT if split else KeyLayout.DENSE
    form = AttentionForm(
        scale=scale, softcap=softcap, n_rep=n_rep,
        mask=MaskKind.NONE if mask is None else MaskKind.ADDITIVE,
        mask_bcast=None if mask is None else mask_bcast(mask.shape), kv_dtype=kv_dtype,
        keys=keys, shared_width=key[1].shape[3] if split else 0, live=length is not None,
    )
    by_role = {"q": q, "k": key[0], "v": v, "mask": mask, "len": length, "k_shared": key[-1],
               "read": read}
    ins = tuple(by_role[r] for r in form.roles)
    params = Params(form=form)
    try:
        avals = type_eqn(ATTENTION, ins, params)
    except PootvkError:
        return None
    if avals != [(mm.out.shape, mm.out.dtype)]:
        return None
    return Eqn(ATTENTION, ins, mm.outputs, params)


def attention_rewrite(g: Graph) -> Graph:
    """Replace every recognised attention chain; everything else is left as it is."""
    info = g.use_info()
    consts = {s.var: g.constants[s.name] for s in g.slots if s.kind is SlotKind.CONST}
    ctx = _Ctx(g, info.producer, info.users, info.observed, value_ranges(g), consts)
    eqns: list[Eqn] = []
    for e in g.eqns:
        m = _match(ctx, e) if e.prim is MATMUL else None
        eqns.append(m[0] if m else e)
    return dead_code_elimination(g.replace(eqns))
