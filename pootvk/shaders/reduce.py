"""GLSL for the parallel reduction (``plan.requests.ReduceRequest``).

The input is read as [outer, n, inner]; output ``o`` reduces ``x[o / inner, :, o % inner]``.
Invocation ``lane`` of a workgroup works on output ``wg * COLS + lane % COLS`` and takes
every ``LANES``-th element of its row, starting at ``lane / COLS``; consecutive lanes read
consecutive outputs' elements. The lanes of one output then combine: with subgroup
shuffles first (the XOR partners ``COLS, 2 COLS, ...`` inside a subgroup share the output),
then the subgroups' partials through a tree in workgroup memory. The subgroup size is read
at run time (``gl_SubgroupSize``), so one kernel serves any size the driver picks.

Max propagates NaN as numpy does (GLSL's max need not) and starts from -inf; integer Max
starts from the type's smallest value (-2**31, or 0 for U32); integer Sum wraps. Bool
Max and Sum are both "any" (numpy's Bool sum is nonzero exactly then). F16/BF16 elements
are widened to F32 and the result rounded to 16 bits once, when it is stored: a split
reduction's first pass stores F32 partials, its second pass reads F32 and rounds.
"""

from __future__ import annotations

from ..ir import BF16, BOOL, F16, F32, I32, U32, ReduceOp
from ..plan.requests import ReduceRequest
from .common import (
    BF16_ROUND,
    compute_type,
    declare_bindings,
    float_lit,
    from_f32,
    group_id,
    header,
    to_f32,
)
from .table import generators

SUBGROUP_EXT = (
    "#extension GL_KHR_shader_subgroup_basic : require\n"
    "#extension GL_KHR_shader_subgroup_shuffle : require\n"
)


def _combine(r: ReduceRequest) -> tuple[str, str]:
    """(the combine function's body over ``a`` and ``b``, the identity)."""
    if r.dtype is BOOL:
        return "max(a, b)", "0u"
    if r.op is ReduceOp.SUM:
        return "a + b", f"{compute_type(r.dtype)}(0)"
    if r.dtype.is_float:
        return "(isnan(a) || isnan(b)) ? a + b : max(a, b)", float_lit(float("-inf"))
    assert r.dtype in (I32, U32), r.dtype
    return "max(a, b)", "0u" if r.dtype is U32 else "int(0x80000000u)"


#: ``vec`` = 4: the element type x is declared as, and the four values of one load ``w``
VEC4 = {
    F16: ("uvec2", ("unpackHalf2x16(w.x).x", "unpackHalf2x16(w.x).y",
                    "unpackHalf2x16(w.y).x", "unpackHalf2x16(w.y).y")),
    BF16: ("uvec2", ("uintBitsToFloat(w.x << 16)", "uintBitsToFloat(w.x & 0xffff0000u)",
                     "uintBitsToFloat(w.y << 16)", "uintBitsToFloat(w.y & 0xffff0000u)")),
    F32: ("vec4", ("w.x", "w.y", "w.z", "w.w")),
    I32: ("ivec4", ("w.x", "w.y", "w.z", "w.w")),
    U32: ("uvec4", ("w.x", "w.y", "w.z", "w.w")),
    BOOL: ("uvec4", ("w.x", "w.y", "w.z", "w.w")),
}


def _accumulate(r: ReduceRequest) -> str:
    """The lane's loop over its elements of the row (``vec`` at a time)."""
    if r.vec == 1:
        load = "x[base + j * INNER]"
        if r.dtype.is_16bit:
            load = to_f32(load, r.dtype)
        return f"        for (uint j = p; j < N; j += LANES) acc = combine(acc, {load});\n"
    elem, parts = VEC4[r.dtype]
    step = "".join(f"            acc = combine(acc, {v});\n" for v in parts)
    return (
        "        for (uint j = p; j < N / 4u; j += LANES) {  // rows are contiguous\n"
        f"            {elem} w = x[base / 4u + j];\n{step}        }}\n"
    )


@generators.register(ReduceRequest)
def generate_reduce(r: ReduceRequest) -> str:
    t = compute_type(r.dtype)
    body, init = _combine(r)
    store = "s_red[t]"
    if r.stored.is_16bit:
        store = from_f32(store, r.stored)
    if r.subgroup:
        lane = "gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID"
        sub = (
            "    // lanes of one output inside a subgroup: XOR partners COLS, 2 COLS, ...\n"
            "    uint per_sub = clamp(gl_SubgroupSize / COLS, 1u, LANES);\n"
            "    for (uint off = COLS; off < COLS * per_sub; off <<= 1) {\n"
            "        acc = combine(acc, subgroupShuffleXor(acc, off));\n"
            "    }\n"
        )
    else:
        lane, sub = "gl_LocalInvocationID.x", "    uint per_sub = 1u;\n"
    return (
        header(r.local_size, r.dtype.is_16bit or r.stored.is_16bit)
        + (SUBGROUP_EXT if r.subgroup else "")
        + declare_bindings(r.bindings(), {"x": VEC4[r.dtype][0]} if r.vec == 4 else None)
        + (BF16_ROUND if r.stored is BF16 else "")
        + f"const uint COLS = {r.cols}u, LANES = {r.lanes}u, N = {r.n}u, INNER = {r.inner}u;\n"
        + f"shared {t} s_red[{r.local_size}];\n"
        + f"{t} combine({t} a, {t} b) {{ return {body}; }}\n"
        + "void main() {\n"
        + f"    uint wg = {group_id(r.grid[0])};\n"
        + f"    if (wg >= {r.workgroups}u) return;  // uniform over the workgroup\n"
        + f"    uint lane = {lane};\n"
        + "    uint t = lane % COLS, p = lane / COLS;\n"
        + "    uint o = wg * COLS + t;\n"
        + f"    bool live = o < {r.outputs}u;\n"
        + f"    {t} acc = {init};\n"
        + "    if (live) {\n"
        + "        uint base = (o / INNER) * (N * INNER) + o % INNER;\n"
        + _accumulate(r)
        + "    }\n"
        + sub
        + "    // one partial per subgroup (per lane without subgroups), then a tree\n"
        + "    uint parts = LANES / per_sub;\n"
        + "    if (p % per_sub == 0u) s_red[(p / per_sub) * COLS + t] = acc;\n"
        + "    barrier();\n"
        + "    for (uint h = parts >> 1; h > 0u; h >>= 1) {\n"
        + "        if (p < h) s_red[p * COLS + t] = combine(s_red[p * COLS + t], "
        + "s_red[(p + h) * COLS + t]);\n"
        + "        barrier();\n"
        + "    }\n"
        + (
            "    if (p == 0u && live) y[o] = (s_red[t] != 0u) ? 1u : 0u;\n"
            if r.dtype is BOOL else f"    if (p == 0u && live) y[o] = {store};\n"
        )
        + "}\n"
    )

