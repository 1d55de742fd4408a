"""Oracle rules of the fused elementwise primitives: the body evaluated node by node through
``eval_eqn`` itself (the rules, the 16-bit contract and the rounding the unfused chain's eqns
run), so a fused eqn gives the chain's answer bit for bit."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir import Eqn, Literal, Params, Var
from ..ir import prims as P
from ..ir.fused import FUSED, FUSED_REDUCE, FUSED_ROW, FUSED_UPDATE, FusedBody, Leaf, update_parts
from .evaluate import _literal, eval_eqn, eval_rules

rule = eval_rules.register


def _apply(prim: P.Prim, params: Params, args: Sequence[np.ndarray], out: Var) -> np.ndarray:
    """What ``eval_eqn`` gives for one eqn of ``prim`` (its 16-bit contract included)."""
    ins = tuple(Var(a.shape, out.dtype) for a in args)  # eval_eqn reads only the outputs
    (v,) = eval_eqn(Eqn(prim, ins, (out,), params), args)
    return v


def eval_body(
    body: FusedBody, xs: Sequence[np.ndarray], reduced: np.ndarray | None = None
) -> np.ndarray:
    """Every node in order: a leaf is its operand or its literal bound as the oracle binds a
    Literal; a prim node (an index-moving Slice or Concat too) is what ``eval_eqn`` gives
    for the eqn it stands for."""
    vals: list[np.ndarray] = []
    for n in body.nodes:
        if n.op is Leaf.OPERAND:
            v = xs[n.params["index"]]
        elif n.op is Leaf.LITERAL:
            v = _literal(Literal(n.params["value"], n.dtype))
        elif n.op is Leaf.REDUCED:
            assert reduced is not None
            v = reduced
        else:
            v = _apply(n.op, n.params, [vals[a] for a in n.args], Var(n.shape, n.dtype))
        vals.append(v)
    return vals[-1]


@rule(FUSED)
def _fused(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return eval_body(p["body"], xs)


def _reduce(x: np.ndarray, p: Params, keepdim: bool, out: Var) -> np.ndarray:
    return _apply(P.REDUCE, Params(op=p["op"], axis=p["axis"], keepdim=keepdim), [x], out)


def _reduced_var(body: FusedBody, p: Params, keepdim: bool) -> Var:
    shape = list(body.out.shape)
    if keepdim:
        shape[p["axis"]] = 1
    else:
        del shape[p["axis"]]
    return Var(tuple(shape), body.out.dtype)


@rule(FUSED_REDUCE)
def _fused_reduce(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    body = p["body"]
    return _reduce(eval_body(body, xs), p, p["keepdim"], _reduced_var(body, p, p["keepdim"]))


@rule(FUSED_ROW)
def _fused_row(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    body = p["body"]
    x = eval_body(body, xs[: body.n_operands])
    red = _reduce(x, p, True, _reduced_var(body, p, True))
    return eval_body(p["epilogue"], xs, red)


@rule(FUSED_UPDATE)
def _fused_update(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    """The body's value written by DynamicUpdateSlice's own rule (its clamp and gates)."""
    shapes = [Var(x.shape, P.I32) for x in xs]  # only the state's rank is read
    state, ops, starts, gates = update_parts(FUSED_UPDATE, shapes, p)
    n, r = len(ops), len(starts)
    body = p["body"]
    update = eval_body(body, xs[1:1 + n])
    out = Var(state.shape, body.out.dtype)
    args = [xs[0], update, *xs[1 + n:1 + n + r], *xs[1 + n + r:]]
    (v,) = eval_eqn(Eqn(P.DYNAMIC_UPDATE_SLICE, tuple(Var(a.shape, out.dtype) for a in args),
                        (out,), Params()), args)
    return v
