"""The numpy oracle: evaluates any ``ir.Graph``, primitive by primitive (a rule table).

It is the truth every later stage is tested against, so it is written for clarity and for
IEEE behaviour that matches the kernels' contract: a ``-inf`` score adds zero weight, and a
row that sees no key is 0/0 (NaN). Values are freed after their last use, the same walk that
gives the arena its liveness intervals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..ir import Eqn, Graph, Literal, Params, Var
from ..ir.bind import check_bind

EvalRule = Callable[[Sequence[np.ndarray], Params], np.ndarray]
eval_rules: dict[str, EvalRule] = {}


def rule(name: str) -> Callable[[EvalRule], EvalRule]:
    def deco(f: EvalRule) -> EvalRule:
        eval_rules[name] = f
        return f

    return deco


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> EvalRule:
    def f(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(xs[0], xs[1])

    return f


eval_rules.update(
    Add=_binary(np.add),
    Sub=_binary(np.subtract),
    Mul=_binary(np.multiply),
    Div=_binary(np.divide),
    Max=_binary(np.maximum),
    Min=_binary(np.minimum),
)

UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Exp": np.exp,
    "Tanh": np.tanh,
    "Neg": np.negative,
    "Rsqrt": lambda x: np.reciprocal(np.sqrt(x)),
    "Sqrt": np.sqrt,
    "Log": np.log,
    "Abs": np.abs,
    "Recip": np.reciprocal,
}
COMPARE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Lt": np.less, "Le": np.less_equal, "Gt": np.greater, "Ge": np.greater_equal,
    "Eq": np.equal, "Ne": np.not_equal,
}


@rule("Unary")
def _unary(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    with np.errstate(all="ignore"):
        return UNARY[p["op"]](xs[0])


@rule("Compare")
def _compare(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return COMPARE[p["op"]](xs[0], xs[1])


@rule("Select")
def _select(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return np.where(xs[0], xs[1], xs[2])


@rule("Convert")
def _convert(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return xs[0].astype(p["dtype"].numpy)


@rule("Iota")
def _iota(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    shape, axis = tuple(p["shape"]), p["axis"]
    r = np.arange(shape[axis], dtype=p["dtype"].numpy)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(r.reshape(view), shape).copy()


@rule("Reshape")
def _reshape(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return xs[0].reshape(p["shape"])


@rule("Broadcast")
def _broadcast(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return np.broadcast_to(xs[0], p["shape"]).copy()


@rule("Transpose")
def _transpose(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(xs[0], p["perm"]))


@rule("Slice")
def _slice(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return xs[0][tuple(slice(s, e) for s, e in zip(p["start"], p["limit"], strict=True))].copy()


@rule("Concat")
def _concat(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return np.concatenate(xs, axis=p["axis"])


@rule("MatMul")
def _matmul(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.matmul(xs[0], xs[1])


@rule("Reduce")
def _reduce(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    fn = np.max if p["op"] == "Max" else np.sum
    with np.errstate(all="ignore"):
        return fn(xs[0], axis=p["axis"], keepdims=p["keepdim"])


@rule("DynamicUpdateSlice")
def _dus(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    operand, update, *starts = xs
    out = operand.copy()
    idx = []
    for s, o, u in zip(starts, operand.shape, update.shape, strict=True):
        s0 = int(np.clip(int(s), 0, o - u))  # clamped so the update fits, as in XLA
        idx.append(slice(s0, s0 + u))
    out[tuple(idx)] = update
    return out


@rule("Attention")
def _attention(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    """The fused op, computed by the very rules of the chain it replaced (bit-identical)."""
    q, k, v, *rest = xs
    n_rep = p["n_rep"]

    def rep(x: np.ndarray) -> np.ndarray:
        if n_rep == 1:
            return x
        b, h, length, d = x.shape
        y = _reshape([x], Params(shape=(b, h, 1, length, d)))
        y = _broadcast([y], Params(shape=(b, h, n_rep, length, d)))
        return _reshape([y], Params(shape=(b, h * n_rep, length, d)))

    f32 = q.dtype.type
    s = _matmul([q, _transpose([rep(k)], Params(perm=(0, 1, 3, 2)))], Params())
    s = eval_rules["Mul"]([s, f32(p["scale"])], Params())
    if p["softcap"] is not None:
        cap = f32(p["softcap"])
        s = eval_rules["Div"]([s, cap], Params())
        s = eval_rules["Mul"]([_unary([s], Params(op="Tanh")), cap], Params())
    if rest:
        s = eval_rules["Add"]([s, rest[0]], Params())
    m = _reduce([s], Params(op="Max", axis=3, keepdim=True))
    ex = _unary([eval_rules["Sub"]([s, m], Params())], Params(op="Exp"))
    den = _reduce([ex], Params(op="Sum", axis=3, keepdim=True))
    pr = eval_rules["Div"]([ex, den], Params())
    return _matmul([pr, rep(v)], Params())


def _literal(v: Literal) -> np.ndarray:
    return np.asarray(v.value, dtype=v.dtype.numpy)


def eval_eqn(e: Eqn, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = eval_rules[e.prim](args, e.params)
    outs = [out]
    return [np.asarray(o, dtype=v.dtype.numpy) for o, v in zip(outs, e.outputs, strict=True)]


def evaluate(g: Graph, inputs: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Run ``g`` on bound inputs; returns exports, state outputs and validation witnesses."""
    env: dict[Var, np.ndarray] = {}
    for name, arr in check_bind(g, inputs).items():
        env[g.slot(name).var] = arr
    keep = set(g.outputs().values())
    last_use: dict[Var, int] = {}
    for i, e in enumerate(g.eqns):
        for v in e.inputs:
            last_use[v] = i
    for i, e in enumerate(g.eqns):
        args = [_literal(v) if isinstance(v, Literal) else env[v] for v in e.inputs]
        for o, val in zip(e.outputs, eval_eqn(e, args), strict=True):
            env[o] = val
        for v in e.inputs:
            if last_use.get(v) == i and v not in keep and not isinstance(v, Literal):
                env.pop(v, None)
    return {name: env[v] for name, v in g.outputs().items()}
