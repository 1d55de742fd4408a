"""Oracle rule of the folded matmul ``Linear`` (``ir.linear_form``), with its prologue and
epilogue: every part computed by the rules of the chain it replaced, in the chain's order,
so a fused Linear gives the unfused chain's answer bit for bit."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir import F32, Params
from ..ir import prims as P
from ..ir.linear_form import LinearPrologue, split_operands
from .evaluate import _convert, _matmul, eval_rules
from .fused import _reduce, _reduced_var, eval_body


def eval_prologue(pro: LinearPrologue, xs: Sequence[np.ndarray]) -> np.ndarray:
    """``a`` as the ``Fused`` (or, with a row, ``FusedRow`` over the last axis) eqn the
    prologue was made from computes it."""
    if pro.row is None:
        return eval_body(pro.body, xs)
    body = pro.body
    x = eval_body(body, xs[: body.n_operands])
    p = Params(op=pro.op, axis=len(body.out.shape) - 1)
    red = _reduce(x, p, True, _reduced_var(body, p, True))
    return eval_body(pro.row, xs, red)


@eval_rules.register(P.LINEAR)
def _linear(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    """The folded matmul, computed by the rules of the chain it replaced (bit-identical):
    the prologue's eqn, Convert of the 16-bit weight, Transpose of its last two axes,
    MatMul, then the epilogue's eqn reading the product."""
    form = p["form"]
    a_side, w, extras = split_operands(form, xs)  # type: ignore[arg-type]
    a = a_side[0] if form.prologue is None else eval_prologue(form.prologue, a_side)
    if form.b_dtype is not F32:
        w = _convert([w], Params(dtype=F32))
    if form.transpose_b:
        w = np.ascontiguousarray(np.swapaxes(w, -1, -2))
    y = _matmul([a, w], Params())
    if form.epilogue is None:
        return y
    return eval_body(form.epilogue, extras, y)


__all__ = ["eval_prologue"]
