"""GLSL for the matmul schedules (``pootvk.plan.matmul_schedule``): GEMV_N, GEMV_T, GEMM.

Every index is resolved here in Python: register state is named scalars (``acc{row}_{col}``)
or named vec4s (``c{i}`` of the GEMM's 4x4 block), the unrolled loads are named words
(``w{u}_{j}``), and runtime-indexed state (partial sums, tiles) lives in ``shared`` arrays.
No private array exists (DESIGN.md).

B is read in its stored dtype: 16-byte words (``vec4`` of F32, ``uvec4`` of 8 halves) where
``vec`` allows it, narrower words otherwise, ``uint16_t`` singles through
GL_EXT_shader_16bit_storage. F16 words unpack with ``unpackHalf2x16``, BF16 by shifting each
half into a float's top bits; all arithmetic is F32. A is F32, read as the vectors that
match B's words; the output is F32.

The GEMV reductions fold the per-lane partial sums over the lanes that split the
contraction: ``subgroupShuffleXor`` over the lane bits that lie inside one subgroup (the
lane index is ``gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID``), then the
remaining partials through workgroup memory in rounds of at most ``RED_FLOATS`` floats.

A Linear's prologue and epilogue (``shaders.linear_fusion``) replace A's loads by calls
computing each element and wrap the value stored; a row prologue's reductions run first in
the GEMVs, GEMV_T issuing its first step's B loads before them so the weight's DRAM latency
overlaps the reduction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..ir import BF16, F16, F32, DType
from ..ir import prims as P
from ..plan.bindings import Access
from ..plan.matmul_schedule import (
    COMBINE_LOCAL,
    GEMM_PAD,
    RED_FLOATS,
    MatMulCombineRequest,
    MatMulKind,
    MatMulRequest,
)
from .common import glsl_type, group_id
from .linear_fusion import (
    a_element,
    final_value,
    fusion_functions,
    rounding_helpers,
    row_reductions,
)
from .table import generators

Emit = Callable[..., None]

#: Primitives whose kernels come from this generator (``MatMulRequest``), not from a
#: per-element body in ``shaders.prims.glsl_rules``.
KERNEL_PRIMS = (P.MATMUL,)


def _b_type(r: MatMulRequest) -> str:
    if r.b_dtype is F32:
        return {4: "vec4", 2: "vec2", 1: "float"}[r.vec]
    return {8: "uvec4", 4: "uvec2", 2: "uint", 1: "uint16_t"}[r.vec]


def _local(bt: str) -> str:
    """The register type of a loaded B word (a 16-bit single widens to a uint: 16-bit
    storage allows 16-bit types only in buffers)."""
    return "uint" if bt == "uint16_t" else bt


def _load(bt: str, x: str) -> str:
    return f"uint({x})" if bt == "uint16_t" else x


def _to_f32(x: str, dt: DType) -> str:
    """A stored value of ``dt`` (a uint16_t expression when 16-bit) as F32."""
    if dt is F32:
        return x
    if dt is F16:
        return f"unpackHalf2x16(uint({x})).x"
    return f"uintBitsToFloat(uint({x}) << 16)"


def _store(r: MatMulRequest, s: str) -> str:
    """An F32 result as ``out_dtype`` stores it (round to nearest even; NaN stays NaN); a
    split launch stores its F32 partial as is."""
    if r.out_dtype is F32 or r.splits > 1:
        return s
    if r.out_dtype is F16:
        return f"uint16_t(packHalf2x16(vec2({s}, 0.0)) & 0xffffu)"
    return f"uint16_t(bf16_bits({s}))"


def _a_vec(r: MatMulRequest, elem: str, width: int, row: int = 0, k: str = "") -> str:
    """``width`` consecutive A values from element index ``elem`` (a GLSL expression), as a
    float vector: one vector load of F32 A (``elem`` a multiple of ``width``), else
    ``width`` 16-bit loads; with a prologue, its value per element (``k`` along row
    ``row``)."""
    if r.prologue is not None:
        vals = [a_element(r, f"{k} + {t}u", row) for t in range(width)]
        return vals[0] if width == 1 else f"{_ftype(width)}({', '.join(vals)})"
    if r.a_dtype is F32:
        return f"a[({elem}) / {width}u]" if width > 1 else f"a[{elem}]"
    vals = [_to_f32(f"a[{elem} + {t}u]", r.a_dtype) for t in range(width)]
    return vals[0] if width == 1 else f"{_ftype(width)}({', '.join(vals)})"


def _a_width(r: MatMulRequest) -> int:
    """Floats per A vector: as wide as one B word's floats, at most 4."""
    return min(r.vec, 4)


def _ftype(width: int) -> str:
    return {4: "vec4", 2: "vec2", 1: "float"}[width]


def _pieces(r: MatMulRequest, w: str) -> list[str]:
    """Float vectors (width ``_a_width``) of one loaded B word ``w``, in element order."""
    if r.b_dtype is F32:
        return [w]
    f = "unpackHalf2x16" if r.b_dtype is F16 else "bf2"
    if r.vec == 1:
        return [f"{f}({w}).x"]  # a 16-bit single, loaded into a uint
    if r.vec == 2:
        return [f"{f}({w})"]
    comps = "xyzw"[: r.vec // 2]
    return [f"vec4({f}({w}.{comps[i]}), {f}({w}.{comps[i + 1]}))"
            for i in range(0, len(comps), 2)]


def _scalars(name: str, width: int) -> list[str]:
    return [name] if width == 1 else [f"{name}.{c}" for c in "xyzw"[:width]]


def _final(r: MatMulRequest, o: str, s: str) -> str:
    """The value stored at output ``o`` for F32 sum ``s``: the epilogue's, in the launch that
    stores the final value (not a split's partials)."""
    return final_value(r, o, s) if r.splits == 1 else s


def _y_vec4(r: MatMulRequest) -> bool:
    """The GEMM stores F32 results as vec4s (every row starts on a vec4: N % 4 == 0)."""
    return (r.kind is MatMulKind.GEMM and (r.out_dtype is F32 or r.splits > 1)
            and r.n % 4 == 0)


def _head(r: MatMulRequest) -> str:
    ext = []
    if r.subgroup and r.kind is not MatMulKind.GEMM:
        ext += ["#extension GL_KHR_shader_subgroup_basic : require",
                "#extension GL_KHR_shader_subgroup_shuffle : require"]
    if r.a_dtype is not F32:
        a_elem = "uint16_t"
    elif r.kind is MatMulKind.GEMM:
        a_elem = _ftype(r.a_vec)
    else:
        a_elem = _ftype(_a_width(r)) if r.kind is MatMulKind.GEMV_T else "float"
    b_elem = _b_type(r)
    y_elem = "float" if r.out_dtype is F32 or r.splits > 1 else "uint16_t"
    if _y_vec4(r):
        y_elem = "vec4"
    elems = {"a": a_elem, "b": b_elem, "y": y_elem, "part": y_elem}
    decls = []
    for i, bnd in enumerate(r.bindings()):
        elem = elems.get(bnd.name, glsl_type(bnd.dtype))
        name = "y" if bnd.name == "part" else bnd.name
        acc = "readonly" if bnd.access is Access.READ else "writeonly"
        decls.append(f"layout(std430, set = 0, binding = {i}) {acc} buffer B{i} "
                     f"{{ {elem} {name}[]; }};\n")
        if elem == "uint16_t" and "#extension GL_EXT_shader_16bit_storage : require" not in ext:
            ext.insert(0, "#extension GL_EXT_shader_16bit_storage : require")
    src = "#version 450\n" + "".join(e + "\n" for e in ext)
    src += f"layout(local_size_x = {r.local_size}) in;\n// {r.describe()}\n"
    src += "".join(decls)
    if r.b_dtype is BF16:
        src += ("vec2 bf2(uint w) {\n"
                "    return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u));\n"
                "}\n")
    src += rounding_helpers(r, r.out_dtype is BF16 and r.splits == 1)
    return src + fusion_functions(r, epilogue=r.splits == 1)


def _batch_offsets(r: MatMulRequest, emit: Emit) -> None:
    """``bi``, ``tile`` from the workgroup id; ``aoff``/``boff`` (elements), ``yoff``."""
    emit(f"uint wg = {group_id(r.grid[0])};")
    emit(f"if (wg >= {r.workgroups}u) return;  // uniform over the workgroup")
    emit(f"uint tile = wg % {r.tiles}u;")
    emit(f"uint bi = wg / {r.tiles}u;")
    if r.splits > 1:
        emit(f"uint split = bi % {r.splits}u;  // slice of K")
        emit(f"bi /= {r.splits}u;")
    emit("uint aoff = 0u;")
    emit("uint boff = 0u;")
    if r.batch:
        emit("uint rem = bi;")
        for d in reversed(range(len(r.batch))):
            emit(f"uint i{d} = rem % {r.batch[d]}u;")
            emit(f"rem /= {r.batch[d]}u;")
            if r.a_strides[d]:
                emit(f"aoff += i{d} * {r.a_strides[d]}u;")
            if r.b_strides[d]:
                emit(f"boff += i{d} * {r.b_strides[d]}u;")
    if r.splits > 1:  # this split's partials: part[bi, split, m, n]
        emit(f"uint yoff = (bi * {r.splits}u + split) * {r.m * r.n}u;")
    else:
        emit(f"uint yoff = bi * {r.m * r.n}u;")


def _lane(r: MatMulRequest, emit: Emit) -> None:
    if r.subgroup:
        emit("uint lane = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;")
    else:
        emit("uint lane = gl_LocalInvocationID.x;")


def _fold_width(r: MatMulRequest, stride: int, count: int) -> int:
    """Lanes (of ``count``, ``stride`` apart) one subgroup's shuffles can sum."""
    fold = 1
    if r.subgroup:
        while fold < count and stride * fold * 2 <= r.subgroup_size:
            fold *= 2
    return fold


def _fold(
    r: MatMulRequest, emit: Emit, values: list[str], stride: int, count: int, q: str,
    n_slots: int, write: Callable[[str, str], list[str]],
) -> int:
    """Sum each of ``values`` over the ``count`` lanes ``lane + j * stride`` and write it.

    Shuffles take the lane bits that stay inside one subgroup; the lanes then holding a
    partial (``j % fold == 0``) store it at ``q * parts + p`` of the value's block in
    workgroup memory (``q`` < ``n_slots`` names the output group the lane serves); then one
    team of ``tl`` lanes per (value, group) adds the ``parts`` partials (a strided loop, then
    shuffles; one lane without subgroups) and ``write(vi, q)`` stores sum ``s``. When the
    shuffles alone sum all ``count`` lanes, the leaders write directly. Returns the floats of
    workgroup memory it uses.
    """
    fold = _fold_width(r, stride, count)
    off = stride
    for _ in range(fold.bit_length() - 1):
        for v in values:
            emit(f"{v} += subgroupShuffleXor({v}, {off}u);")
        off *= 2
    parts = count // fold
    emit(f"uint j = (lane / {stride}u) % {count}u;  // lane index along the contraction")
    if parts == 1:  # the shuffles summed everything: the leaders write, no workgroup memory
        emit("if (j == 0u) {")
        for i, v in enumerate(values):
            emit(f"    {{ float s = {v};")
            for line in write(f"{i}u", q):
                emit("      " + line)
            emit("    }")
        emit("}")
        return 0
    emit(f"uint p = j / {fold}u;  // partial index after the shuffles")
    per_round = max(1, RED_FLOATS // (n_slots * parts))
    block = n_slots * parts
    # a team of ``tl`` adjacent lanes adds one pair's partials (then shuffles), so a long
    # partial list is not one invocation's serial loop
    tl = 1
    if r.subgroup:
        while tl < parts and tl * 2 <= min(r.subgroup_size, r.local_size):
            tl *= 2
    for r0 in range(0, len(values), per_round):
        chunk = values[r0:r0 + per_round]
        if r0:
            emit("barrier();  // the previous round's reads are done")
        emit(f"if (j % {fold}u == 0u) {{")
        for i, v in enumerate(chunk):
            emit(f"    s_red[{i * block}u + {q} * {parts}u + p] = {v};")
        emit("}")
        emit("barrier();")
        emit(f"for (uint o = lane; o < {len(chunk) * n_slots * tl}u; o += {r.local_size}u) {{")
        emit(f"    uint pair = o / {tl}u;  // (value, output group) pair")
        emit(f"    uint t = o % {tl}u;  // lane of the pair's team")
        emit(f"    uint vl = pair / {n_slots}u;  // value within the round")
        emit(f"    uint vi = vl + {r0}u;")
        emit(f"    uint qq = pair % {n_slots}u;")
        emit("    float s = 0.0;")
        emit(f"    for (uint u = t; u < {parts}u; u += {tl}u) s += s_red[vl * {block}u + "
             f"qq * {parts}u + u];")
        off = 1
        while off < tl:
            emit(f"    s += subgroupShuffleXor(s, {off}u);")
            off *= 2
        emit("    if (t == 0u) {")
        for line in write("vi", "qq"):
            emit("        " + line)
        emit("    }")
        emit("}")
    return min(len(values), per_round) * block


def _gemv_n(r: MatMulRequest) -> str:
    E, NL, KS, U, R = r.vec, r.lanes, r.groups, r.unroll, r.m
    K, N, NW = r.k, r.n, r.n // r.vec
    bt = _b_type(r)
    L: list[str] = []

    def emit(s: str) -> None:
        L.append("    " + s)

    _batch_offsets(r, emit)
    _lane(r, emit)
    pro_floats = row_reductions(r, emit)
    emit(f"uint nl = lane % {NL}u;  // word of n within the tile")
    emit(f"uint ks = lane / {NL}u;  // k group")
    emit(f"uint nw = tile * {NL}u + nl;")
    emit(f"uint bw = boff / {E}u + min(nw, {NW - 1}u);  // a column past n reads a valid one")
    for i in range(R):
        for e in range(E):
            emit(f"float acc{i}_{e} = 0.0;")

    def step(us: range) -> None:
        for u in us:
            emit(f"    {_local(bt)} w{u} = {_load(bt, f'b[bw + (kk + {u * KS}u) * {NW}u]')};")
        for u in us:
            for i in range(R):
                emit(f"    float x{i}_{u} = "
                     f"{_a_vec(r, f'aoff + {i * K}u + kk + {u * KS}u', 1, i, f'kk + {u * KS}u')};")
        for u in us:
            for c, piece in enumerate(_pieces(r, f"w{u}")):
                wd = _a_width(r)
                emit(f"    {_ftype(wd)} f{u}_{c} = {piece};")
            scal = [s for c in range(max(1, E // _a_width(r)))
                    for s in _scalars(f"f{u}_{c}", _a_width(r))]
            for i in range(R):
                for e in range(E):
                    emit(f"    acc{i}_{e} += x{i}_{u} * {scal[e]};")

    if r.splits > 1:  # rows [k0, k1) of K: this split's contiguous slice
        emit(f"uint k0 = split * {r.k_chunk}u;")
        emit(f"uint k1 = min(k0 + {r.k_chunk}u, {K}u);")
        k0, k1 = "k0 + ", "k1"
    else:
        k0, k1 = "", f"{K}u"
    emit(f"uint kk = {k0}ks;")
    emit(f"for (; kk + {(U - 1) * KS}u < {k1}; kk += {U * KS}u) {{")
    step(range(U))
    emit("}")
    emit(f"for (; kk < {k1}; kk += {KS}u) {{")
    step(range(1))
    emit("}")
    values = [f"acc{i}_{e}" for i in range(R) for e in range(E)]

    def write(vi: str, q: str) -> list[str]:
        return [f"uint col = (tile * {NL}u + {q}) * {E}u + {vi} % {E}u;",
                f"uint o = yoff + {vi} / {E}u * {N}u + col;",
                f"if (col < {N}u) y[o] = {_store(r, _final(r, 'o', 's'))};"]

    size = _fold(r, emit, values, stride=NL, count=KS, q="nl", n_slots=NL, write=write)
    return (_head(r) + (f"shared float s_red[{size}];\n" if size else "")
            + (f"shared float s_pro[{pro_floats}];\n" if pro_floats else "")
            + "void main() {\n" + "\n".join(L) + "\n}\n")


def _gemv_t(r: MatMulRequest) -> str:
    E, LPO, G, J, U, R = r.vec, r.lanes, r.groups, r.outs, r.unroll, r.m
    K, N, KW = r.k, r.n, r.k // r.vec
    AW = _a_width(r)
    per = E // AW  # A vectors per B word
    at, bt = _ftype(AW), _b_type(r)
    dot = (lambda x, y: f"dot({x}, {y})") if AW > 1 else (lambda x, y: f"{x} * {y}")
    L: list[str] = []

    def emit(s: str) -> None:
        L.append("    " + s)

    _batch_offsets(r, emit)
    _lane(r, emit)
    emit(f"uint li = lane % {LPO}u;  // lane within its output's group")
    emit(f"uint g = lane / {LPO}u;  // output group")
    emit(f"uint nbase = tile * {G * J}u + g * {J}u;")
    for j in range(J):
        emit(f"uint bw{j} = boff / {E}u + min(nbase + {j}u, {N - 1}u) * {KW}u;")
    for i in range(R):
        for j in range(J):
            emit(f"float acc{i}_{j} = 0.0;")

    def step(us: range, pre: bool = False) -> None:
        for u in us:
            for j in range(J):
                word = f"p{u}_{j}" if pre else _load(bt, f"b[bw{j} + w + {u * LPO}u]")
                emit(f"    {_local(bt)} w{u}_{j} = {word};")
        for u in us:
            for i in range(R):
                for c in range(per):
                    kw = f"(w + {u * LPO}u) * {E}u + {c * AW}u"
                    xv = _a_vec(r, f"aoff + {i * K}u + {kw}", AW, i, kw)
                    emit(f"    {at} x{i}_{u}_{c} = {xv};")
        for u in us:
            for j in range(J):
                for c, piece in enumerate(_pieces(r, f"w{u}_{j}")):
                    emit(f"    {at} f{u}_{j}_{c} = {piece};")
                for i in range(R):
                    terms = " + ".join(dot(f"x{i}_{u}_{c}", f"f{u}_{j}_{c}") for c in range(per))
                    emit(f"    acc{i}_{j} += {terms};")

    emit("uint w = li;")
    prefetch = r.prologue is not None and r.prologue.row is not None and (U - 1) * LPO < KW
    if prefetch:  # the first step's B words in flight while the workgroup reduces A's rows
        emit(f"bool first = w + {(U - 1) * LPO}u < {KW}u;")
        for u in range(U):
            for j in range(J):
                zero = f"{_local(bt)}(0)" if _local(bt) != "float" else "0.0"
                emit(f"{_local(bt)} p{u}_{j} = {zero};")
                emit(f"if (first) p{u}_{j} = {_load(bt, f'b[bw{j} + w + {u * LPO}u]')};")
    pro_floats = row_reductions(r, emit)
    if prefetch:
        emit("if (first) {  // the prefetched step")
        step(range(U), pre=True)
        emit(f"    w += {U * LPO}u;")
        emit("}")
    emit(f"for (; w + {(U - 1) * LPO}u < {KW}u; w += {U * LPO}u) {{")
    step(range(U))
    emit("}")
    emit(f"for (; w < {KW}u; w += {LPO}u) {{")
    step(range(1))
    emit("}")
    values = [f"acc{i}_{j}" for i in range(R) for j in range(J)]

    def write(vi: str, q: str) -> list[str]:
        return [f"uint n = tile * {G * J}u + {q} * {J}u + {vi} % {J}u;",
                f"uint o = yoff + {vi} / {J}u * {N}u + n;",
                f"if (n < {N}u) y[o] = {_store(r, _final(r, 'o', 's'))};"]

    size = _fold(r, emit, values, stride=1, count=LPO, q="g", n_slots=G, write=write)
    return (_head(r) + (f"shared float s_red[{size}];\n" if size else "")
            + (f"shared float s_pro[{pro_floats}];\n" if pro_floats else "")
            + "void main() {\n" + "\n".join(L) + "\n}\n")


def _elements(word: str, w: int, dt: DType) -> list[str]:
    """The ``w`` elements of one loaded word (F32 vector or raw 16-bit words) as floats."""
    if dt is F32:
        return _scalars(word, w)
    if w == 1:
        return [_to_f32(word, dt)]
    f = "unpackHalf2x16" if dt is F16 else "bf2"
    comps = _scalars(word, w // 2)
    return [f"{f}({c}).{h}" for c in comps for h in "xy"]


def _tile_io(
    r: MatMulRequest, name: str, buf: str, *, rows: int, cont: int, w: int, dt: DType,
    row0: str, row_lim: str, cont0: str, cont_lim: str, stride: int, base: str,
    k_major: bool, srow4: int,
) -> tuple[list[str], list[str], list[str]]:
    """One operand tile's move global -> registers -> shared memory.

    The tile is ``rows`` x ``cont`` elements of a row-major global matrix (row stride
    ``stride`` elements, element ``base``), ``cont`` along its contiguous axis, read as
    ``w``-element words (``cont`` and the start a multiple of ``w``). Word ``i`` of the tile
    goes to invocation ``i % local_size``; a word outside ``row_lim``/``cont_lim`` loads
    zeros (its address clamped, so no load leaves the matrix). The shared array is K-major
    with ``srow4`` vec4s per K row: when the contiguous axis is K (``k_major``) the word is
    transposed into ``w`` K rows (scalar stores); otherwise it is one K row's run of N
    (vec4 stores when ``w >= 4``). Returns (declarations, loads, stores); the loads and
    stores take ``k0`` and the shared buffer offset ``{buf}`` (in vec4s) from the caller.
    """
    WG = r.local_size
    per_row = cont // w
    words = rows * per_row
    bt = _ftype(w) if dt is F32 else {8: "uvec4", 4: "uvec2", 2: "uint", 1: "uint16_t"}[w]
    src = f"{name[1]}[{name}_e_ / {w}u]" if w > 1 else f"{name[1]}[{name}_e_]"
    reg = _local(bt)
    zero = f"{reg}(0)" if reg != "float" else "0.0"
    decl, loads, stores = [], [], []
    for t in range(-(-words // WG)):
        v = f"{name}{t}"
        decl.append(f"{reg} {v} = {zero};")
        guard = f"tid < {words - t * WG}u" if (t + 1) * WG > words else ""
        body_l = [
            f"uint {v}_i = tid + {t * WG}u;",
            f"uint {v}_r = {v}_i / {per_row}u;",
            f"uint {v}_c = {v}_i % {per_row}u * {w}u;",
            f"uint {v}_gr = {row0} + {v}_r;",
            f"uint {v}_gc = {cont0} + {v}_c;",
            f"bool {v}_ok = {v}_gr < {row_lim} && {v}_gc < {cont_lim};",
            f"uint {v}_e = {base} + min({v}_gr, {row_lim} - 1u) * {stride}u"
            f" + min({v}_gc, {cont_lim} - {w}u);",
            f"{v} = {v}_ok ? {_load(bt, src.replace(f'{name}_e_', f'{v}_e'))} : {zero};",
        ]
        els = _elements(v, w, dt)
        body_s = [f"uint {v}_i = tid + {t * WG}u;",
                  f"uint {v}_r = {v}_i / {per_row}u;",
                  f"uint {v}_c = {v}_i % {per_row}u * {w}u;"]
        if k_major:  # element j of the word is K row c + j, column r of the tile
            for j, e in enumerate(els):
                body_s.append(f"{buf}s[{buf} + ({v}_c + {j}u) * {srow4}u + {v}_r / 4u]"
                              f"[{v}_r % 4u] = {e};")
        elif w >= 4:  # one K row (r), N run c .. c + w: whole vec4s
            for q in range(w // 4):
                vec = v if dt is F32 else f"vec4({', '.join(els[4 * q:4 * q + 4])})"
                body_s.append(f"{buf}s[{buf} + {v}_r * {srow4}u + {v}_c / 4u + {q}u] = {vec};")
        else:
            for j, e in enumerate(els):
                body_s.append(f"{buf}s[{buf} + {v}_r * {srow4}u + ({v}_c + {j}u) / 4u]"
                              f"[({v}_c + {j}u) % 4u] = {e};")
        for out, body in ((loads, body_l), (stores, body_s)):
            if guard:
                out.append(f"if ({guard}) {{")
                out += ["    " + b for b in body]
                out.append("}")
            else:
                out.append("{")
                out += ["    " + b for b in body]
                out.append("}")
    return decl, loads, stores


def _gemm(r: MatMulRequest) -> str:
    """The SIMT GEMM (see ``pootvk.plan.matmul_schedule``): K-major padded shared tiles,
    double-buffered through registers, a ``thread_m x thread_n`` register block per
    invocation. Invocation (tx, ty) owns the vec4 columns ``tx + j * TX`` and the vec4 rows
    ``ty + i * TY`` of the tile, so a warp's B reads are consecutive vec4s (no bank
    conflicts) and its A reads are broadcasts."""
    BM, BN, BK = r.tile_m, r.tile_n, r.tile_k
    M, K, N = r.m, r.k, r.n
    TM4, TN4 = r.thread_m // 4, r.thread_n // 4
    TX, TY = BN // r.thread_n, BM // r.thread_m
    SA4, SB4 = BM // 4 + GEMM_PAD // 4, BN // 4 + GEMM_PAD // 4  # vec4s per shared K row
    A_BUF, B_BUF = BK * SA4, BK * SB4
    tiles_n = -(-N // BN)
    L: list[str] = []

    def emit(s: str) -> None:
        L.append("    " + s)

    _batch_offsets(r, emit)
    emit("uint tid = gl_LocalInvocationID.x;")
    emit(f"uint tx = tid % {TX}u;")
    emit(f"uint ty = tid / {TX}u;")
    emit(f"uint m0 = tile / {tiles_n}u * {BM}u;")
    emit(f"uint n0 = tile % {tiles_n}u * {BN}u;")
    if r.splits > 1:
        emit(f"uint kbeg = min(split * {r.k_chunk}u, {K}u);")
        emit(f"uint kend = min(kbeg + {r.k_chunk}u, {K}u);")
    else:
        emit("uint kbeg = 0u;")
        emit(f"uint kend = {K}u;")
    emit(f"uint steps = (kend - kbeg + {BK - 1}u) / {BK}u;")
    a_io = _tile_io(r, "la", "A", rows=BM, cont=BK, w=r.a_vec, dt=r.a_dtype, row0="m0",
                    row_lim=f"{M}u", cont0="k0", cont_lim="kend", stride=K, base="aoff",
                    k_major=True, srow4=SA4)
    if r.transpose_b:  # b[n, k]: rows of N, K contiguous
        b_io = _tile_io(r, "lb", "B", rows=BN, cont=BK, w=r.vec, dt=r.b_dtype, row0="n0",
                        row_lim=f"{N}u", cont0="k0", cont_lim="kend", stride=K, base="boff",
                        k_major=True, srow4=SB4)
    else:  # b[k, n]: rows of K, N contiguous
        b_io = _tile_io(r, "lb", "B", rows=BK, cont=BN, w=r.vec, dt=r.b_dtype, row0="k0",
                        row_lim="kend", cont0="n0", cont_lim=f"{N}u", stride=N, base="boff",
                        k_major=False, srow4=SB4)
    for line in a_io[0] + b_io[0]:
        emit(line)
    for i in range(r.thread_m):
        for j in range(TN4):
            emit(f"vec4 c{i}_{j} = vec4(0.0);")
    emit("if (steps > 0u) {  // the first K step, into buffer 0")
    emit("    uint k0 = kbeg;")
    emit("    uint A = 0u;")
    emit("    uint B = 0u;")
    for line in a_io[1] + b_io[1] + a_io[2] + b_io[2]:
        emit("    " + line)
    emit("}")
    emit("barrier();")
    emit("for (uint s = 0u; s < steps; ++s) {")
    emit("    bool more = s + 1u < steps;")
    emit(f"    uint k0 = kbeg + (s + 1u) * {BK}u;")
    emit("    if (more) {  // the next step's loads, in flight during this step's FMAs")
    for line in a_io[1] + b_io[1]:
        emit("        " + line)
    emit("    }")
    emit(f"    uint ca = (s & 1u) * {A_BUF}u + ty;")
    emit(f"    uint cb = (s & 1u) * {B_BUF}u + tx;")
    emit(f"    for (uint kq = 0u; kq < {BK}u; ++kq) {{")
    for i in range(TM4):
        emit(f"        vec4 a{i} = As[ca + kq * {SA4}u + {i * TY}u];")
    for j in range(TN4):
        emit(f"        vec4 b{j} = Bs[cb + kq * {SB4}u + {j * TX}u];")
    for i in range(r.thread_m):
        for j in range(TN4):
            emit(f"        c{i}_{j} += a{i // 4}.{'xyzw'[i % 4]} * b{j};")
    emit("    }")
    emit("    if (more) {  // into the other buffer: its last readers passed the last barrier")
    emit(f"        uint A = ((s + 1u) & 1u) * {A_BUF}u;")
    emit(f"        uint B = ((s + 1u) & 1u) * {B_BUF}u;")
    for line in a_io[2] + b_io[2]:
        emit("        " + line)
    emit("    }")
    emit("    barrier();")
    emit("}")
    for i in range(r.thread_m):
        emit(f"uint row{i} = m0 + ({i // 4 * TY}u + ty) * 4u + {i % 4}u;")
    for j in range(TN4):
        emit(f"uint col{j} = n0 + ({j * TX}u + tx) * 4u;")
    for i in range(r.thread_m):
        emit(f"if (row{i} < {M}u) {{")
        if _y_vec4(r):  # a column vec4 lies wholly inside N or wholly outside
            for j in range(TN4):
                o = f"yoff + row{i} * {N}u + col{j}"
                val = f"c{i}_{j}"
                if r.epilogue is not None and r.splits == 1:
                    val = "vec4(" + ", ".join(final_value(r, f"{o} + {q}u", f"{val}.{c}")
                                              for q, c in enumerate("xyzw")) + ")"
                emit(f"    if (col{j} < {N}u) y[({o}) / 4u] = {val};")
            emit("}")
            continue
        for j in range(TN4):
            for q, c in enumerate("xyzw"):
                o = f"yoff + row{i} * {N}u + col{j} + {q}u"
                emit(f"    if (col{j} + {q}u < {N}u) y[{o}] = "
                     f"{_store(r, _final(r, o, f'c{i}_{j}.{c}'))};")
        emit("}")
    return (_head(r) + f"shared vec4 As[{2 * A_BUF}];\nshared vec4 Bs[{2 * B_BUF}];\n"
            + "void main() {\n" + "\n".join(L) + "\n}\n")


@generators.register(MatMulCombineRequest)
def generate_matmul_combine(c: MatMulCombineRequest) -> str:
    """One invocation per output: the splits' F32 partials summed in split order."""
    r = c.partial
    mn, S = r.m * r.n, r.splits
    y_elem = "float" if r.out_dtype is F32 else "uint16_t"
    src = "#version 450\n"
    if y_elem == "uint16_t":
        src += "#extension GL_EXT_shader_16bit_storage : require\n"
    src += (f"layout(local_size_x = {COMBINE_LOCAL}) in;\n// {c.describe()}\n"
            "layout(std430, set = 0, binding = 0) readonly buffer B0 { float part[]; };\n")
    for i, bnd in enumerate(r.epi_bindings()):
        src += (f"layout(std430, set = 0, binding = {i + 1}) readonly buffer B{i + 1} "
                f"{{ {glsl_type(bnd.dtype)} {bnd.name}[]; }};\n")
    n_out = len(r.epi_bindings()) + 1
    src += (f"layout(std430, set = 0, binding = {n_out}) writeonly buffer B{n_out} "
            f"{{ {y_elem} y[]; }};\n")
    if "uint16_t" not in src and any(b.dtype in (F16, BF16) for b in r.epi_bindings()):
        src = src.replace("#version 450\n",
                          "#version 450\n#extension GL_EXT_shader_16bit_storage : require\n")
    src += rounding_helpers(r, r.out_dtype is BF16)
    src += fusion_functions(replace(r, splits=1), epilogue=True)
    return src + f"""void main() {{
    uint o = {group_id(c.grid[0])} * {COMBINE_LOCAL}u + gl_LocalInvocationID.x;
    if (o >= {c.outputs}u) return;
    uint bi = o / {mn}u;
    uint base = bi * {S * mn}u + o % {mn}u;
    float s = 0.0;
    for (uint sp = 0u; sp < {S}u; ++sp) s += part[base + sp * {mn}u];
    y[o] = {_store(replace(r, splits=1), _final(replace(r, splits=1), "o", "s"))};
}}
"""


@generators.register(MatMulRequest)
def generate_matmul(r: MatMulRequest) -> str:
    if r.kind is MatMulKind.GEMV_N:
        return _gemv_n(r)
    if r.kind is MatMulKind.GEMV_T:
        return _gemv_t(r)
    return _gemm(r)
