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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..ir import BF16, F16, F32, DType
from ..ir import prims as P
from ..plan.matmul_schedule import (
    COMBINE_LOCAL,
    RED_FLOATS,
    TILE_K,
    MatMulCombineRequest,
    MatMulKind,
    MatMulRequest,
)
from .common import group_id
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


BF16_ROUND = """uint bf16_bits(float f) {
    uint b = floatBitsToUint(f);
    if (isnan(f)) return (b >> 16) | 0x40u;  // a quiet NaN stays NaN
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;  // round to nearest even
}
"""


def _a_vec(r: MatMulRequest, elem: str, width: int) -> str:
    """``width`` consecutive A values from element index ``elem`` (a GLSL expression), as a
    float vector: one vector load of F32 A (``elem`` a multiple of ``width``), else
    ``width`` 16-bit loads."""
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


def _head(r: MatMulRequest) -> str:
    ext = []
    if r.subgroup and r.kind is not MatMulKind.GEMM:
        ext += ["#extension GL_KHR_shader_subgroup_basic : require",
                "#extension GL_KHR_shader_subgroup_shuffle : require"]
    if r.a_dtype is not F32:
        a_elem = "uint16_t"
    else:
        a_elem = _ftype(_a_width(r)) if r.kind is MatMulKind.GEMV_T else "float"
    b_elem = _b_type(r) if r.kind is not MatMulKind.GEMM else (
        "float" if r.b_dtype is F32 else "uint16_t")
    y_elem = "float" if r.out_dtype is F32 or r.splits > 1 else "uint16_t"
    if "uint16_t" in (a_elem, b_elem, y_elem):
        ext.insert(0, "#extension GL_EXT_shader_16bit_storage : require")
    blocks = [("a", a_elem, "readonly"), ("b", b_elem, "readonly"), ("y", y_elem, "writeonly")]
    src = "#version 450\n" + "".join(e + "\n" for e in ext)
    src += f"layout(local_size_x = {r.local_size}) in;\n// {r.describe()}\n"
    for i, (name, elem, acc) in enumerate(blocks):
        src += (f"layout(std430, set = 0, binding = {i}) {acc} buffer B{i} "
                f"{{ {elem} {name}[]; }};\n")
    if r.b_dtype is BF16:
        src += ("vec2 bf2(uint w) {\n"
                "    return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u));\n"
                "}\n")
    if r.out_dtype is BF16 and r.splits == 1:
        src += BF16_ROUND
    return src


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
                emit(f"    float x{i}_{u} = {_a_vec(r, f'aoff + {i * K}u + kk + {u * KS}u', 1)};")
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
                f"if (col < {N}u) y[yoff + {vi} / {E}u * {N}u + col] = {_store(r, 's')};"]

    size = _fold(r, emit, values, stride=NL, count=KS, q="nl", n_slots=NL, write=write)
    return (_head(r) + (f"shared float s_red[{size}];\n" if size else "")
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

    def step(us: range) -> None:
        for u in us:
            for j in range(J):
                emit(f"    {_local(bt)} w{u}_{j} = {_load(bt, f'b[bw{j} + w + {u * LPO}u]')};")
        for u in us:
            for i in range(R):
                for c in range(per):
                    elem = f"aoff + {i * K}u + (w + {u * LPO}u) * {E}u + {c * AW}u"
                    emit(f"    {at} x{i}_{u}_{c} = {_a_vec(r, elem, AW)};")
        for u in us:
            for j in range(J):
                for c, piece in enumerate(_pieces(r, f"w{u}_{j}")):
                    emit(f"    {at} f{u}_{j}_{c} = {piece};")
                for i in range(R):
                    terms = " + ".join(dot(f"x{i}_{u}_{c}", f"f{u}_{j}_{c}") for c in range(per))
                    emit(f"    acc{i}_{j} += {terms};")

    emit("uint w = li;")
    emit(f"for (; w + {(U - 1) * LPO}u < {KW}u; w += {U * LPO}u) {{")
    step(range(U))
    emit("}")
    emit(f"for (; w < {KW}u; w += {LPO}u) {{")
    step(range(1))
    emit("}")
    values = [f"acc{i}_{j}" for i in range(R) for j in range(J)]

    def write(vi: str, q: str) -> list[str]:
        return [f"uint n = tile * {G * J}u + {q} * {J}u + {vi} % {J}u;",
                f"if (n < {N}u) y[yoff + {vi} / {J}u * {N}u + n] = {_store(r, 's')};"]

    size = _fold(r, emit, values, stride=1, count=LPO, q="g", n_slots=G, write=write)
    return (_head(r) + (f"shared float s_red[{size}];\n" if size else "")
            + "void main() {\n" + "\n".join(L) + "\n}\n")


def _gemm(r: MatMulRequest) -> str:
    BM, BN, BK = r.tile_m, r.tile_n, TILE_K
    M, K, N = r.m, r.k, r.n
    TX = BN // 4  # invocations along n
    WG = r.local_size
    tiles_n = -(-N // BN)
    if r.b_dtype is F32:
        conv = "b[{}]"
    elif r.b_dtype is F16:
        conv = "unpackHalf2x16(uint(b[{}])).x"
    else:
        conv = "uintBitsToFloat(uint(b[{}]) << 16)"
    L: list[str] = []

    def emit(s: str) -> None:
        L.append("    " + s)

    _batch_offsets(r, emit)
    emit("uint tid = gl_LocalInvocationID.x;")
    emit(f"uint tx = tid % {TX}u;")
    emit(f"uint ty = tid / {TX}u;")
    emit(f"uint m0 = tile / {tiles_n}u * {BM}u;")
    emit(f"uint n0 = tile % {tiles_n}u * {BN}u;")
    for i in range(4):
        emit(f"vec4 c{i} = vec4(0.0);")
    emit(f"for (uint k0 = 0u; k0 < {K}u; k0 += {BK}u) {{")
    # A tile: BM x BK, read along k
    emit(f"    for (uint idx = tid; idx < {BM * BK}u; idx += {WG}u) {{")
    emit(f"        uint mm = idx / {BK}u;")
    emit(f"        uint kq = idx % {BK}u;")
    emit("        uint gm = m0 + mm;")
    emit("        uint gk = k0 + kq;")
    emit(f"        As[kq * {BM}u + mm] = (gm < {M}u && gk < {K}u) ? "
         f"{_a_vec(r, f'aoff + gm * {K}u + gk', 1)} : 0.0;")
    emit("    }")
    # B tile: BK x BN, read along the stored contiguous axis
    emit(f"    for (uint idx = tid; idx < {BK * BN}u; idx += {WG}u) {{")
    if r.transpose_b:
        emit(f"        uint nn = idx / {BK}u;")
        emit(f"        uint kq = idx % {BK}u;")
        src = f"boff + (n0 + nn) * {K}u + k0 + kq"
    else:
        emit(f"        uint kq = idx / {BN}u;")
        emit(f"        uint nn = idx % {BN}u;")
        src = f"boff + (k0 + kq) * {N}u + n0 + nn"
    emit(f"        bool ok = n0 + nn < {N}u && k0 + kq < {K}u;")
    emit(f"        Bs[kq * {BN}u + nn] = ok ? {conv.format(src)} : 0.0;")
    emit("    }")
    emit("    barrier();")
    emit(f"    for (uint kq = 0u; kq < {BK}u; ++kq) {{")
    emit(f"        uint ab = kq * {BM}u + ty * 4u;")
    emit(f"        uint bb = kq * {BN}u + tx * 4u;")
    emit("        vec4 av = vec4(As[ab], As[ab + 1u], As[ab + 2u], As[ab + 3u]);")
    emit("        vec4 bv = vec4(Bs[bb], Bs[bb + 1u], Bs[bb + 2u], Bs[bb + 3u]);")
    for i, c in enumerate("xyzw"):
        emit(f"        c{i} += av.{c} * bv;")
    emit("    }")
    emit("    barrier();")
    emit("}")
    for i in range(4):
        emit(f"uint row{i} = m0 + ty * 4u + {i}u;")
        emit(f"if (row{i} < {M}u) {{")
        for j, c in enumerate("xyzw"):
            emit(f"    uint col{i}{j} = n0 + tx * 4u + {j}u;")
            emit(f"    if (col{i}{j} < {N}u) y[yoff + row{i} * {N}u + col{i}{j}] = "
                 f"{_store(r, f'c{i}.{c}')};")
        emit("}")
    return (_head(r) + f"shared float As[{BK * BM}];\nshared float Bs[{BK * BN}];\n"
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
            "layout(std430, set = 0, binding = 0) readonly buffer B0 { float part[]; };\n"
            f"layout(std430, set = 0, binding = 1) writeonly buffer B1 {{ {y_elem} y[]; }};\n")
    if r.out_dtype is BF16:
        src += BF16_ROUND
    return src + f"""void main() {{
    uint o = {group_id(c.grid[0])} * {COMBINE_LOCAL}u + gl_LocalInvocationID.x;
    if (o >= {c.outputs}u) return;
    uint bi = o / {mn}u;
    uint base = bi * {S * mn}u + o % {mn}u;
    float s = 0.0;
    for (uint sp = 0u; sp < {S}u; ++sp) s += part[base + sp * {mn}u];
    y[o] = {_store(replace(r, splits=1), "s")};
}}
"""


@generators.register(MatMulRequest)
def generate_matmul(r: MatMulRequest) -> str:
    if r.kind is MatMulKind.GEMV_N:
        return _gemv_n(r)
    if r.kind is MatMulKind.GEMV_T:
        return _gemv_t(r)
    return _gemm(r)
