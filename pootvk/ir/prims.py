"""The primitive set and its typing rules, as a table keyed by primitive name.

``shape_rules[prim](inputs, params) -> [(shape, dtype), ...]`` types an eqn; the tracer uses
it to make output Vars and :func:`check_graph` re-runs it after every pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ShapeError
from .dtypes import BOOL, I32, DType
from .graph import Eqn, Graph, Literal, Params, Var

Aval = tuple[tuple[int, ...], DType]
ShapeRule = Callable[[Sequence[Var], Params], list[Aval]]

BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min")
UNARY_OPS = ("Exp", "Tanh", "Neg", "Rsqrt", "Sqrt", "Log", "Abs", "Recip")
COMPARE_OPS = ("Lt", "Le", "Gt", "Ge", "Eq", "Ne")
REDUCE_OPS = ("Max", "Sum")
MASK_KINDS = ("none", "additive")

shape_rules: dict[str, ShapeRule] = {}


def rule(name: str) -> Callable[[ShapeRule], ShapeRule]:
    def deco(f: ShapeRule) -> ShapeRule:
        shape_rules[name] = f
        return f

    return deco


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError as e:
        raise ShapeError(f"shapes {list(shapes)} do not broadcast") from e


def _same_dtype(prim: str, xs: Sequence[Var]) -> DType:
    dts = {x.dtype for x in xs}
    if len(dts) != 1:
        raise ShapeError(f"{prim}: operand dtypes differ: {[x.dtype.value for x in xs]}")
    return xs[0].dtype


def _binary(prim: str) -> ShapeRule:
    def f(xs: Sequence[Var], p: Params) -> list[Aval]:
        if len(xs) != 2:
            raise ShapeError(f"{prim} takes 2 operands, got {len(xs)}")
        return [(broadcast_shapes(xs[0].shape, xs[1].shape), _same_dtype(prim, xs))]

    return f


for _b in BINARY:
    shape_rules[_b] = _binary(_b)


@rule("Unary")
def _unary(xs: Sequence[Var], p: Params) -> list[Aval]:
    if p["op"] not in UNARY_OPS:
        raise ShapeError(f"Unary op {p['op']!r} not in {UNARY_OPS}")
    return [(xs[0].shape, xs[0].dtype)]


@rule("Compare")
def _compare(xs: Sequence[Var], p: Params) -> list[Aval]:
    if p["op"] not in COMPARE_OPS:
        raise ShapeError(f"Compare op {p['op']!r} not in {COMPARE_OPS}")
    _same_dtype("Compare", xs)
    return [(broadcast_shapes(xs[0].shape, xs[1].shape), BOOL)]


@rule("Select")
def _select(xs: Sequence[Var], p: Params) -> list[Aval]:
    pred, a, b = xs
    if pred.dtype is not BOOL:
        raise ShapeError(f"Select predicate must be bool, got {pred.dtype.value}")
    return [(broadcast_shapes(pred.shape, a.shape, b.shape), _same_dtype("Select", (a, b)))]


@rule("Convert")
def _convert(xs: Sequence[Var], p: Params) -> list[Aval]:
    return [(xs[0].shape, p["dtype"])]


@rule("Iota")
def _iota(xs: Sequence[Var], p: Params) -> list[Aval]:
    shape, axis = tuple(p["shape"]), p["axis"]
    if not 0 <= axis < len(shape):
        raise ShapeError(f"Iota axis {axis} out of range for shape {shape}")
    return [(shape, p["dtype"])]


@rule("Reshape")
def _reshape(xs: Sequence[Var], p: Params) -> list[Aval]:
    shape = tuple(p["shape"])
    if int(np.prod(shape)) != xs[0].size:
        raise ShapeError(f"Reshape {xs[0].shape} -> {shape} changes the element count")
    return [(shape, xs[0].dtype)]


@rule("Broadcast")
def _broadcast(xs: Sequence[Var], p: Params) -> list[Aval]:
    shape = tuple(p["shape"])
    if broadcast_shapes(xs[0].shape, shape) != shape:
        raise ShapeError(f"Broadcast {xs[0].shape} -> {shape} is not a broadcast")
    return [(shape, xs[0].dtype)]


@rule("Transpose")
def _transpose(xs: Sequence[Var], p: Params) -> list[Aval]:
    perm = tuple(p["perm"])
    if sorted(perm) != list(range(xs[0].ndim)):
        raise ShapeError(f"Transpose perm {perm} is not a permutation of rank {xs[0].ndim}")
    return [(tuple(xs[0].shape[i] for i in perm), xs[0].dtype)]


@rule("Slice")
def _slice(xs: Sequence[Var], p: Params) -> list[Aval]:
    start, limit = tuple(p["start"]), tuple(p["limit"])
    x = xs[0]
    if len(start) != x.ndim or len(limit) != x.ndim:
        raise ShapeError(f"Slice bounds {start}..{limit} do not match rank {x.ndim}")
    for s, lim, n in zip(start, limit, x.shape, strict=True):
        if not 0 <= s <= lim <= n:
            raise ShapeError(f"Slice {start}..{limit} out of bounds for {x.shape}")
    return [(tuple(lim - s for s, lim in zip(start, limit, strict=True)), x.dtype)]


@rule("Concat")
def _concat(xs: Sequence[Var], p: Params) -> list[Aval]:
    axis = p["axis"]
    dt = _same_dtype("Concat", xs)
    base = list(xs[0].shape)
    for x in xs[1:]:
        if x.ndim != len(base) or any(
            a != b for i, (a, b) in enumerate(zip(x.shape, base, strict=True)) if i != axis
        ):
            raise ShapeError(f"Concat shapes {[x.shape for x in xs]} differ off axis {axis}")
    base[axis] = sum(x.shape[axis] for x in xs)
    return [(tuple(base), dt)]


@rule("MatMul")
def _matmul(xs: Sequence[Var], p: Params) -> list[Aval]:
    a, b = xs
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"MatMul {a.shape} @ {b.shape}: contraction dims differ")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [(batch + (a.shape[-2], b.shape[-1]), _same_dtype("MatMul", xs))]


@rule("Reduce")
def _reduce(xs: Sequence[Var], p: Params) -> list[Aval]:
    x, axis = xs[0], p["axis"]
    if p["op"] not in REDUCE_OPS:
        raise ShapeError(f"Reduce op {p['op']!r} not in {REDUCE_OPS}")
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"Reduce axis {axis} out of range for {x.shape}")
    shape = list(x.shape)
    if p["keepdim"]:
        shape[axis] = 1
    else:
        del shape[axis]
    return [(tuple(shape), x.dtype)]


@rule("DynamicUpdateSlice")
def _dus(xs: Sequence[Var], p: Params) -> list[Aval]:
    operand, update, *starts = xs
    if update.ndim != operand.ndim or any(
        u > o for u, o in zip(update.shape, operand.shape, strict=True)
    ):
        raise ShapeError(f"DynamicUpdateSlice update {update.shape} does not fit {operand.shape}")
    if len(starts) != operand.ndim or any(s.shape != () or s.dtype is not I32 for s in starts):
        raise ShapeError("DynamicUpdateSlice needs one scalar i32 start per operand axis")
    _same_dtype("DynamicUpdateSlice", (operand, update))
    return [(operand.shape, operand.dtype)]


@rule("Attention")
def _attention(xs: Sequence[Var], p: Params) -> list[Aval]:
    q, k, v, *rest = xs
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ShapeError(f"Attention wants rank-4 q/k/v, got {q.shape} {k.shape} {v.shape}")
    b, hq, lq, dk = q.shape
    bk, hkv, lk, dk2 = k.shape
    if (bk, dk2) != (b, dk) or v.shape[:3] != (b, hkv, lk):
        raise ShapeError(f"Attention q {q.shape}, k {k.shape}, v {v.shape} do not agree")
    if hkv * p["n_rep"] != hq:
        raise ShapeError(f"Attention Hq={hq} is not Hkv={hkv} * n_rep={p['n_rep']}")
    if p["mask_kind"] == "additive":
        (m,) = rest
        mb, mh, mq, mk = m.shape
        if mb not in (1, b) or mh not in (1, hq) or mq not in (1, lq) or mk != lk:
            raise ShapeError(f"Attention mask {m.shape} does not fit [{b},1|{hq},{lq},{lk}]")
    elif rest:
        raise ShapeError("Attention with mask_kind 'none' takes no mask operand")
    _same_dtype("Attention", xs)
    return [((b, hq, lq, v.shape[3]), q.dtype)]


def type_eqn(prim: str, inputs: Sequence[Var], params: dict[str, Any] | Params) -> list[Aval]:
    if prim not in shape_rules:
        raise ShapeError(f"unknown primitive {prim!r}")
    return shape_rules[prim](inputs, params if isinstance(params, Params) else Params(params))


def check_graph(g: Graph) -> None:
    """The IR type checker: defined-before-use, SSA, and every eqn re-typed by its rule."""
    defined: set[Var] = {s.var for s in g.slots}
    for e in g.eqns:
        for v in e.inputs:
            if v not in defined and not isinstance(v, Literal):
                raise ShapeError(f"{e.prim} uses a value that is not defined before it")
        avals = type_eqn(e.prim, e.inputs, e.params)
        if [(o.shape, o.dtype) for o in e.outputs] != avals:
            raise ShapeError(f"{e.prim} outputs {[o.aval() for o in e.outputs]} != rule {avals}")
        for o in e.outputs:
            if o in defined:
                raise ShapeError(f"{e.prim} redefines a value")
            defined.add(o)
    for name, v in g.outputs().items():
        if v not in defined:
            raise ShapeError(f"output {name!r} is not defined")
    for name, v in g.states.items():
        s = g.slot(name)
        if (s.var.shape, s.var.dtype) != (v.shape, v.dtype):
            raise ShapeError(f"state {name!r} changes type {s.var.aval()} -> {v.aval()}")


def new_eqn(prim: str, inputs: Sequence[Var], **params: Any) -> Eqn:
    """Type an eqn and make its output Vars."""
    p = Params(params)
    outs = tuple(Var(s, d) for s, d in type_eqn(prim, inputs, p))
    return Eqn(prim, tuple(inputs), outs, p)
