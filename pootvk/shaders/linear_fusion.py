"""GLSL of a Linear's prologue and epilogue (``ir.linear_form``) inside the matmul kernels.

Both are ``ir.fused`` bodies, emitted by ``shaders.fused.body_lines`` (the one body emitter:
the same expressions, 16-bit rounding and broadcasting as a ``Fused`` kernel) into small
GLSL functions of a linear element index, so a kernel calls them where it loads A or stores
y, whatever its vector widths and register names:

- ``a_pro(row, k[, red])``: element ``k`` of row ``row`` of A's logical shape (its axes
  but the last folded into rows, as the GEMVs fold them), from the
  prologue operands ``pa{j}`` read through their broadcast strides; a row prologue's
  ``red`` is the row's reduction, which the GEMV computes first with every lane of the
  workgroup (``a_sq(row, k)``: the reduced body; lanes stride the row, then subgroup shuffles,
  then a shared-memory tree) into a named register per row (``red{i}``);
- ``y_epi(o, acc)``: output element ``o`` from the F32 sum ``acc`` (the body's ``REDUCED``
  leaf) and the epilogue operands ``ye{j}``; its 16-bit result is left for the store to
  round, as a ``Fused`` kernel's is.

Index decoding divides by constants per call; A's elements are each loaded once per
workgroup and the epilogue runs once per output, so this is a few integer ops per element.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir import BF16, F16, DType
from ..ir.fused import FusedBody, Leaf
from ..plan.matmul_schedule import MatMulRequest
from .common import BF16_ROUND, F16_ROUND, strides
from .fused import body_lines, round_to
from .prims import bcast_index

HALF = (F16, BF16)
#: Row elements per lane per step of a row prologue's reduction (all loads issued first)
REDUCE_UNROLL = 8


def _decode(shape: tuple[int, ...], var: str, last: str | None) -> list[str]:
    """``i0..`` of linear index ``var`` in ``shape``; with ``last``, ``var`` indexes the
    rows (all axes but the last) and ``last`` is the last axis's index."""
    if last is not None:
        return [*_decode(shape[:-1], var, None), f"    uint i{len(shape) - 1} = {last};"]
    return [f"    uint i{d} = ({var} / {st}u) % {n}u;"
            for d, (n, st) in enumerate(zip(shape, strides(shape), strict=True))]


def _function(name: str, args: str, body: FusedBody, shape: tuple[int, ...], buf: str,
              index: tuple[str, str | None], reduced: str | None, stored: bool) -> str:
    lines, result, _ = body_lines(
        body, lambda j, leaf: f"{buf}{j}[{bcast_index(leaf.shape, len(shape))}]", reduced,
        stored=stored, read_at=lambda j, leaf, index: f"{buf}{j}[{index}]", rank=len(shape))
    return (f"float {name}({args}) {{\n" + "\n".join(_decode(shape, *index)) + "\n"
            + "\n".join(lines) + f"\n    return {result};\n}}\n")


def needs_round16(r: MatMulRequest) -> bool:
    """Whether a body computes a 16-bit node (its ``f16_round``/``bf16_bits`` helpers)."""
    bodies: list[FusedBody] = []
    if r.prologue is not None:
        bodies += [r.prologue.body] + ([r.prologue.row] if r.prologue.row else [])
    if r.epilogue is not None:
        bodies.append(r.epilogue)
    return any(n.dtype in HALF for b in bodies for n in b.nodes if n.op is not Leaf.OPERAND)


def rounding_helpers(r: MatMulRequest, out_bf16: bool) -> str:
    """The 16-bit rounding functions the bodies and the store call (each defined once)."""
    if needs_round16(r):
        return F16_ROUND + BF16_ROUND
    return BF16_ROUND if out_bf16 else ""


def fusion_functions(r: MatMulRequest, epilogue: bool) -> str:
    """``a_sq``/``a_pro`` of a prologue; ``y_epi`` of the epilogue where ``epilogue`` (the
    launch that stores the final value)."""
    src = ""
    pro = r.prologue
    if pro is not None:
        shape = (pro.row or pro.body).out.shape
        rk = ("row", "k")
        if pro.row is None:
            src += _function("a_pro", "uint row, uint k", pro.body, shape, "pa", rk, None,
                             True)
        else:
            src += _function("a_sq", "uint row, uint k", pro.body, shape, "pa", rk, None,
                             False)
            src += _function("a_pro", "uint row, uint k, float red", pro.row, shape, "pa",
                             rk, "red", True)
    if epilogue and r.epilogue is not None:
        src += _function("y_epi", "uint o, float acc", r.epilogue, r.epilogue.out.shape,
                         "ye", ("o", None), "acc", True)
    return src


def a_element(r: MatMulRequest, k: str, row: int) -> str:
    """A's element ``k`` of row ``row`` of this workgroup's rows (``aoff`` starts them)."""
    assert r.prologue is not None
    at = f"aoff / {r.k}u + {row}u, {k}"
    return f"a_pro({at})" if r.prologue.row is None else f"a_pro({at}, red{row})"


def final_value(r: MatMulRequest, o: str, s: str) -> str:
    """The F32 value stored at output ``o`` for sum ``s``: the epilogue's where there is one
    (the caller rounds it to the output dtype)."""
    return f"y_epi({o}, {s})" if r.epilogue is not None else s


def row_reductions(r: MatMulRequest, emit: Callable[[str], None]) -> int:
    """A row prologue's reductions, one per row of the workgroup (``red{i}``), before the
    main loop: every lane strides the row (``REDUCE_UNROLL`` loads per step, issued before
    they are summed), subgroup shuffles fold a subgroup (its size the
    request's), a shared tree the subgroups. Returns the shared floats used (``s_pro``);
    its last barrier leaves the array free for the kernel's own reduction."""
    pro = r.prologue
    if pro is None or pro.row is None:
        return 0
    wg = r.local_size
    fold = min(r.subgroup_size, wg) if r.subgroup else 1
    parts = wg // fold
    dt: DType = pro.body.out.dtype
    unroll = min(REDUCE_UNROLL, -(-r.k // wg))
    for i in range(r.m):
        emit(f"float red{i};  // row {i}: the prologue's Sum over K")
        emit("{")
        emit("    float s = 0.0;")
        emit(f"    for (uint k = lane; k < {r.k}u; k += {wg * unroll}u) {{")
        for u in range(unroll):  # loads in flight together, not one L2 round trip each
            guard = f"if (k + {u * wg}u < {r.k}u) " if u else ""
            emit(f"        float v{u} = 0.0;")
            emit(f"        {guard}v{u} = a_sq(aoff / {r.k}u + {i}u, k + {u * wg}u);")
        emit(f"        s += {' + '.join(f'v{u}' for u in range(unroll))};")
        emit("    }")
        off = 1
        while off < fold:
            emit(f"    s += subgroupShuffleXor(s, {off}u);")
            off *= 2
        emit(f"    if (lane % {fold}u == 0u) s_pro[lane / {fold}u] = s;")
        emit("    barrier();")
        emit(f"    for (uint h = {parts // 2}u; h > 0u; h >>= 1) {{")
        emit("        if (lane < h) s_pro[lane] += s_pro[lane + h];")
        emit("        barrier();")
        emit("    }")
        red = round_to("s_pro[0]", dt) if dt in HALF else "s_pro[0]"
        emit(f"    red{i} = {red};")
        emit("    barrier();  // every lane has read s_pro[0] before it is written again")
        emit("}")
    return parts
