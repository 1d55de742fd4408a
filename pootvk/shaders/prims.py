"""GLSL generators for the non-fused primitives, one rule per primitive (``glsl_rules``).

Every kernel here runs one invocation per output element (per update element for
DynamicUpdateSlice), decodes its multi-index from the linear id with compile-time strides,
and reads broadcast operands through stride-0 axes. Literal operands are inlined; every
other operand is a bound buffer, in the order the plan lists them. No private arrays.

F16/BF16 values are stored as 16-bit words and computed in F32: an arithmetic kernel widens
each 16-bit operand when it reads it and rounds its result once when it stores it; pure data
movement copies the words. Reduce and ScatterUpdate, which run a workgroup per output row,
have generators of their own (``shaders.reduce``, ``shaders.scatter``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..errors import UnsupportedPrimitive
from ..ir import BF16, BOOL, CompareOp, DType, Prim, RuleTable, UnaryOp
from ..ir import prims as P
from ..plan.requests import LiteralOperand, PrimRequest, ReduceRequest, ScatterRequest
from .common import (
    BF16_ROUND,
    compute_type,
    declare_bindings,
    from_f32,
    glsl_type,
    group_id,
    header,
    literal,
    storage_bits,
    strides,
    to_f32,
)
from .table import generators

Body = Callable[[PrimRequest, list[str]], str]
glsl_rules: RuleTable[Prim, Body] = RuleTable(
    "glsl", lambda p, why: UnsupportedPrimitive(str(p), why)
)
rule = glsl_rules.register


def _idx(i: int) -> str:
    return f"i{i}"


def decode_index(shape: tuple[int, ...], var: str = "gid") -> str:
    """Declare i0..i{r-1}, the multi-index of ``var`` in a row-major ``shape``."""
    lines = []
    for d, (n, st) in enumerate(zip(shape, strides(shape), strict=True)):
        lines.append(f"    uint {_idx(d)} = ({var} / {st}u) % {n}u;")
    return "\n".join(lines)


def bcast_index(in_shape: tuple[int, ...], out_rank: int) -> str:
    """Linear index of a right-aligned, broadcast input at the output multi-index."""
    st = strides(in_shape)
    off = out_rank - len(in_shape)
    terms = [
        f"{_idx(off + d)} * {s}u" for d, (n, s) in enumerate(zip(in_shape, st, strict=True))
        if n != 1
    ]
    return " + ".join(terms) if terms else "0u"


def _operand(req: PrimRequest, names: list[str], j: int, index: str) -> str:
    """Operand ``j`` at a linear index, as stored (a 16-bit operand is its raw word)."""
    op = req.inputs[j]
    if isinstance(op, LiteralOperand):
        return literal(op.value, op.dtype)
    return f"{names[j]}[{index}]"


def _bcast_operand(req: PrimRequest, names: list[str], j: int) -> str:
    op = req.inputs[j]
    if isinstance(op, LiteralOperand):
        return literal(op.value, op.dtype)
    return f"{names[j]}[{bcast_index(op[0], len(req.output[0]))}]"


def _dtype(req: PrimRequest, j: int) -> DType:
    op = req.inputs[j]
    return op.dtype if isinstance(op, LiteralOperand) else op[1]


def _value(req: PrimRequest, names: list[str], j: int, index: str | None = None) -> str:
    """Operand ``j`` as a value of its compute type (``compute_type``): a 16-bit word is
    widened to F32; ``index`` None reads it broadcast at the output's multi-index."""
    op, dt = req.inputs[j], _dtype(req, j)
    if isinstance(op, LiteralOperand):
        return literal(op.value, dt)  # a 16-bit literal: the F32 of its stored value
    raw = _bcast_operand(req, names, j) if index is None else f"{names[j]}[{index}]"
    return to_f32(raw, dt) if dt.is_16bit else raw


def _store(req: PrimRequest, expr: str, index: str = "gid") -> str:
    """``y[index] = expr``, ``expr`` of the output's compute type (a 16-bit output is
    rounded once, here)."""
    dt = req.output[1]
    return f"    y[{index}] = {from_f32(expr, dt) if dt.is_16bit else expr};"


BINARY_EXPR = {P.ADD: "a + b", P.SUB: "a - b", P.MUL: "a * b", P.DIV: "a / b"}
MINMAX = {P.MAX: "max", P.MIN: "min"}


@rule(*P.BINARY)
def _binary(req: PrimRequest, n: list[str]) -> str:
    dt = req.output[1]
    t = compute_type(dt)
    a, b = _value(req, n, 0), _value(req, n, 1)
    if req.prim in BINARY_EXPR:
        expr = BINARY_EXPR[req.prim]
    elif dt.is_float:  # numpy's maximum/minimum propagate NaN; GLSL's max does not
        expr = f"(isnan(a) || isnan(b)) ? a + b : {MINMAX[req.prim]}(a, b)"
    else:
        expr = f"{MINMAX[req.prim]}(a, b)"
    return f"    {t} a = {a};\n    {t} b = {b};\n" + _store(req, expr)


UNARY_EXPR = {
    UnaryOp.EXP: "exp(x)",
    # tanh saturates to +-1 in f32 past |x| = 9; clamping keeps drivers' exp-based tanh
    # finite, and a NaN stays NaN (clamp of NaN is undefined)
    UnaryOp.TANH: "isnan(x) ? x : tanh(clamp(x, -15.0, 15.0))",
    UnaryOp.NEG: "-x",
    UnaryOp.RSQRT: "inversesqrt(x)",
    UnaryOp.SQRT: "sqrt(x)",
    UnaryOp.LOG: "log(x)",
    UnaryOp.ABS: "abs(x)",
    UnaryOp.RECIP: "1.0 / x",
    UnaryOp.SIGMOID: "1.0 / (1.0 + exp(-x))",
    UnaryOp.SILU: "x / (1.0 + exp(-x))",
    UnaryOp.COS: "cos(x)",
    UnaryOp.SIN: "sin(x)",
}


@rule(P.UNARY)
def _unary(req: PrimRequest, n: list[str]) -> str:
    t = compute_type(req.output[1])
    expr = UNARY_EXPR[req.params["op"]]
    return f"    {t} x = {_value(req, n, 0, 'gid')};\n" + _store(req, expr)


CMP = {
    CompareOp.LT: "<", CompareOp.LE: "<=", CompareOp.GT: ">", CompareOp.GE: ">=",
    CompareOp.EQ: "==", CompareOp.NE: "!=",
}


@rule(P.COMPARE)
def _compare(req: PrimRequest, n: list[str]) -> str:
    a, b = _value(req, n, 0), _value(req, n, 1)
    return f"    y[gid] = ({a} {CMP[req.params['op']]} {b}) ? 1u : 0u;"


@rule(P.SELECT)
def _select(req: PrimRequest, n: list[str]) -> str:
    """Picks stored words: 16-bit ones pass through uint unchanged (nothing is rounded)."""
    p, a, b = (_bcast_operand(req, n, j) for j in range(3))
    if req.output[1].is_16bit:
        a, b = (
            f"{storage_bits(op.value, op.dtype)}u" if isinstance(op, LiteralOperand)
            else f"uint({x})"
            for op, x in ((req.inputs[1], a), (req.inputs[2], b))
        )
        return f"    y[gid] = uint16_t(({p} != 0u) ? {a} : {b});"
    return f"    y[gid] = ({p} != 0u) ? {a} : {b};"


@rule(P.CONVERT)
def _convert(req: PrimRequest, n: list[str]) -> str:
    src, dst = _dtype(req, 0), req.output[1]
    x = _value(req, n, 0, "gid")  # a 16-bit source through F32
    if dst.is_16bit:
        return _store(req, f"float({x})")
    if dst is BOOL:
        return f"    y[gid] = ({x} != {compute_type(src)}(0)) ? 1u : 0u;"
    return f"    y[gid] = {glsl_type(dst)}({x});"


@rule(P.IOTA)
def _iota(req: PrimRequest, n: list[str]) -> str:
    return _store(req, f"{compute_type(req.output[1])}({_idx(req.params['axis'])})")


#: primitives whose kernels have a generator of their own (a workgroup per output row), by
#: the request type their plan rule emits; every other non-fused primitive has a body here
ROW_KERNELS = {P.REDUCE: ReduceRequest, P.SCATTER_UPDATE: ScatterRequest}

#: kernels that round an F32 result to their output's 16 bits (``_store``)
ROUNDS = (*P.BINARY, P.UNARY, P.CONVERT, P.IOTA, P.MATMUL)


@rule(P.RESHAPE, P.COPY)
def _copy(req: PrimRequest, n: list[str]) -> str:
    return f"    y[gid] = {_operand(req, n, 0, 'gid')};"


@rule(P.BROADCAST)
def _broadcast(req: PrimRequest, n: list[str]) -> str:
    return f"    y[gid] = {_bcast_operand(req, n, 0)};"


@rule(P.TRANSPOSE)
def _transpose(req: PrimRequest, n: list[str]) -> str:
    in_shape = req.inputs[0][0]
    st = strides(in_shape)
    perm = req.params["perm"]
    terms = [f"{_idx(d)} * {st[perm[d]]}u" for d in range(len(perm))]
    return f"    y[gid] = {n[0]}[{' + '.join(terms) or '0u'}];"


@rule(P.SLICE)
def _slice(req: PrimRequest, n: list[str]) -> str:
    st = strides(req.inputs[0][0])
    terms = [f"({_idx(d)} + {s}u) * {st[d]}u" for d, s in enumerate(req.params["start"])]
    return f"    y[gid] = {n[0]}[{' + '.join(terms) or '0u'}];"


@rule(P.CONCAT)
def _concat(req: PrimRequest, n: list[str]) -> str:
    axis = req.params["axis"]
    lines, base = [], 0
    for j, (shape, _dt) in enumerate(req.inputs):
        st = strides(shape)
        idx = " + ".join(
            f"({_idx(d)} - {base}u) * {st[d]}u" if d == axis else f"{_idx(d)} * {st[d]}u"
            for d in range(len(shape))
        )
        cond = f"if ({_idx(axis)} < {base + shape[axis]}u)" if j < len(req.inputs) - 1 else ""
        lines.append(f"    {cond} {{ y[gid] = {n[j]}[{idx}]; return; }}")
        base += shape[axis]
    return "\n".join(lines)


@rule(P.INDEX_GUARD)
def _index_guard(req: PrimRequest, n: list[str]) -> str:
    """Clamp into [lo, hi]; an offending element counts itself into w[0] and the first to
    arrive writes its value to w[1] (the replay zeroes w before every submit)."""
    lo, hi = req.params["lo"], req.params["hi"]
    return (f"    int x = {_operand(req, n, 0, 'gid')};\n"
            f"    y[gid] = clamp(x, {lo}, {hi});\n"
            f"    if ((x < {lo} || x > {hi}) && atomicAdd(w[0], 1) == 0) w[1] = x;")


@rule(P.DYNAMIC_UPDATE_SLICE)
def _dus(req: PrimRequest, n: list[str]) -> str:
    """The update written at the clamped starts; gate operands (witnesses of the step's
    index guards, after the starts) skip the write when any guard failed."""
    (oshape, _), (ushape, _) = req.inputs[0], req.inputs[1]
    ost = strides(oshape)
    lines = [f"    if ({n[j]}[0] != 0) return;  // a guard failed: the state is not written"
             for j in range(2 + len(oshape), len(req.inputs))]
    for d in range(len(oshape)):
        s = _operand(req, n, 2 + d, "0")
        lines.append(
            f"    uint s{d} = uint(clamp(int({s}), 0, {oshape[d] - ushape[d]}));"
        )
    idx = " + ".join(f"({_idx(d)} + s{d}) * {ost[d]}u" for d in range(len(oshape)))
    lines.append(f"    y[{idx or '0u'}] = {n[1]}[gid];")
    return "\n".join(lines)


@rule(P.GATHER)
def _gather(req: PrimRequest, n: list[str]) -> str:
    """One invocation per output element: its row is the index word (clamped to the table,
    the oracle's contract), its column the element's place in the row. 16-bit tables copy
    their words as they are."""
    (tshape, _dt) = req.inputs[0]
    row = 1
    for d in tshape[1:]:
        row *= d
    t = _operand(req, n, 1, f"gid / {row}u")
    return (
        f"    uint r = uint(clamp(int({t}), 0, {tshape[0] - 1}));\n"
        f"    y[gid] = {n[0]}[r * {row}u + gid % {row}u];"
    )


def prim_main(req: PrimRequest, pre: str = "") -> str:
    """The statements of a primitive launch after ``gid`` (its invocation's element) is
    known; its bindings named with the prefix ``pre`` (a group's part: ``plan.group``)."""
    binds = req.bindings()
    names = [""] * len(req.inputs)
    for j, b in zip(req.bound_inputs, binds, strict=False):
        names[j] = pre + b.name
    index_shape = req.inputs[1][0] if req.prim is P.DYNAMIC_UPDATE_SLICE else req.output[0]
    body = glsl_rules[req.prim](req, names)
    if pre:  # the rules index their own output bindings (y, a guard's w) by name
        for b in binds:
            if pre + b.name not in names:
                body = re.sub(rf"\b{re.escape(b.name)}\[", f"{pre}{b.name}[", body)
    return (
        f"    if (gid >= {req.threads}u) return;\n"
        + decode_index(index_shape)
        + "\n"
        + body
        + "\n"
    )


def prim_helpers(req: PrimRequest) -> str:
    """The rounding helpers a primitive's code calls."""
    return BF16_ROUND if req.output[1] is BF16 and req.prim in ROUNDS else ""


@generators.register(PrimRequest)
def generate_prim(req: PrimRequest) -> str:
    """GLSL source for a primitive request; its buffer blocks are ``req.bindings()``."""
    binds = req.bindings()
    storage16 = any(b.dtype.is_16bit for b in binds)
    return (
        header(req.local_size, storage16)
        + declare_bindings(binds)
        + prim_helpers(req)
        + "void main() {\n"
        + f"    uint gid = {group_id(req.grid[0])} * {req.local_size}u"
        + " + gl_LocalInvocationID.x;\n"
        + prim_main(req)
        + "}\n"
    )
