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
from ..plan.requests import (
    FusedReduceRequest,
    FusedRequest,
    FusedUpdateRequest,
    LiteralOperand,
)
from .common import (
    BF16_ROUND,
    F16_ROUND,
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
        return f"f16_round({expr})"
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
        if n.dtype is BOOL:  # Bool's Max is Or, its Min And (GLSL has no bool max/min)
            return f"({a[0]} {'||' if op is P.MAX else '&&'} {a[1]})"
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
    read_at: Callable[[int, Node, str], str] | None = None, rank: int | None = None,
) -> tuple[list[str], str, list[str]]:
    """One declaration per node (``read(j, leaf)`` is operand ``j``'s stored element at the
    current index; ``reduced`` the register holding the row's reduction) and the result's
    register name. Nodes marked in ``hoist`` are declared in the third list instead (a
    row's epilogue computes them once per row, before its loop). A 16-bit result is left
    for its store to round when ``stored``; a reduction's input is rounded here.

    A body with index-moving nodes (``FusedBody.moves``) is emitted by ``moved_lines``:
    ``read_at(j, leaf, index)`` reads operand ``j`` at a linear index expression (default
    ``x{j}[index]``), ``rank`` is the output index's rank (default the body's)."""
    if body.moves:
        assert hoist is None or not any(hoist), "a moved body is not a row epilogue"
        lines, result = moved_lines(body, read, read_at, rank, reduced, stored)
        return lines, result, []
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


Index = tuple[str, ...]


def _aligned(ctx: Index, shape: tuple[int, ...]) -> Index | None:
    """The index of a right-aligned argument of ``shape`` at its consumer's index ``ctx``
    (a size-1 axis is index 0: broadcast); None when ``shape`` has more axes than ``ctx``
    (a value of higher rank, read through a Reshape that drops axes, is never at the
    output's own index)."""
    off = len(ctx) - len(shape)
    if off < 0:
        return None
    return tuple("0u" if n == 1 else ctx[off + d] for d, n in enumerate(shape))


def moved_lines(
    body: FusedBody, read: Callable[[int, Node], str],
    read_at: Callable[[int, Node, str], str] | None = None, rank: int | None = None,
    reduced: str | None = None, stored: bool = True,
) -> tuple[list[str], str]:
    """A body with index-moving nodes: each node is evaluated at the multi-index it is read
    at (a tuple of index expressions), once per distinct index. The result is at the
    output index ``i0..i{rank-1}``; a Slice node reads its argument at its index plus the
    starts; a Concat node picks between its arguments by its index along the axis, each
    argument read at that index less the extents before it, clamped into the argument
    (the pick discards the others, whose reads must still be in bounds); a Transpose reads
    at the permuted index, a Reshape at the index of the same row-major element, a Gather
    at the row its index argument holds there (clamped). A leaf read at its
    plain broadcast index goes through ``read``, elsewhere through ``read_at``."""
    at = read_at or (lambda j, leaf, index: f"x{j}[{index}]")
    rank = len(body.out.shape) if rank is None else rank
    root: Index = tuple(f"i{d}" for d in range(rank))
    memo: dict[tuple[int, Index], str] = {}
    offsets: dict[tuple[str, str], str] = {}
    lines: list[str] = []
    last = len(body.nodes) - 1

    def declare(k: int, n: Node, expr: str) -> str:
        name = f"t{k}" + (f"_{sum(1 for kk, _ in memo if kk == k)}"
                          if any(kk == k for kk, _ in memo) else "")
        lines.append(f"    {CTYPE[n.dtype]} {name} = {expr};")
        return name

    def reshaped(ctx: Index, shape: tuple[int, ...], src: tuple[int, ...]) -> Index:
        """The index into ``src`` of the element at ``ctx`` of its reshape to ``shape``:
        the same axes where only unit axes come or go, else through the row-major offset
        (declared once as a register)."""
        if [n for n in shape if n != 1] == [n for n in src if n != 1]:
            kept = iter(c for c, n in zip(ctx, shape, strict=True) if n != 1)
            return tuple("0u" if n == 1 else next(kept) for n in src)
        st = strides(shape)
        off = " + ".join(f"{c} * {st[d]}u" for d, c in enumerate(ctx) if c != "0u") or "0u"
        key = ("off", off)
        if key not in offsets:
            offsets[key] = f"o{len(offsets)}"
            lines.append(f"    uint {offsets[key]} = {off};")
        o = offsets[key]
        sst = strides(src)
        return tuple("0u" if n == 1 else f"(({o} / {sst[d]}u) % {n}u)"
                     for d, n in enumerate(src))

    def value(k: int, ctx: Index) -> str:
        n = body.nodes[k]
        aligned = _aligned(ctx, n.shape)
        assert aligned is not None, "a node is evaluated at an index of at least its rank"
        ctx = aligned
        key = (k, ctx) if n.op is not Leaf.LITERAL else (k, ())
        if key in memo:
            return memo[key]
        args = [body.nodes[a] for a in n.args]
        if n.op is Leaf.REDUCED:
            assert reduced is not None
            name = reduced
        elif n.op is Leaf.OPERAND:
            j = n.params["index"]
            if ctx == _aligned(root, n.shape):
                raw = read(j, n)
            else:
                st = strides(n.shape)
                terms = [f"{c} * {st[d]}u" for d, c in enumerate(ctx) if c != "0u"]
                raw = at(j, n, " + ".join(terms) or "0u")
            name = declare(k, n, load(raw, n.dtype))
        elif n.op is Leaf.LITERAL:
            name = declare(k, n, literal_value(n))
        elif n.op is P.BROADCAST:  # a view: its operand at the broadcast index
            name = value(n.args[0], ctx)
        elif n.op is P.SLICE:
            start = n.params["start"]
            name = value(n.args[0], tuple(
                c if s == 0 else f"({c} + {s}u)" for c, s in zip(ctx, start, strict=True)))
        elif n.op is P.TRANSPOSE:  # output axis d is the argument's axis perm[d]
            perm = n.params["perm"]
            moved = ["0u"] * len(perm)
            for d, src in enumerate(perm):
                moved[src] = ctx[d]
            name = value(n.args[0], tuple(moved))
        elif n.op is P.RESHAPE:
            name = value(n.args[0], reshaped(ctx, n.shape, args[0].shape))
        elif n.op is P.GATHER:  # the table's row is the index argument's value, clamped
            table, idx = args
            r = len(idx.shape)
            row = f"uint(clamp({value(n.args[1], ctx[:r])}, 0, {table.shape[0] - 1}))"
            name = value(n.args[0], (row, *ctx[r:]))
        elif n.op is P.CONCAT:
            axis, base, picks = n.params["axis"], 0, []
            for a, arg in zip(n.args, args, strict=True):
                ext = arg.shape[axis]
                i = ctx[axis] if base == 0 else f"({ctx[axis]} - {base}u)"
                moved = ctx[:axis] + (f"min({i}, {ext - 1}u)",) + ctx[axis + 1:]
                picks.append((base + ext, value(a, moved)))
                base += ext
            expr = picks[-1][1]
            for end, v in reversed(picks[:-1]):
                expr = f"({ctx[axis]} < {end}u ? {v} : {expr})"
            name = declare(k, n, expr)
        else:
            names = [value(a, ctx) for a in n.args]
            expr = _node_expr(n, names, [arg.dtype for arg in args])
            if n.dtype in HALF and not (stored and k == last and ctx == _aligned(root, n.shape)):
                expr = round_to(expr, n.dtype)
            name = declare(k, n, expr)
        memo[key] = name
        return name

    result = value(last, root)
    return lines, result


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


def _uses_half(body: FusedBody) -> bool:
    return any(n.dtype in HALF for n in body.nodes)


#: the 16-bit rounding helpers a fused body's nodes call (round_to)
ROUND16 = F16_ROUND + BF16_ROUND


def _fused_main(req: FusedRequest, pre: str = "") -> str:
    """The statements of a Fused launch after ``gid`` (its invocation's output element) is
    known; its bindings named with the prefix ``pre``."""
    rank = len(req.output[0])
    lines, result, _ = body_lines(
        req.body, lambda j, leaf: f"{pre}x{j}[{bcast_index(leaf.shape, rank)}]",
        read_at=lambda j, leaf, index: f"{pre}x{j}[{index}]",
    )
    return (
        f"    if (gid >= {req.threads}u) return;\n"
        + decode_index(req.output[0])
        + "\n"
        + "\n".join(lines)
        + f"\n    {pre}y[gid] = {store(result, req.output[1])};\n"
    )


def _update_main(req: FusedUpdateRequest, pre: str = "") -> str:
    """The statements of a FusedUpdate launch after ``gid`` (its update element) is known:
    the gates (a failed guard writes nothing), the starts clamped so the update fits
    (DynamicUpdateSlice's rule), the body, and its value stored at the element's index plus
    the starts; its bindings named with the prefix ``pre``."""
    ushape, (sshape, sdt) = req.body.out.shape, req.state
    rank = len(ushape)
    lines, result, _ = body_lines(
        req.body, lambda j, leaf: f"{pre}x{j}[{bcast_index(leaf.shape, rank)}]",
        read_at=lambda j, leaf, index: f"{pre}x{j}[{index}]",
    )
    head = [f"    if ({pre}g{k}[0] != 0) return;  // a guard failed: the state is not written"
            for k in range(req.gates)]
    for d, st in enumerate(req.starts):
        s = literal(st.value, st.dtype) if isinstance(st, LiteralOperand) else f"{pre}s{d}[0]"
        head.append(f"    uint s{d}_ = uint(clamp(int({s}), 0, {sshape[d] - ushape[d]}));")
    idx = " + ".join(f"(i{d} + s{d}_) * {st}u" for d, st in enumerate(strides(sshape)))
    return (
        f"    if (gid >= {req.threads}u) return;\n"
        + decode_index(ushape)
        + "\n" + "\n".join(head) + "\n"
        + "\n".join(lines)
        + f"\n    {pre}y[{idx or '0u'}] = {store(result, sdt)};\n"
    )


def fused_main(req: FusedRequest | FusedUpdateRequest, pre: str = "") -> str:
    """A Fused or FusedUpdate launch's statements after ``gid`` is known, its bindings
    prefixed ``pre`` (a group's part: ``plan.group``)."""
    return _fused_main(req, pre) if isinstance(req, FusedRequest) else _update_main(req, pre)


def fused_helpers(req: FusedRequest | FusedUpdateRequest) -> str:
    """The 16-bit rounding helpers a Fused or FusedUpdate launch's code calls."""
    out = req.output[1] if isinstance(req, FusedRequest) else req.state[1]
    return ROUND16 if _uses_half(req.body) or out in HALF else ""


def _single(req: FusedRequest | FusedUpdateRequest) -> str:
    binds = req.bindings()
    return (
        header(req.local_size, any(b.dtype in HALF for b in binds))
        + declare_bindings(binds)
        + fused_helpers(req)
        + "void main() {\n"
        + f"    uint gid = {group_id(req.grid[0])} * {req.local_size}u"
        + " + gl_LocalInvocationID.x;\n"
        + fused_main(req)
        + "}\n"
    )


@generators.register(FusedRequest)
def generate_fused(req: FusedRequest) -> str:
    return _single(req)


@generators.register(FusedUpdateRequest)
def generate_fused_update(req: FusedUpdateRequest) -> str:
    return _single(req)


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
            hoist=None if req.epilogue.moves else row_invariant(req.epilogue, axis, rank),
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
    half = any(b is not None and _uses_half(b) for b in (req.body, req.epilogue))
    return (
        header(lanes, storage16)
        + (SUBGROUP_EXT if req.subgroup else "")
        + declare_bindings(binds)
        + (ROUND16 if half or req.output[1] in HALF else "")
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
