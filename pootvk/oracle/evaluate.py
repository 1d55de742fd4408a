"""The numpy oracle: evaluates any ``ir.Graph``, primitive by primitive (a rule table).

It is the truth every later stage is tested against, so it is written for clarity and for
IEEE behaviour that matches the kernels' contract: a ``-inf`` score adds zero weight, and a
row that sees no key is 0/0 (NaN). Values are freed after their last use, the same walk that
gives the arena its liveness intervals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..errors import UnsupportedPrimitive
from ..ir import (
    F32,
    CompareOp,
    Eqn,
    Graph,
    Literal,
    Params,
    ReduceOp,
    RuleTable,
    UnaryOp,
    Var,
    attention_operands,
)
from ..ir import prims as P
from ..ir.bind import check_bind
from ..ir.dtypes import storage_values

EvalRule = Callable[[Sequence[np.ndarray], Params], np.ndarray]
eval_rules: RuleTable[P.Prim, EvalRule] = RuleTable(
    "oracle", lambda p, why: UnsupportedPrimitive(str(p), why)
)
rule = eval_rules.register

BINARY: dict[P.Prim, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    P.ADD: np.add, P.SUB: np.subtract, P.MUL: np.multiply, P.DIV: np.divide,
    P.MAX: np.maximum, P.MIN: np.minimum,
}


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> EvalRule:
    def f(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(xs[0], xs[1])

    return f


for _prim, _fn in BINARY.items():
    rule(_prim)(_binary(_fn))

UNARY: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.EXP: np.exp,
    UnaryOp.TANH: np.tanh,
    UnaryOp.NEG: np.negative,
    UnaryOp.RSQRT: lambda x: np.reciprocal(np.sqrt(x)),
    UnaryOp.SQRT: np.sqrt,
    UnaryOp.LOG: np.log,
    UnaryOp.ABS: np.abs,
    UnaryOp.RECIP: np.reciprocal,
    UnaryOp.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    UnaryOp.SILU: lambda x: x / (1 + np.exp(-x)),
    UnaryOp.COS: np.cos,
    UnaryOp.SIN: np.sin,
}
COMPARE: dict[CompareOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    CompareOp.LT: np.less, CompareOp.LE: np.less_equal, CompareOp.GT: np.greater,
    CompareOp.GE: np.greater_equal, CompareOp.EQ: np.equal, CompareOp.NE: np.not_equal,
}


@rule(P.UNARY)
def _unary(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    with np.errstate(all="ignore"):
        return UNARY[p["op"]](xs[0])


@rule(P.COMPARE)
def _compare(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return COMPARE[p["op"]](xs[0], xs[1])


@rule(P.SELECT)
def _select(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return np.where(xs[0], xs[1], xs[2])


@rule(P.CONVERT)
def _convert(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return xs[0].astype(p["dtype"].numpy)


@rule(P.IOTA)
def _iota(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    shape, axis = tuple(p["shape"]), p["axis"]
    r = np.arange(shape[axis], dtype=p["dtype"].numpy)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(r.reshape(view), shape).copy()


@rule(P.COPY)
def _copy(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return xs[0].copy()


@rule(P.RESHAPE)
def _reshape(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return xs[0].reshape(p["shape"])


@rule(P.BROADCAST)
def _broadcast(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return np.broadcast_to(xs[0], p["shape"]).copy()


@rule(P.TRANSPOSE)
def _transpose(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(xs[0], p["perm"]))


@rule(P.SLICE)
def _slice(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return xs[0][tuple(slice(s, e) for s, e in zip(p["start"], p["limit"], strict=True))].copy()


@rule(P.CONCAT)
def _concat(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return np.concatenate(xs, axis=p["axis"])


@rule(P.MATMUL)
def _matmul(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.matmul(xs[0], xs[1])


@rule(P.REDUCE)
def _reduce(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    fn = np.max if p["op"] is ReduceOp.MAX else np.sum
    with np.errstate(all="ignore"):
        return fn(xs[0], axis=p["axis"], keepdims=p["keepdim"])


@rule(P.DYNAMIC_UPDATE_SLICE)
def _dus(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    operand, update, *rest = xs
    starts, gates = rest[: operand.ndim], rest[operand.ndim:]
    out = operand.copy()
    if any(int(w[0]) for w in gates):  # a guard of this step failed: nothing is written
        return out
    idx = []
    for s, o, u in zip(starts, operand.shape, update.shape, strict=True):
        s0 = int(np.clip(int(s), 0, o - u))  # clamped so the update fits, as in XLA
        idx.append(slice(s0, s0 + u))
    out[tuple(idx)] = update
    return out


@rule(P.SCATTER_UPDATE)
def _scatter_update(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    """Row ``indices[n]`` of the operand becomes ``updates[n]``, in order of n (a later
    update of the same row wins); an index outside [0, S) (-1: "no row") writes nothing."""
    operand, indices, updates = xs
    out = operand.copy()
    for n, i in enumerate(indices.tolist()):
        if 0 <= i < operand.shape[0]:
            out[i] = updates[n]
    return out


@rule(P.GATHER)
def _gather(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    """Rows of the table; an index outside [0, V) reads the nearest row (clamped)."""
    table, idx = xs
    return np.take(table, np.clip(idx.astype(np.int64), 0, table.shape[0] - 1), axis=0)


@rule(P.ATTENTION)
def _attention(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    """The fused op, computed by the very rules of the chain it replaced (bit-identical)."""
    form = p["form"]
    ops = attention_operands(form, xs)
    q, k, v = ops["q"], ops["k"], ops["v"]
    n_rep = form.n_rep
    if "read" in ops:  # the paged key's chain: the pools gathered through read, transposed
        k, v = (_transpose([_gather([pool, ops["read"]], Params())], Params(perm=(0, 2, 1, 3)))
                for pool in (k, v))
    if "k_shared" in ops:  # the split key's chain: concat(k, broadcast(k_shared)), stored
        ks = ops["k_shared"]
        ks = _broadcast([ks], Params(shape=(*k.shape[:3], ks.shape[3])))
        k = _concat([k, ks], Params(axis=3))
    if form.kv_dtype is not F32:  # the chain's Convert(k16 -> F32), as its rule computes it
        k, v = _convert([k], Params(dtype=F32)), _convert([v], Params(dtype=F32))
    live_keys = None
    if form.live:  # ops.attention_live's selects: K/V rows to zero, then scores to -inf
        lb = ops["len"].reshape(-1, 1, 1, 1)
        rows = np.arange(k.shape[2]).reshape(1, 1, -1, 1) < lb
        k, v = np.where(rows, k, k.dtype.type(0)), np.where(rows, v, v.dtype.type(0))
        live_keys = np.arange(k.shape[2]).reshape(1, 1, 1, -1) < lb

    def rep(x: np.ndarray) -> np.ndarray:
        if n_rep == 1:
            return x
        b, h, length, d = x.shape
        y = _reshape([x], Params(shape=(b, h, 1, length, d)))
        y = _broadcast([y], Params(shape=(b, h, n_rep, length, d)))
        return _reshape([y], Params(shape=(b, h * n_rep, length, d)))

    f32 = q.dtype.type
    mul, div, none = eval_rules[P.MUL], eval_rules[P.DIV], Params()
    s = _matmul([q, _transpose([rep(k)], Params(perm=(0, 1, 3, 2)))], none)
    s = mul([s, f32(form.scale)], none)
    if form.softcap is not None:
        cap = f32(form.softcap)
        s = mul([_unary([div([s, cap], none)], Params(op=UnaryOp.TANH)), cap], none)
    if "mask" in ops:
        s = eval_rules[P.ADD]([s, ops["mask"]], none)
    if live_keys is not None:
        s = np.where(live_keys, s, f32(-np.inf))
    m = _reduce([s], Params(op=ReduceOp.MAX, axis=3, keepdim=True))
    ex = _unary([eval_rules[P.SUB]([s, m], none)], Params(op=UnaryOp.EXP))
    den = _reduce([ex], Params(op=ReduceOp.SUM, axis=3, keepdim=True))
    return _matmul([div([ex, den], none), rep(v)], none)


@rule(P.INDEX_GUARD)
def _index_guard(xs: Sequence[np.ndarray], p: Params) -> tuple[np.ndarray, np.ndarray]:
    """(clamp(x, lo, hi), [count outside, first offending value]): the kernel reports the
    same count and one offending value (which one, when several, is its arrival order)."""
    x, lo, hi = xs[0], p["lo"], p["hi"]
    bad = (x < lo) | (x > hi)
    first = int(x[bad].flat[0]) if bad.any() else 0
    witness = np.array([int(bad.sum()), first], np.int32)
    return np.clip(x, lo, hi).astype(np.int32), witness


def _literal(v: Literal) -> np.ndarray:
    return storage_values(np.asarray(v.value), v.dtype)


def eval_eqn(e: Eqn, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """One eqn, with the device's 16-bit contract: F16/BF16 operands are computed in F32
    (numpy's own float16 sums and products accumulate in float16) and every result is
    held as its dtype stores it (``storage_values``), rounded to 16 bits once."""
    args = [a.astype(np.float32) if a.dtype == np.float16 else a for a in args]
    out = eval_rules[e.prim](args, e.params)
    outs = list(out) if len(e.outputs) > 1 else [out]  # a multi-output rule returns a tuple
    with np.errstate(all="ignore"):
        return [storage_values(np.asarray(o), v.dtype)
                for o, v in zip(outs, e.outputs, strict=True)]


def evaluate(g: Graph, inputs: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Run ``g`` on bound inputs; returns exports, state outputs and validation witnesses.

    Values are dropped after their last use (``Graph.use_info``, the walk the arena's
    liveness reads too)."""
    env: dict[Var, np.ndarray] = {}
    for name, arr in check_bind(g, inputs).items():
        env[g.slot(name).var] = arr
    for name, arr in g.constants.items():
        env[g.slot(name).var] = arr
    info = g.use_info()
    for i, e in enumerate(g.eqns):
        args = [_literal(v) if isinstance(v, Literal) else env[v] for v in e.inputs]
        for o, val in zip(e.outputs, eval_eqn(e, args), strict=True):
            env[o] = val
        for v in e.inputs:
            if info.last_use(v) == i and v not in info.observed and not isinstance(v, Literal):
                env.pop(v, None)
    return {name: env[v] for name, v in g.outputs().items()}
