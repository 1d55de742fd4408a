"""Oracle rules of the fused elementwise primitives: the body evaluated node by node with the
very rules (and the very dtype coercion) the unfused chain's eqns run, so a fused eqn gives
the chain's answer bit for bit."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir import Params
from ..ir import prims as P
from ..ir.fused import FUSED, FUSED_REDUCE, FUSED_ROW, FusedBody, Leaf
from .evaluate import eval_rules

rule = eval_rules.register


def eval_body(
    body: FusedBody, xs: Sequence[np.ndarray], reduced: np.ndarray | None = None
) -> np.ndarray:
    """Every node in order: a leaf is its operand or ``np.asarray(value, dtype)`` (as the
    oracle binds a Literal), a prim node is its rule's result coerced to the node's dtype (as
    ``eval_eqn`` coerces an eqn's)."""
    vals: list[np.ndarray] = []
    for n in body.nodes:
        if n.op is Leaf.OPERAND:
            v = xs[n.params["index"]]
        elif n.op is Leaf.LITERAL:
            v = np.asarray(n.params["value"], dtype=n.dtype.numpy)
        elif n.op is Leaf.REDUCED:
            assert reduced is not None
            v = reduced
        else:
            out = eval_rules[n.op]([vals[a] for a in n.args], n.params)
            v = np.asarray(out, dtype=n.dtype.numpy)
        vals.append(v)
    return vals[-1]


@rule(FUSED)
def _fused(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return eval_body(p["body"], xs)


@rule(FUSED_REDUCE)
def _fused_reduce(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    x = eval_body(p["body"], xs)
    return eval_rules[P.REDUCE]([x], Params(op=p["op"], axis=p["axis"], keepdim=p["keepdim"]))


@rule(FUSED_ROW)
def _fused_row(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    body = p["body"]
    x = eval_body(body, xs[: body.n_operands])
    red = eval_rules[P.REDUCE]([x], Params(op=p["op"], axis=p["axis"], keepdim=True))
    red = np.asarray(red, dtype=body.out.dtype.numpy)  # as eval_eqn coerces the Reduce's
    return eval_body(p["epilogue"], xs, red)
