"""The selection pass: recognise the block-sparse chains of ``ops.sparse`` and form BlockTopK
and SelectedAttention, the way the attention rewrite forms Attention.

A chain is recognised in two steps. A short walk from its last eqn finds the candidate
operands and parameters (scores and positions; q, k, v, ids, positions, block size, scale,
softcap). Then the defining chain is traced again over those operands (``ops.sparse``, the one
definition) and compared with the graph eqn by eqn from the root back to the operands: same
primitive, same params, same literals, same operand structure. Only a chain that *is* the
definition is replaced, so the fused eqn computes exactly what it replaces; a chain that
differs anywhere (another mask, another gather, a changed literal) keeps its primitives and
its results.

The pass runs first, on the graph as traced, so the comparison sees both chains in the same
raw form. Intermediates of a replaced chain that something else also reads stay (computed by
their own eqns); the rest is removed by dead-code elimination.

SelectedAttention's kernel contract is a row of distinct complete blocks, ascending, then -1
(BlockTopK's output) and positions inside the cache, so it is formed only when its ids are
the output of a BlockTopK of the same block size over the same positions, and value ranges
prove every position in ``[0, Lk - 1]`` (``ops.sparse.attention_block_sparse`` guards them
with a declared witness). Otherwise the attention stays primitive, which runs anywhere with
the same answer.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import PootvkError
from ..ir import F32, Eqn, Graph, Literal, Params, Prim, UnaryOp, Var, new_eqn
from ..ir import prims as P
from ..ir.sparse_form import SelectedForm
from .canonicalize import dead_code_elimination
from .ranges import value_ranges
from .walk import literal as _lit
from .walk import producer_eqn


class _Walk:
    """Producers of a graph's values, and a one-step walk back through them. ``eqns`` is
    the pass's working list: an eqn replaced in it keeps its outputs (and its index), so
    the walk sees the replacement."""

    def __init__(self, eqns: list[Eqn]) -> None:
        self.eqns = eqns
        self.prod = {o: i for i, e in enumerate(eqns) for o in e.outputs}

    def eqn(self, v: Var | None, prim: Prim, **params: object) -> Eqn | None:
        return producer_eqn(self.eqns, self.prod, v, prim, **params)

    def arg(self, v: Var | None, prim: Prim, i: int = 0, **params: object) -> Var | None:
        e = self.eqn(v, prim, **params)
        return None if e is None or i >= len(e.inputs) else e.inputs[i]


def _same_lit(a: Literal, b: Literal) -> bool:
    return a.dtype is b.dtype and type(a.value) is type(b.value) \
        and repr(a.value) == repr(b.value)


def same_chain(w: _Walk, root: Var, tmpl: Graph, out: Var, leaves: dict[Var, Var]) -> bool:
    """Whether the graph computes ``root`` exactly as ``tmpl`` computes ``out``: walking both
    from there back to the template's inputs, which must meet ``leaves`` (template input ->
    graph value), every eqn the same primitive with the same params, every literal equal."""
    tprod = {o: e for e in tmpl.eqns for o in e.outputs}
    seen: dict[Var, Var] = {}
    stack = [(out, root)]
    while stack:
        tv, rv = stack.pop()
        if isinstance(tv, Literal) or isinstance(rv, Literal):
            if not (isinstance(tv, Literal) and isinstance(rv, Literal) and _same_lit(tv, rv)):
                return False
            continue
        if tv in seen:
            if seen[tv] is not rv:
                return False
            continue
        seen[tv] = rv
        if (tv.shape, tv.dtype) != (rv.shape, rv.dtype):
            return False
        if tv in leaves:
            if leaves[tv] is not rv:
                return False
            continue
        te, ri = tprod.get(tv), w.prod.get(rv)
        if te is None or ri is None:
            return False
        re = w.eqns[ri]
        if te.prim is not re.prim or te.params != re.params or \
                len(te.inputs) != len(re.inputs) or \
                te.outputs.index(tv) != re.outputs.index(rv):
            return False
        stack.extend(zip(te.inputs, re.inputs, strict=True))
    return True


def _template(build: Callable[..., Var], operands: list[Var]) -> tuple[Graph, Var, dict]:
    """The defining chain traced over stand-ins of ``operands``: (graph, its value, stand-in
    -> operand)."""
    from ..ops.builder import Builder

    b = Builder()
    ins = [b.input(f"x{i}", v.shape, v.dtype) for i, v in enumerate(operands)]
    out = build(b, *ins)
    return b.build(), out, dict(zip(ins, operands, strict=True))


def _block_topk(w: _Walk, e: Eqn) -> Eqn | None:
    """BlockTopK from ``Select(ok, TopK(masked), -1)`` (``ops.sparse.block_topk``)."""
    from ..ops.sparse import block_topk

    if e.prim is not P.SELECT or _lit(e.inputs[2]) != -1:
        return None
    top = w.eqn(e.inputs[1], P.TOPK)
    masked = top and w.eqn(top.inputs[0], P.SELECT)
    clean = masked and w.eqn(masked.inputs[1], P.SELECT)
    ok = w.eqn(e.inputs[0], P.COMPARE)
    ends = ok and w.eqn(ok.inputs[0], P.MUL)
    qpos = masked and w.arg(w.arg(masked.inputs[0], P.COMPARE, 1), P.RESHAPE)
    bs = _lit(ends.inputs[1]) if ends else None
    if not (top and clean and qpos is not None and bs is not None and bs == int(bs) >= 1):
        return None
    scores = clean.inputs[1]
    try:
        tmpl, out, leaves = _template(
            lambda b, s, qp: block_topk(b, s, qp, int(bs), top.params["k"]), [scores, qpos])
    except PootvkError:
        return None
    if not same_chain(w, e.out, tmpl, out, leaves):
        return None
    return Eqn(P.BLOCK_TOPK, (scores, qpos), e.outputs,
               Params(block_size=int(bs), top_k=top.params["k"]))


def _gathered(w: _Walk, x: Var | None) -> tuple[Var | None, Eqn | None, Var | None]:
    """For ``Select(keep, [Convert](Gather(Reshape(src), rows)), 0)``: the [B, Hkv, Lk, D]
    operand ``src``, that Gather eqn and None; for a split key's
    ``Concat(Gather(..k..), Broadcast(Gather(..k_shared..)))`` under the same Select, k, k's
    Gather and k_shared."""
    y = _unconvert(w, w.arg(x, P.SELECT, 1))
    cat = w.eqn(y, P.CONCAT, axis=4)
    shared = None
    if cat is not None and len(cat.inputs) == 2:
        shared = w.arg(w.arg(w.arg(cat.inputs[1], P.BROADCAST), P.GATHER), P.RESHAPE)
        y = cat.inputs[0]
    gat = w.eqn(y, P.GATHER)
    return (None if gat is None else w.arg(gat.inputs[0], P.RESHAPE)), gat, shared


def _unconvert(w: _Walk, y: Var | None) -> Var | None:
    """The 16-bit source of ``Convert(y16 -> F32)``, else ``y`` itself."""
    c = w.arg(y, P.CONVERT, 0, dtype=F32)
    return y if c is None else c


def _selected_attention(w: _Walk, e: Eqn, ranges: dict) -> Eqn | None:
    """SelectedAttention from the final Reshape of ``ops.sparse.selected_attention``."""
    from ..ops.sparse import selected_attention

    mm = w.eqn(w.arg(e.out, P.RESHAPE), P.TRANSPOSE)
    mm = mm and w.eqn(mm.inputs[0], P.MATMUL)
    if not mm or mm.out.ndim != 5:
        return None
    probs, vsel = mm.inputs
    v, vgat, _ = _gathered(w, vsel)
    ex = w.arg(probs, P.DIV)
    s = w.arg(w.arg(w.arg(ex, P.UNARY, op=UnaryOp.EXP), P.SUB), P.SELECT, 1)
    softcap = None
    outer = w.eqn(s, P.MUL)
    inner = outer and w.eqn(w.arg(outer.inputs[0], P.UNARY, op=UnaryOp.TANH), P.DIV)
    if inner:
        softcap, s = _lit(outer.inputs[1]), inner.inputs[0]
    smul = w.eqn(s, P.MUL)
    qk = smul and w.eqn(smul.inputs[0], P.MATMUL)
    if not qk or v is None or _lit(smul.inputs[1]) is None:
        return None
    q = w.arg(w.arg(qk.inputs[0], P.TRANSPOSE), P.RESHAPE)
    k, _, k_shared = _gathered(w, w.arg(qk.inputs[1], P.TRANSPOSE))
    rows = vgat and w.eqn(vgat.inputs[1], P.ADD)
    pos = rows and w.arg(w.arg(rows.inputs[1], P.MAX), P.MIN)
    scaled = w.eqn(w.arg(pos, P.RESHAPE), P.ADD)
    mul = scaled and w.eqn(scaled.inputs[0], P.MUL)
    ids = mul and w.arg(w.arg(mul.inputs[0], P.RESHAPE), P.CONCAT)
    visible = w.eqn(w.arg(w.arg(vsel, P.SELECT, 0), P.RESHAPE), P.MIN)
    qpos = visible and w.arg(w.arg(visible.inputs[1], P.COMPARE, 1), P.RESHAPE)
    bs = _lit(mul.inputs[1]) if mul else None
    if q is None or k is None or ids is None or qpos is None or bs is None \
            or bs != int(bs) or bs < 1:
        return None
    scale = _lit(smul.inputs[1])
    ops = [q, k, v, ids, qpos, *(() if k_shared is None else (k_shared,))]
    try:
        tmpl, out, leaves = _template(
            lambda b, *xs: selected_attention(b, *xs[:5], int(bs), scale, softcap, *xs[5:]),
            ops)
    except PootvkError:
        return None
    if not same_chain(w, e.out, tmpl, out, leaves):
        return None
    # the kernel's contract: BlockTopK's ids over the same positions, positions in the cache
    sel = w.eqn(ids, P.BLOCK_TOPK, block_size=int(bs))
    rng = ranges.get(qpos)
    lk = k.shape[2]
    if sel is None or sel.inputs[1] is not qpos or rng is None or \
            not 0 <= rng[0] <= rng[1] <= lk - 1:
        return None
    form = SelectedForm(scale=float(scale), block_size=int(bs), softcap=softcap,
                        n_rep=q.shape[1] // k.shape[1], kv_dtype=k.dtype,
                        shared_width=0 if k_shared is None else k_shared.shape[3])
    try:
        new_eqn(P.SELECTED_ATTENTION, ops, form=form)
    except PootvkError:
        return None
    return Eqn(P.SELECTED_ATTENTION, tuple(ops), e.outputs, Params(form=form))


def selection(g: Graph) -> Graph:
    """Form BlockTopK, then SelectedAttention over its ids; everything else as it is."""
    if not any(e.prim is P.TOPK for e in g.eqns):
        return g
    eqns = list(g.eqns)
    w = _Walk(eqns)
    for i, e in enumerate(eqns):
        f = _block_topk(w, e)
        if f is not None:
            eqns[i] = f  # same outputs, same index: the walk below sees BlockTopK
    ranges = value_ranges(g)
    for i, e in enumerate(eqns):
        f = _selected_attention(w, e, ranges) if e.prim is P.RESHAPE else None
        if f is not None:
            eqns[i] = f
    return dead_code_elimination(g.replace(eqns))
