"""The primitive set: ``Prim`` objects, their sub-op enums and their typing rules.

A primitive is an object, not a string: stages key their rule tables by it, and a pass that
names a primitive imports it, so a misspelt one fails at import instead of silently never
matching. ``shape_rules[prim](inputs, params) -> [(shape, dtype), ...]`` types an eqn; the
tracer uses it to make output Vars and :func:`check_graph` re-runs it after every pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any

import numpy as np

from ..errors import ShapeError
from .attention_form import AttentionForm, check_form_operands
from .dtypes import BOOL, F32, I32, DType
from .graph import Eqn, Graph, Literal, Params, Var
from .linear_form import LinearForm, type_linear
from .rules import RuleTable
from .sparse_form import SelectedForm, check_selected, check_selection

Aval = tuple[tuple[int, ...], DType]
ShapeRule = Callable[[Sequence[Var], Params], list[Aval]]


class Prim:
    """A primitive: its name, its operand count (None = variadic) and its params' types.

    Identity is object identity: there is exactly one ``Prim`` per primitive, registered
    in ``PRIMS`` by name when it is made.
    """

    __slots__ = ("name", "arity", "param_types", "fused")

    def __init__(
        self, name: str, arity: int | None, fused: bool = False, **param_types: type | tuple
    ) -> None:
        if name in PRIMS:
            raise RuntimeError(f"primitive {name} defined twice")
        self.name, self.arity, self.fused = name, arity, fused
        self.param_types: Mapping[str, type | tuple] = dict(param_types)
        PRIMS[name] = self

    def check(self, n_inputs: int, params: Mapping[str, Any]) -> None:
        """Operand count and params against the declaration: a malformed eqn never exists."""
        if self.arity is not None and n_inputs != self.arity:
            raise ShapeError(f"{self.name} takes {self.arity} operands, got {n_inputs}")
        if set(params) != set(self.param_types):
            raise ShapeError(
                f"{self.name} params {sorted(params)} != declared {sorted(self.param_types)}"
            )
        for k, t in self.param_types.items():
            if not isinstance(params[k], t) or (t is int and isinstance(params[k], bool)):
                raise ShapeError(f"{self.name} param {k}={params[k]!r} is not {t}")

    def __repr__(self) -> str:
        return self.name


PRIMS: dict[str, Prim] = {}


class UnaryOp(Enum):
    EXP = "Exp"
    TANH = "Tanh"
    NEG = "Neg"
    RSQRT = "Rsqrt"
    SQRT = "Sqrt"
    LOG = "Log"
    ABS = "Abs"
    RECIP = "Recip"
    SIGMOID = "Sigmoid"
    SILU = "Silu"
    COS = "Cos"
    SIN = "Sin"

    @property
    def takes_int(self) -> bool:
        """Whether the op is defined on I32 (Neg, Abs); the others are float-only."""
        return self in (UnaryOp.NEG, UnaryOp.ABS)


class CompareOp(Enum):
    LT = "Lt"
    LE = "Le"
    GT = "Gt"
    GE = "Ge"
    EQ = "Eq"
    NE = "Ne"


class ReduceOp(Enum):
    MAX = "Max"
    SUM = "Sum"


ADD = Prim("Add", 2)
SUB = Prim("Sub", 2)
MUL = Prim("Mul", 2)
DIV = Prim("Div", 2)
MAX = Prim("Max", 2)
MIN = Prim("Min", 2)
BINARY = (ADD, SUB, MUL, DIV, MAX, MIN)
COMMUTATIVE = (ADD, MUL, MAX, MIN)
UNARY = Prim("Unary", 1, op=UnaryOp)
COMPARE = Prim("Compare", 2, op=CompareOp)
SELECT = Prim("Select", 3)
CONVERT = Prim("Convert", 1, dtype=DType)
IOTA = Prim("Iota", 0, shape=tuple, axis=int, dtype=DType)
COPY = Prim("Copy", 1)
RESHAPE = Prim("Reshape", 1, shape=tuple)
BROADCAST = Prim("Broadcast", 1, shape=tuple)
TRANSPOSE = Prim("Transpose", 1, perm=tuple)
SLICE = Prim("Slice", 1, start=tuple, limit=tuple)
CONCAT = Prim("Concat", None, axis=int)
MATMUL = Prim("MatMul", 2)
REDUCE = Prim("Reduce", 1, op=ReduceOp, axis=int, keepdim=bool)
DYNAMIC_UPDATE_SLICE = Prim("DynamicUpdateSlice", None)
SCATTER_UPDATE = Prim("ScatterUpdate", 3)
#: primitives that write their output in place over operand 0 (copied first when the
#: output does not share the operand's storage)
IN_PLACE = (DYNAMIC_UPDATE_SLICE, SCATTER_UPDATE)
GATHER = Prim("Gather", 2)
ATTENTION = Prim("Attention", None, fused=True, form=AttentionForm)
#: IndexGuard(x) -> (clamped, witness): ``clamped = clamp(x, lo, hi)`` and ``witness`` an
#: I32 [2] (count of elements of x outside [lo, hi], one offending value). A graph declares
#: the witness as a validation output; a nonzero count fails the step (``GuardFailed``)
INDEX_GUARD = Prim("IndexGuard", 1, lo=int, hi=int)
#: The witness layout: word 0 counts the offending elements, word 1 holds one of them.
WITNESS_SHAPE = (2,)
#: ``a @ op(w)`` with w read in its stored layout and dtype (passes.matmul_fold makes it),
#: optionally with a prologue computing ``a`` and an epilogue (passes.linear_fuse): operands
#: ``(a-side..., w, epilogue operands...)`` (ir.linear_form)
LINEAR = Prim("Linear", None, fused=True, form=LinearForm)
#: TopK(x) -> the I32 indices [..., k] of the k largest entries along x's last axis (NaN below
#: every number, -0 equal to +0, ties to the lower index), listed in ascending index order
TOPK = Prim("TopK", 1, k=int)
#: BlockTopK(scores [B,Hs,Lq,NB], qpos [B,Lq]) -> ids [B,Hs,Lq,K]: the K complete blocks of
#: highest score, ascending, then -1 (``ir.sparse_form``; ``passes.selection`` forms it)
BLOCK_TOPK = Prim("BlockTopK", 2, fused=True, block_size=int, top_k=int)
#: SelectedAttention(q, k, v, ids, qpos): attention over each row's selected blocks and its
#: own unfinished block, no mask operand (``ir.sparse_form``)
SELECTED_ATTENTION = Prim("SelectedAttention", None, fused=True, form=SelectedForm)

shape_rules: RuleTable[Prim, ShapeRule] = RuleTable(
    "shape", lambda p, why: ShapeError(f"{why} for primitive {p}")
)
rule = shape_rules.register


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError as e:
        raise ShapeError(f"shapes {list(shapes)} do not broadcast") from e


def _same_dtype(prim: Prim, xs: Sequence[Var]) -> DType:
    dts = {x.dtype for x in xs}
    if len(dts) != 1:
        raise ShapeError(f"{prim}: operand dtypes differ: {[x.dtype.value for x in xs]}")
    return xs[0].dtype


@rule(MAX, MIN)
def _minmax(xs: Sequence[Var], p: Params) -> list[Aval]:
    return [(broadcast_shapes(xs[0].shape, xs[1].shape), _same_dtype(MAX, xs))]


@rule(ADD, SUB, MUL, DIV)
def _arith(xs: Sequence[Var], p: Params) -> list[Aval]:
    """Arithmetic on Bool is refused (numpy's Bool Add is Or, its Sub an error): Max/Min
    are Bool's Or/And."""
    dt = _same_dtype(ADD, xs)
    if dt is BOOL:
        raise ShapeError("arithmetic on bool operands: use Max (or), Min (and) or Select")
    return [(broadcast_shapes(xs[0].shape, xs[1].shape), dt)]


@rule(COPY)
def _copy(xs: Sequence[Var], p: Params) -> list[Aval]:
    return [(xs[0].shape, xs[0].dtype)]


@rule(UNARY)
def _unary(xs: Sequence[Var], p: Params) -> list[Aval]:
    dt, op = xs[0].dtype, p["op"]
    if not (dt.is_float or (dt is I32 and op.takes_int)):
        raise ShapeError(f"Unary {op.value} is not defined on {dt.value}")
    return [(xs[0].shape, dt)]


@rule(COMPARE)
def _compare(xs: Sequence[Var], p: Params) -> list[Aval]:
    _same_dtype(COMPARE, xs)
    return [(broadcast_shapes(xs[0].shape, xs[1].shape), BOOL)]


@rule(SELECT)
def _select(xs: Sequence[Var], p: Params) -> list[Aval]:
    pred, a, b = xs
    if pred.dtype is not BOOL:
        raise ShapeError(f"Select predicate must be bool, got {pred.dtype.value}")
    return [(broadcast_shapes(pred.shape, a.shape, b.shape), _same_dtype(SELECT, (a, b)))]


@rule(CONVERT)
def _convert(xs: Sequence[Var], p: Params) -> list[Aval]:
    return [(xs[0].shape, p["dtype"])]


@rule(IOTA)
def _iota(xs: Sequence[Var], p: Params) -> list[Aval]:
    shape, axis = tuple(p["shape"]), p["axis"]
    if not 0 <= axis < len(shape):
        raise ShapeError(f"Iota axis {axis} out of range for shape {shape}")
    return [(shape, p["dtype"])]


@rule(RESHAPE)
def _reshape(xs: Sequence[Var], p: Params) -> list[Aval]:
    shape = tuple(p["shape"])
    if int(np.prod(shape)) != xs[0].size:
        raise ShapeError(f"Reshape {xs[0].shape} -> {shape} changes the element count")
    return [(shape, xs[0].dtype)]


@rule(BROADCAST)
def _broadcast(xs: Sequence[Var], p: Params) -> list[Aval]:
    shape = tuple(p["shape"])
    if broadcast_shapes(xs[0].shape, shape) != shape:
        raise ShapeError(f"Broadcast {xs[0].shape} -> {shape} is not a broadcast")
    return [(shape, xs[0].dtype)]


@rule(TRANSPOSE)
def _transpose(xs: Sequence[Var], p: Params) -> list[Aval]:
    perm = tuple(p["perm"])
    if sorted(perm) != list(range(xs[0].ndim)):
        raise ShapeError(f"Transpose perm {perm} is not a permutation of rank {xs[0].ndim}")
    return [(tuple(xs[0].shape[i] for i in perm), xs[0].dtype)]


@rule(SLICE)
def _slice(xs: Sequence[Var], p: Params) -> list[Aval]:
    start, limit = tuple(p["start"]), tuple(p["limit"])
    x = xs[0]
    if len(start) != x.ndim or len(limit) != x.ndim:
        raise ShapeError(f"Slice bounds {start}..{limit} do not match rank {x.ndim}")
    for s, lim, n in zip(start, limit, x.shape, strict=True):
        if not 0 <= s <= lim <= n:
            raise ShapeError(f"Slice {start}..{limit} out of bounds for {x.shape}")
    return [(tuple(lim - s for s, lim in zip(start, limit, strict=True)), x.dtype)]


@rule(CONCAT)
def _concat(xs: Sequence[Var], p: Params) -> list[Aval]:
    axis = p["axis"]
    if not xs:
        raise ShapeError("Concat needs at least one operand")
    dt = _same_dtype(CONCAT, xs)
    base = list(xs[0].shape)
    if not 0 <= axis < len(base):
        raise ShapeError(f"Concat axis {axis} out of range for rank {len(base)}")
    for x in xs[1:]:
        if x.ndim != len(base) or any(
            a != b for i, (a, b) in enumerate(zip(x.shape, base, strict=True)) if i != axis
        ):
            raise ShapeError(f"Concat shapes {[x.shape for x in xs]} differ off axis {axis}")
    base[axis] = sum(x.shape[axis] for x in xs)
    return [(tuple(base), dt)]


@rule(MATMUL)
def _matmul(xs: Sequence[Var], p: Params) -> list[Aval]:
    a, b = xs
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"MatMul {a.shape} @ {b.shape}: contraction dims differ")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [(batch + (a.shape[-2], b.shape[-1]), _same_dtype(MATMUL, xs))]


@rule(REDUCE)
def _reduce(xs: Sequence[Var], p: Params) -> list[Aval]:
    x, axis = xs[0], p["axis"]
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"Reduce axis {axis} out of range for {x.shape}")
    shape = list(x.shape)
    if p["keepdim"]:
        shape[axis] = 1
    else:
        del shape[axis]
    return [(tuple(shape), x.dtype)]


@rule(DYNAMIC_UPDATE_SLICE)
def _dus(xs: Sequence[Var], p: Params) -> list[Aval]:
    if len(xs) < 2:
        raise ShapeError("DynamicUpdateSlice takes an operand, an update and its starts")
    operand, update, *rest = xs
    if update.ndim != operand.ndim or any(
        u > o for u, o in zip(update.shape, operand.shape, strict=True)
    ):
        raise ShapeError(f"DynamicUpdateSlice update {update.shape} does not fit {operand.shape}")
    starts, gates = rest[: operand.ndim], rest[operand.ndim:]
    if len(starts) != operand.ndim or any(s.shape != () or s.dtype is not I32 for s in starts):
        raise ShapeError("DynamicUpdateSlice needs one scalar i32 start per operand axis")
    # after the starts: index-guard witnesses gating the write (passes.ranges.gate_state)
    if any(w.shape != WITNESS_SHAPE or w.dtype is not I32 for w in gates):
        raise ShapeError("DynamicUpdateSlice gates are IndexGuard witnesses (i32[2])")
    _same_dtype(DYNAMIC_UPDATE_SLICE, (operand, update))
    return [(operand.shape, operand.dtype)]


@rule(SCATTER_UPDATE)
def _scatter_update(xs: Sequence[Var], p: Params) -> list[Aval]:
    """operand [S, *rest], indices [N] i32, updates [N, *rest] -> operand's type."""
    operand, indices, updates = xs
    if operand.ndim < 1 or indices.ndim != 1 or indices.dtype is not I32:
        raise ShapeError(
            f"ScatterUpdate takes operand [S, ...] and indices [N] i32, got {operand.shape} "
            f"and {indices.dtype.value}{list(indices.shape)}"
        )
    if updates.shape != indices.shape + operand.shape[1:]:
        raise ShapeError(
            f"ScatterUpdate updates {updates.shape} != indices {indices.shape} + operand row "
            f"{operand.shape[1:]}"
        )
    _same_dtype(SCATTER_UPDATE, (operand, updates))
    return [(operand.shape, operand.dtype)]


@rule(GATHER)
def _gather(xs: Sequence[Var], p: Params) -> list[Aval]:
    """Rows of a table by index (an embedding lookup): table [V, *rest], indices [*idx] i32
    -> [*idx, *rest]. An index outside [0, V) is clamped to the nearest row (as
    DynamicUpdateSlice clamps its starts): never a read out of bounds. Indices bound from a
    slot with a declared range [0, V - 1] (``Builder.tokens``) are refused at bind instead."""
    table, idx = xs
    if table.ndim < 1 or table.shape[0] < 1:
        raise ShapeError(f"Gather table {table.shape} has no rows to gather")
    if idx.dtype is not I32:
        raise ShapeError(f"Gather indices must be i32, got {idx.dtype.value}")
    return [(idx.shape + table.shape[1:], table.dtype)]


@rule(INDEX_GUARD)
def _index_guard(xs: Sequence[Var], p: Params) -> list[Aval]:
    x = xs[0]
    if x.dtype is not I32:
        raise ShapeError(f"IndexGuard guards i32 indices, got {x.dtype.value}")
    if p["lo"] > p["hi"]:
        raise ShapeError(f"IndexGuard range [{p['lo']}, {p['hi']}] is empty")
    return [(x.shape, I32), (WITNESS_SHAPE, I32)]


@rule(ATTENTION)
def _attention(xs: Sequence[Var], p: Params) -> list[Aval]:
    shape, dt = check_form_operands(p["form"], [x.shape for x in xs], [x.dtype for x in xs])
    return [(shape, dt)]


@rule(TOPK)
def _topk(xs: Sequence[Var], p: Params) -> list[Aval]:
    x, k = xs[0], p["k"]
    if x.ndim < 1 or x.dtype is not F32:
        raise ShapeError(f"TopK ranks an f32 array of rank >= 1, got {x.aval()}")
    if not 1 <= k <= x.shape[-1]:
        raise ShapeError(f"TopK k={k} is not in [1, {x.shape[-1]}] (the last axis)")
    return [((*x.shape[:-1], k), I32)]


@rule(BLOCK_TOPK)
def _block_topk(xs: Sequence[Var], p: Params) -> list[Aval]:
    scores, qpos = xs
    if scores.dtype is not F32 or qpos.dtype is not I32:
        raise ShapeError(f"BlockTopK takes f32 scores and i32 positions, got "
                         f"{scores.dtype.value} and {qpos.dtype.value}")
    return [(check_selection(scores.shape, qpos.shape, p["block_size"], p["top_k"]), I32)]


@rule(SELECTED_ATTENTION)
def _selected_attention(xs: Sequence[Var], p: Params) -> list[Aval]:
    shape, dt = check_selected(p["form"], [x.shape for x in xs], [x.dtype for x in xs])
    return [(shape, dt)]


@rule(LINEAR)
def _linear(xs: Sequence[Var], p: Params) -> list[Aval]:
    return [type_linear(p["form"], xs)]


def type_eqn(prim: Prim, inputs: Sequence[Var], params: Mapping[str, Any]) -> list[Aval]:
    if not isinstance(prim, Prim):
        raise ShapeError(f"{prim!r} is not a primitive (pootvk.ir.prims)")
    p = params if isinstance(params, Params) else Params(params)
    prim.check(len(inputs), p)
    return shape_rules[prim](inputs, p)


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


def new_eqn(prim: Prim, inputs: Sequence[Var], **params: Any) -> Eqn:
    """Type an eqn and make its output Vars."""
    p = Params(params)
    outs = tuple(Var(s, d) for s, d in type_eqn(prim, inputs, p))
    return Eqn(prim, tuple(inputs), outs, p)
