"""GLSL for the fused elementwise primitives: a whole expression DAG per output element.

A body (``ir.fused.FusedBody``) becomes one named scalar per node, ``t0, t1, ...``, in
registers: operand leaves read their buffer through their own broadcast strides at the
output multi-index, every other node applies its primitive's expression from the unfused
generators' tables (``shaders.prims``: ``BINARY_EXPR``, ``UNARY_EXPR``, ``CMP``; the 16-bit
conversions of ``shaders.common``), so a fused kernel computes what the chain of primitive
kernels computes without storing the intermediates. Values compute in F32 (16-bit values
are widened on load and rounded to their type after every node of that type, as a stored
16-bit intermediate would be), I32, U32 or bool; only the result is stored, in its storage
type.

``FusedReduceRequest``: a workgroup per reduced row; each lane evaluates the body at
elements ``lane, lane + LANES, ...`` of the row and folds them into a register, then the
lanes' partials are combined as ``shaders.reduce`` combines them: subgroup shuffles where the
device has them (the subgroup size read at run time), then a shared-memory tree over the
subgroups' partials. With an epilogue (``FusedRow``) the
lanes walk the row again and store the epilogue per element, its row-invariant nodes
computed once before that loop. No private arrays anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..ir import BF16, BOOL, F16, F32, I32, U32, DType, ReduceOp
from ..ir import prims as P
from ..ir.fused import FusedBody, Leaf, Node
from ..plan.requests import FusedReduceRequest, FusedRequest
from .common import (
    BF16_ROUND,
    declare_bindings,
    float_lit,
    from_f32,
    group_id,
    header,
    literal,
    strides,
    to_f32,
)
from .prims import BINARY_EXPR, CMP, MINMAX, UNARY_EXPR, bcast_index, decode_index
from .reduce import SUBGROUP_EXT
from .table import generators

#: The register type a value of each dtype computes in.
CTYPE = {F32: "float", F16: "float", BF16: "float", I32: "int", U32: "uint", BOOL: "bool"}
HALF = (F16, BF16)


def _subst(template: str, **names: str) -> str:
    """``template`` with its placeholder names (``a``, ``b``, ``x``) replaced as words."""
    pattern = r"\b(" + "|".join(names) + r")\b"
    return re.sub(pattern, lambda m: names[m.group(1)], template)


def round_to(expr: str, dt: DType) -> str:
    """An F32 value rounded to the 16-bit type ``dt`` and widened back (what storing it and
    reading it again gives)."""
    if dt is F16:
        return f"unpackHalf2x16(packHalf2x16(vec2({expr}, 0.0))).x"
    return f"uintBitsToFloat(bf16_bits({expr}) << 16)"


def load(raw: str, dt: DType) -> str:
    """A stored element as its register value."""
    if dt in HALF:
        return to_f32(raw, dt)
    if dt is BOOL:
        return f"({raw} != 0u)"
    return raw


def store(value: str, dt: DType) -> str:
    """A register value as the stored element of ``dt``."""
    if dt in HALF:
        return from_f32(value, dt)
    if dt is BOOL:
        return f"({value} ? 1u : 0u)"
    return value


def literal_value(n: Node) -> str:
    """A literal as the oracle binds it (a 16-bit one rounded to its type, then widened)."""
    v, dt = n.params["value"], n.dtype
    if dt is BOOL:
        return "true" if v else "false"
    return literal(v, dt)


def _convert(a: str, src: DType, dst: DType) -> str:
    if dst is BOOL:
        return a if src is BOOL else f"({a} != {CTYPE[src]}(0))"
    if dst.is_float:
        return a if src.is_float else f"float({a})"
    return f"{CTYPE[dst]}({a})"


def _node_expr(n: Node, a: list[str], dts: list[DType]) -> str:
    op = n.op
    if op in BINARY_EXPR:
        return _subst(BINARY_EXPR[op], a=a[0], b=a[1])  # type: ignore[index]
    if op in MINMAX:  # numpy's maximum/minimum propagate NaN; GLSL's max does not
        fn = MINMAX[op]  # type: ignore[index]
        if n.dtype.is_float:
            return f"((isnan({a[0]}) || isnan({a[1]})) ? {a[0]} + {a[1]} : {fn}({a[0]}, {a[1]}))"
        return f"{fn}({a[0]}, {a[1]})"
    if op is P.UNARY:
        return "(" + _subst(UNARY_EXPR[n.params["op"]], x=a[0]) + ")"
    if op is P.COMPARE:
        return f"({a[0]} {CMP[n.params['op']]} {a[1]})"
    if op is P.SELECT:
        return f"({a[0]} ? {a[1]} : {a[2]})"
    if op is P.CONVERT:
        return _convert(a[0], dts[0], n.dtype)
    raise AssertionError(f"{op} has no fused expression")  # type_body admits nothing else


def body_lines(
    body: FusedBody, read: Callable[[int, Node], str], reduced: str | None = None,
    hoist: list[bool] | None = None, stored: bool = True,
) -> tuple[list[str], str, list[str]]:
    """One declaration per node (``read(j, leaf)`` is operand ``j``'s stored element at the
    current index; ``reduced`` the register holding the row's reduction) and the result's
    register name. Nodes marked in ``hoist`` are declared in the third list instead (a
    row's epilogue computes them once per row, before its loop). A 16-bit result is left
    for its store to round when ``stored``; a reduction's input is rounded here."""
    names: list[str] = []
    lines: list[str] = []
    hoisted: list[str] = []
    last = len(body.nodes) - 1
    for k, n in enumerate(body.nodes):
        if n.op is P.BROADCAST:  # a view: the node is its operand at the broadcast index
            names.append(names[n.args[0]])
            continue
        if n.op is Leaf.OPERAND:
            expr = load(read(n.params["index"], n), n.dtype)
        elif n.op is Leaf.REDUCED:
            assert reduced is not None
            names.append(reduced)
            continue
        elif n.op is Leaf.LITERAL:
            expr = literal_value(n)
        else:
            expr = _node_expr(n, [names[j] for j in n.args],
                              [body.nodes[j].dtype for j in n.args])
            if n.dtype in HALF and not (stored and k == last):
                expr = round_to(expr, n.dtype)
        (hoisted if hoist and hoist[k] else lines).append(f"    {CTYPE[n.dtype]} t{k} = {expr};")
        names.append(f"t{k}")
    return lines, names[-1], hoisted


def row_invariant(body: FusedBody, axis: int, rank: int) -> list[bool]:
    """Which nodes do not vary along the reduced ``axis`` (of a rank-``rank`` row): literals,
    the reduction, operands broadcast along it, and everything computed from those only."""
    inv: list[bool] = []
    for n in body.nodes:
        if n.op is Leaf.OPERAND:
            d = axis - (rank - len(n.shape))
            inv.append(d < 0 or n.shape[d] == 1)
        elif n.op in (Leaf.LITERAL, Leaf.REDUCED):
            inv.append(True)
        else:
            inv.append(all(inv[a] for a in n.args))
    return inv


def _uses_bf16(body: FusedBody) -> bool:
    return any(n.dtype is BF16 for n in body.nodes)


@generators.register(FusedRequest)
def generate_fused(req: FusedRequest) -> str:
    rank = len(req.output[0])
    binds = req.bindings()
    lines, result, _ = body_lines(
        req.body, lambda j, leaf: f"x{j}[{bcast_index(leaf.shape, rank)}]"
    )
    storage16 = any(b.dtype in HALF for b in binds)
    return (
        header(req.local_size, storage16)
        + declare_bindings(binds)
        + (BF16_ROUND if _uses_bf16(req.body) else "")
        + "void main() {\n"
        + f"    uint gid = {group_id(req.grid[0])} * {req.local_size}u"
        + " + gl_LocalInvocationID.x;\n"
        + f"    if (gid >= {req.threads}u) return;\n"
        + decode_index(req.output[0])
        + "\n"
        + "\n".join(lines)
        + f"\n    y[gid] = {store(result, req.output[1])};\n}}\n"
    )


def _reduce_parts(op: ReduceOp, dt: DType) -> tuple[str, str]:
    """The identity and ``combine(acc, v)`` (``acc``/``v`` placeholders) of a reduction
    whose values have type ``dt``: Max keeps a NaN, as numpy's max does."""
    if op is ReduceOp.SUM:
        return f"{CTYPE[dt]}(0)", "acc + v"
    if dt.is_float:
        return float_lit(float("-inf")), "(isnan(v) || v > acc) ? v : acc"
    # the smallest value of the type: -2**31 for I32, 0 for U32
    return ("0u" if dt is U32 else "int(-2147483648)"), "max(acc, v)"


@generators.register(FusedReduceRequest)
def generate_fused_reduce(req: FusedReduceRequest) -> str:
    shape = req.body.out.shape
    dt = req.body.out.dtype
    axis, lanes = req.axis, req.lanes
    rank = len(shape)
    kshape = tuple(1 if d == axis else n for d, n in enumerate(shape))
    kst = strides(kshape)
    ident, combine = _reduce_parts(req.op, dt)
    ct = CTYPE[dt]
    row_index = "\n".join(
        f"    uint i{d} = (row / {kst[d]}u) % {kshape[d]}u;" for d in range(rank) if d != axis
    )
    lines, result, _ = body_lines(
        req.body, lambda j, leaf: f"x{j}[{bcast_index(leaf.shape, rank)}]", stored=False
    )
    inner = "\n".join("    " + ln for ln in lines)
    binds = req.bindings()
    storage16 = any(b.dtype in HALF for b in binds)
    if req.epilogue is None:
        finish = f"    if (lane == 0u) y[row] = {store('s_acc[0]', req.output[1])};\n"
    else:  # the row again: the epilogue per element, from the reduction in a register
        red = "s_acc[0]" if dt not in HALF else round_to("s_acc[0]", dt)
        epi, value, once = body_lines(
            req.epilogue, lambda j, leaf: f"x{j}[{bcast_index(leaf.shape, rank)}]", "red",
            hoist=row_invariant(req.epilogue, axis, rank),
        )
        out = " + ".join(f"i{d} * {st}u" for d, st in enumerate(strides(shape))) or "0u"
        finish = (
            f"    {ct} red = {red};\n"
            + "".join(ln + "\n" for ln in once)
            + f"    for (uint i{axis} = lane; i{axis} < {shape[axis]}u; i{axis} += {lanes}u) {{\n"
            + "\n".join("    " + ln for ln in epi)
            + f"\n        y[{out}] = {store(value, req.output[1])};\n    }}\n"
        )
    if req.subgroup:  # as shaders.reduce: shuffles inside a subgroup, its size read at run time
        lane = "gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID"
        sub = (
            f"    uint per_sub = clamp(gl_SubgroupSize, 1u, {lanes}u);\n"
            "    for (uint off = 1u; off < per_sub; off <<= 1) {\n"
            "        acc = combine(acc, subgroupShuffleXor(acc, off));\n"
            "    }\n"
        )
    else:
        lane, sub = "gl_LocalInvocationID.x", "    uint per_sub = 1u;\n"
    bf16 = any(b is not None and _uses_bf16(b) for b in (req.body, req.epilogue))
    return (
        header(lanes, storage16)
        + (SUBGROUP_EXT if req.subgroup else "")
        + declare_bindings(binds)
        + (BF16_ROUND if bf16 or req.output[1] is BF16 else "")
        + f"shared {ct} s_acc[{lanes}];\n"
        + f"{ct} combine({ct} acc, {ct} v) {{ return {combine}; }}\n"
        + "void main() {\n"
        + f"    uint row = {group_id(req.grid[0])};\n"
        + f"    if (row >= {req.rows}u) return;  // uniform: the whole workgroup leaves\n"
        + f"    uint lane = {lane};\n"
        + row_index
        + f"\n    {ct} acc = {ident};\n"
        + f"    for (uint i{axis} = lane; i{axis} < {shape[axis]}u; i{axis} += {lanes}u) {{\n"
        + inner
        + f"\n        acc = combine(acc, {result});\n    }}\n"
        + sub
        + "    // one partial per subgroup (per lane without subgroups), then a tree\n"
        + "    if (lane % per_sub == 0u) s_acc[lane / per_sub] = acc;\n"
        + "    barrier();\n"
        + f"    for (uint h = {lanes}u / per_sub >> 1; h > 0u; h >>= 1) {{\n"
        + "        if (lane < h) s_acc[lane] = combine(s_acc[lane], s_acc[lane + h]);\n"
        + "        barrier();\n"
        + "    }\n"
        + finish
        + "}\n"
    )
