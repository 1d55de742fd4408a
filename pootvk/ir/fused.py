"""Fused elementwise primitives: one eqn computing a small expression DAG of elementwise prims.

The fusion pass (``passes.fuse``) merges an elementwise producer into its single consumer so
the intermediate never makes a round trip through memory. What it builds is data: a
``FusedBody``, a flat SSA list of ``Node``s in which leaves read an operand of the eqn or
hold a literal, and every other node applies an ordinary elementwise ``Prim`` (Add..Min,
Unary, Compare, Select, Convert, Broadcast) with that prim's own params to earlier nodes.
The last node is the result. Each node records its shape and dtype, so the shape rule
re-types the whole body with the prims' own shape rules after every pass, and the oracle
evaluates it with the prims' own numpy rules (bit-identical to the unfused chain).

``FUSED`` is the elementwise eqn (its value has the last node's shape). ``FUSED_REDUCE`` is
``Reduce(op, axis, keepdim)`` applied to its body (a reduction whose input is computed on
load: RMSNorm's ``Sum(x * x)`` reads ``x`` once and never stores ``x * x``). ``FUSED_ROW``
adds an ``epilogue`` body computed per element of each reduced row, reading the row's
reduction through a ``REDUCED`` leaf: all of RMSNorm in one kernel, the sum never stored.

A node's value at an output multi-index is the value at that index with its broadcast axes
dropped (right-aligned, as numpy broadcasts), so a kernel evaluates every node at the output
index and reads each leaf through its own broadcast strides.

Index-moving nodes (``MOVES``: ``Slice``, ``Concat``, ``Transpose``, ``Reshape``; XLA-style
loop fusion) change the index their arguments are read at instead of the value: a ``Slice``
node reads its argument at the index shifted by its static starts, a ``Concat`` node is a
select between its arguments by the index along its axis (each read at that index less the
arguments before it), a ``Transpose`` reads at the permuted index, a ``Reshape`` at the
index of the same row-major element, a ``Gather`` reads its table at the row its index
argument holds (clamped, as Gather clamps). So ``x * cos + concat(slice(x, hi), slice(x, lo)) *
sin`` is one body reading ``x`` once as a leaf, at three indices. Every fused body may
hold them, except above a ``REDUCED`` leaf (``moves_reduced``).

``FUSED_UPDATE`` is ``DynamicUpdateSlice(state, body, *starts, *gates)`` with the update
computed by the body: operands ``(state, *body operands, *starts, *gates)``; the body's
value is written straight into the state at the clamped run-time starts, in place, and
never stored anywhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from ..errors import ShapeError
from .dtypes import BOOL, DType
from .graph import Params, Var
from .prims import (
    BINARY,
    BROADCAST,
    COMPARE,
    CONCAT,
    CONVERT,
    DYNAMIC_UPDATE_SLICE,
    GATHER,
    REDUCE,
    RESHAPE,
    SELECT,
    SLICE,
    TRANSPOSE,
    UNARY,
    Aval,
    Prim,
    ReduceOp,
    rule,
    type_eqn,
)

#: The primitives a fused body may apply: each is elementwise up to broadcasting.
ELEMENTWISE: tuple[Prim, ...] = (*BINARY, UNARY, COMPARE, SELECT, CONVERT, BROADCAST)
#: Index-moving primitives a ``Fused`` body may also hold: each node reads its arguments at
#: an index computed from its own (a shift, or a pick between arguments along an axis).
MOVES: tuple[Prim, ...] = (SLICE, CONCAT, TRANSPOSE, RESHAPE, GATHER)


class Leaf(Enum):
    """A leaf of a fused body: an operand of the eqn (``index``) or a literal (``value``)."""

    OPERAND = "operand"
    LITERAL = "literal"
    REDUCED = "reduced"  # a FusedRow epilogue's read of its row's reduction


@dataclass(frozen=True)
class Node:
    """One value of a fused body: ``op`` applied to earlier nodes ``args`` with ``params``.

    A literal's params hold its value and ``repr`` (so -0.0 and 0.0 are different nodes:
    the body is a cache key and a CSE key, and equal floats are not equal literals)."""

    op: Prim | Leaf
    args: tuple[int, ...]
    params: Params
    shape: tuple[int, ...]
    dtype: DType

    @staticmethod
    def operand(index: int, shape: tuple[int, ...], dtype: DType) -> Node:
        return Node(Leaf.OPERAND, (), Params(index=index), tuple(shape), dtype)

    @staticmethod
    def reduced(shape: tuple[int, ...], dtype: DType) -> Node:
        return Node(Leaf.REDUCED, (), Params(), tuple(shape), dtype)

    @staticmethod
    def literal(value: float | int | bool, dtype: DType) -> Node:
        return Node(Leaf.LITERAL, (), Params(value=value, text=repr(value)), (), dtype)


@dataclass(frozen=True)
class FusedBody:
    """A flat SSA expression: nodes in order, each reading only earlier ones; the last is the
    result. Hashable: it is an eqn param, part of a kernel request and of CSE keys."""

    nodes: tuple[Node, ...]

    @property
    def out(self) -> Node:
        return self.nodes[-1]

    @property
    def n_operands(self) -> int:
        return sum(1 for n in self.nodes if n.op is Leaf.OPERAND)

    @property
    def moves(self) -> bool:
        """Whether some node reads its arguments at a moved index (``MOVES``)."""
        return any(n.op in MOVES for n in self.nodes)

    def __str__(self) -> str:
        """The result as one nested expression: ``Mul(x0, Unary[Silu](x1))``."""
        text: list[str] = []
        for n in self.nodes:
            if n.op is Leaf.OPERAND:
                text.append(f"x{n.params['index']}")
            elif n.op is Leaf.LITERAL:
                text.append(n.params["text"])
            elif n.op is Leaf.REDUCED:
                text.append("r")
            else:
                ps = ",".join(
                    str(v.value) if isinstance(v, Enum) else str(v) for v in n.params.values()
                )
                args = ", ".join(text[a] for a in n.args)
                text.append(f"{n.op}{'[' + ps + ']' if ps else ''}({args})")
        return text[-1]

    __repr__ = __str__


FUSED = Prim("Fused", None, fused=True, body=FusedBody)
FUSED_REDUCE = Prim(
    "FusedReduce", None, fused=True, body=FusedBody, op=ReduceOp, axis=int, keepdim=bool
)
FUSED_ROW = Prim(
    "FusedRow", None, fused=True, body=FusedBody, op=ReduceOp, axis=int, epilogue=FusedBody
)
FUSED_UPDATE = Prim("FusedUpdate", None, fused=True, body=FusedBody)
#: eqns that write their output in place over operand 0 with gate operands after their
#: starts: a state write (``passes.ranges.gate_state_writes``, the planner's checks)
STATE_WRITES: tuple[Prim, ...] = (DYNAMIC_UPDATE_SLICE, FUSED_UPDATE)


def update_parts(
    prim: Prim, inputs: Sequence[Var], params: Params
) -> tuple[Var, tuple[Var, ...], tuple[Var, ...], tuple[Var, ...]]:
    """A ``STATE_WRITES`` eqn's operands as (operand, update operands, starts, gates): a
    DynamicUpdateSlice's update operand is its one update; a FusedUpdate's are its body's."""
    n = params["body"].n_operands if prim is FUSED_UPDATE else 1
    r = inputs[0].ndim
    return (inputs[0], tuple(inputs[1:1 + n]), tuple(inputs[1 + n:1 + n + r]),
            tuple(inputs[1 + n + r:]))


def _type_nodes(
    body: FusedBody, operands: Sequence[Var], reduced: Aval | None = None, moves: bool = False
) -> tuple[Aval, set[int]]:
    """Re-type every node with its prim's own shape rule: the result's (shape, dtype) and
    the operands the leaves read. A leaf's type must be its operand's; no two leaves of one
    body read the same operand; a ``REDUCED`` leaf (only where ``reduced`` is given) has the
    reduction's type; ``MOVES`` nodes only where ``moves``."""
    if not body.nodes:
        raise ShapeError("a fused body has no nodes")
    read: set[int] = set()
    stand_ins: list[Var] = []
    for k, n in enumerate(body.nodes):
        if any(not 0 <= a < k for a in n.args):
            raise ShapeError(f"fused node {k} reads a node that is not before it: {n.args}")
        if n.op is Leaf.OPERAND:
            j = n.params["index"]
            if not 0 <= j < len(operands) or j in read:
                raise ShapeError(f"fused leaf {k} reads operand {j} of {len(operands)} "
                                 f"(a second time: {j in read})")
            x = operands[j]
            if (x.shape, x.dtype) != (n.shape, n.dtype):
                raise ShapeError(f"fused leaf {k}: operand is {x.aval()}, leaf says "
                                 f"{n.dtype.value}{list(n.shape)}")
            read.add(j)
        elif n.op is Leaf.LITERAL:
            if n.shape != () or (n.dtype is BOOL) != isinstance(n.params["value"], bool):
                raise ShapeError(f"fused literal {k} is not a {n.dtype.value} scalar")
        elif n.op is Leaf.REDUCED:
            if reduced is None or (n.shape, n.dtype) != reduced:
                raise ShapeError(f"fused leaf {k} reads a reduction {(n.shape, n.dtype)}; "
                                 f"the eqn's is {reduced}")
        else:
            if n.op not in ELEMENTWISE and (n.op not in MOVES or not moves):
                raise ShapeError(f"{n.op} is not elementwise: it cannot be in this fused body")
            avals = type_eqn(n.op, [stand_ins[a] for a in n.args], n.params)
            if avals != [(n.shape, n.dtype)]:
                raise ShapeError(f"fused node {k} ({n.op}) types as {avals}, recorded as "
                                 f"{(n.shape, n.dtype)}")
        stand_ins.append(Var(n.shape, n.dtype))
    return (body.out.shape, body.out.dtype), read


def type_reading(
    body: FusedBody, operands: Sequence[Var], reduced: Aval | None
) -> tuple[Aval, set[int]]:
    """The (shape, dtype) of a body whose leaves read operands (each at most once) and, where
    ``reduced`` is given, a ``REDUCED`` value of that type; and the operands it reads (a
    ``Linear`` epilogue: ``REDUCED`` is the matmul's value)."""
    return _type_nodes(body, operands, reduced)


def type_body(body: FusedBody, operands: Sequence[Var], moves: bool = False) -> Aval:
    """The (shape, dtype) of a body whose leaves read every operand, each once, in order
    (leaf ``j`` reads operand ``j``: the form ``passes.fuse`` builds); ``MOVES`` nodes are
    admitted only where ``moves`` (the fused primitives' rules all admit them)."""
    aval, _ = _type_nodes(body, operands, moves=moves)
    leaves = [n.params["index"] for n in body.nodes if n.op is Leaf.OPERAND]
    if leaves != list(range(len(operands))):
        raise ShapeError(f"fused leaves read operands {leaves}; the eqn has {len(operands)}, "
                         "each read once, in order")
    return aval


@rule(FUSED)
def _fused(xs: Sequence[Var], p: Params) -> list[Aval]:
    return [type_body(p["body"], xs, moves=True)]


@rule(FUSED_UPDATE)
def _fused_update(xs: Sequence[Var], p: Params) -> list[Aval]:
    """DynamicUpdateSlice's rule over (state, the body's value, starts, gates)."""
    if not xs or len(xs) < 1 + p["body"].n_operands:
        raise ShapeError(f"FusedUpdate has {len(xs)} operands; its body reads "
                         f"{p['body'].n_operands} besides the state")
    operand, ops, starts, gates = update_parts(FUSED_UPDATE, xs, p)
    update = Var(*type_body(p["body"], ops, moves=True))
    return type_eqn(DYNAMIC_UPDATE_SLICE, [operand, update, *starts, *gates], Params())


def moves_reduced(body: FusedBody) -> bool:
    """Whether a move node reads the ``REDUCED`` leaf (through any node): an epilogue's
    kernel holds its own row's reduction only, never another index's."""
    dep: list[bool] = []
    for n in body.nodes:
        d = n.op is Leaf.REDUCED or any(dep[a] for a in n.args)
        if n.op in MOVES and d:
            return True
        dep.append(d)
    return False


@rule(FUSED_REDUCE)
def _fused_reduce(xs: Sequence[Var], p: Params) -> list[Aval]:
    shape, dt = type_body(p["body"], xs, moves=True)
    if dt is BOOL:
        raise ShapeError("FusedReduce of a bool body (Reduce is for numbers)")
    rp = {k: p[k] for k in ("op", "axis", "keepdim")}
    return type_eqn(REDUCE, [Var(shape, dt)], rp)


@rule(FUSED_ROW)
def _fused_row(xs: Sequence[Var], p: Params) -> list[Aval]:
    """The prologue reads the first operands (in order, as a ``FusedReduce`` body); the
    epilogue may read any operand and the row's reduction, and is row-shaped: its value has
    the prologue's shape, so each output element lies in one reduced row."""
    body, epi = p["body"], p["epilogue"]
    row = type_body(body, xs[: body.n_operands], moves=True)
    if row[1] is BOOL:
        raise ShapeError("FusedRow of a bool body (Reduce is for numbers)")
    (red,) = type_eqn(REDUCE, [Var(*row)], {"op": p["op"], "axis": p["axis"], "keepdim": True})
    out, read = _type_nodes(epi, xs, reduced=red, moves=True)
    if moves_reduced(epi):
        raise ShapeError("a FusedRow epilogue moves the index of its row's reduction")
    if read | set(range(body.n_operands)) != set(range(len(xs))):
        raise ShapeError(f"FusedRow operands {sorted(set(range(len(xs))) - read)} are unread")
    if out[0] != row[0]:
        raise ShapeError(f"FusedRow epilogue shape {out[0]} is not the row shape {row[0]}")
    return [out]
