"""GLSL for the tensor-core decode kernel (``DecodeRequest.matrix`` = 16).

Why: with 16-bit K/V the scalar kernel's per-key ALU work (four query rows' dots and P.V per
16-bit word, plus the conversions) bounds it below the memory limit (H200: 56-89% of the read
ceiling); cooperative matrices (``GL_KHR_cooperative_matrix``, the tensor cores) do the dots
and P.V in 16x16x16 blocks.

One workgroup per (batch row, KV head, row block, split), ``NSG`` = local_size / 32
subgroups; a loop step takes ``TILE`` = 16 NSG keys:

1. Subgroup ``s`` forms the scores of keys ``t0 + 16 s ...`` against the block's query rows:
   ``S^T[16 keys, 16 rows] = K[16 keys, Dk] Q^T[Dk, 16 rows]`` (K straight from the buffer,
   the scaled query from workgroup memory as f16, padded to 16 rows with zeros; with
   ``q_split`` as hi + lo parts, two products, so the query keeps F32 accuracy), and stores
   them to workgroup memory.
2. The online softmax, one subgroup per row (row ``r`` belongs to subgroup ``r % NSG``,
   whose lanes all hold its ``m``, ``l``): score transform, mask, keys past the chunk to
   -inf, the step's max and sum by xor shuffles, the weights P as f16 to workgroup memory,
   the row's rescale factor ``exp(m_old - m_new)`` too.
3. Each subgroup owns the 16-column output tiles ``c = s + i NSG`` of all rows as f32
   accumulators in registers: when a row's max moved they make a round trip through
   workgroup memory to be rescaled (the layout of a matrix's elements over the lanes is
   the driver's), then ``O[16 rows, 16] += P[16 rows, 16 keys] V[16 keys, 16]`` per key
   block.

Keys past the chunk: a key block wholly past it is skipped; the block that straddles its
end reads V through a zero-padded copy in workgroup memory (a NaN in a row past the live
length must not reach an output; K rows there only make scores that are replaced by -inf).
Every block read stays inside the capacity (a multiple of 16, see ``_check_matrix``).
With ``prefetch`` the step's V blocks and the next step's K blocks are loaded at the top of
the step, before the two workgroup barriers that would otherwise serialise their latency.

The end matches the scalar kernel: the rows' (m, l) go to workgroup memory, each subgroup
writes its tiles (normalised, or the split's unnormalised partial with (m, l)), and the
fused combine (``attention_decode.emit_fused_combine``) folds the splits.
"""

from __future__ import annotations

from ..plan.decode_schedule import DecodeRequest, check_request
from .attention_decode import NEG_INF, emit_fused_combine
from .common import float_lit, group_id

CM = "coopmat<{t}, gl_ScopeSubgroup, 16, 16, gl_MatrixUse{u}>"
A16 = CM.format(t="float16_t", u="A")
B16 = CM.format(t="float16_t", u="B")
ACC = CM.format(t="float", u="Accumulator")
ROW, COL = "gl_CooperativeMatrixLayoutRowMajor", "gl_CooperativeMatrixLayoutColumnMajor"


def _x4(n: int) -> int:
    """``n`` floats rounded up to whole 16-byte vectors."""
    return -(-n // 4) * 4


def generate_decode_matrix(r: DecodeRequest) -> str:
    check_request(r)
    NSG = r.local_size // 32
    TILE = 16 * NSG
    R, DK, DV, GR = r.rows_per_wg, r.dk, r.dv, r.group_rows
    DS = r.dk_shared
    DKN = DK - DS  # k's own channels
    DKT, DT, NKC = DK // 16, DV // 16, TILE // 16  # key blocks, output tiles, key blocks/step
    TI = -(-DT // NSG)  # output tiles per subgroup (the last ones may be guarded)
    RJ = -(-R // NSG)  # softmax rows per subgroup
    KL = TILE // 32  # scores per lane per softmax row
    split = r.splits > 1
    fused = split and r.fused_combine

    binds = []
    nb = 0

    def buf(name: str, elem: str, access: str) -> None:
        nonlocal nb
        binds.append(f"layout(std430, set = 0, binding = {nb}) {access} buffer B{nb} "
                     f"{{ {elem} {name}[]; }};")
        nb += 1

    buf("q", "float", "readonly")
    buf("k", "f16vec4", "readonly")
    if DS:
        buf("ks", "f16vec4", "readonly")
    buf("v", "f16vec4", "readonly")
    if r.mask is not None:
        buf("mask", "float", "readonly")
    if r.live_len:
        buf("lens", "int", "readonly")
    if fused:
        buf("part", "float", "coherent")
        buf("counter", "uint", "coherent")
    buf("dst", "float", "writeonly")
    assert nb == len(r.bindings())
    pdst = "part" if fused else "dst"

    # Workgroup memory in 8- and 16-byte vectors (what the matrix loads and stores move),
    # each matrix row padded by 16 bytes so the 16 rows of a block do not share banks.
    QS, SS, PS, OS, VS = DK // 4 + 2, 5, TILE // 4 + 2, 5, 6  # row strides in vectors
    shared = [f"shared f16vec4 sQ[{16 * QS}];"]
    if r.q_split:
        shared.append(f"shared f16vec4 sQl[{16 * QS}];")
    shared += [f"shared vec4 sS[{TILE * SS}];", f"shared f16vec4 sP[{16 * PS}];",
               "shared float sAl[16];", "shared float sM[16];", "shared float sL[16];",
               f"shared f16vec4 sV[{NSG * 16 * VS}];",
               "shared uvec4 s_last4;", "#define s_last s_last4.x"]
    if fused:
        shared += [f"shared float s_cw[{_x4(R * r.splits)}];",
                   f"shared float s_cl[{_x4(R * r.splits)}];", f"shared float s_cden[{_x4(R)}];"]
    # Every shared variable is a multiple of 16 bytes long, so wherever the driver places
    # them each starts 16-byte aligned: a matrix load from workgroup memory (ldmatrix on
    # NVIDIA) reads 16-byte rows and silently misreads a row that is not (H200: the fused
    # variant's 4-byte flag and odd-length combine arrays put the zero-padded value block
    # off alignment, and its products came out wrong)

    shared.append("#define sO sS  // a subgroup's accumulator round trips reuse its score rows")
    assert OS == SS  # (scores are consumed before any round trip, the same 16x20 floats)
    L: list[str] = []

    def emit(s: str, ind: int = 1) -> None:
        L.append("    " * ind + s)

    emit("uint LK_CAP = pc.lk;")
    emit(f"uint wg = {group_id(r.grid[0])};")
    emit(f"if (wg >= {r.workgroups}u) return;  // uniform over the workgroup")
    emit(f"uint split = wg % {r.splits}u;")
    emit(f"uint rest = wg / {r.splits}u;")
    emit(f"uint rbase = (rest % {r.row_blocks}u) * {R}u;  // first row of this block")
    emit(f"uint bg = rest / {r.row_blocks}u;  // b * HKV + g")
    emit(f"uint g = bg % {r.hkv}u;")
    emit(f"uint b = bg / {r.hkv}u;")
    emit("uint lane = gl_LocalInvocationIndex;")
    emit("uint sg = gl_SubgroupID;")
    emit("uint ln = gl_SubgroupInvocationID;")
    if r.live_len:
        emit("uint LK = uint(clamp(lens[b], 0, int(LK_CAP)));")
    else:
        emit("uint LK = LK_CAP;")
    if split:
        emit(f"uint per = (LK + {r.splits - 1}u) / {r.splits}u;")
        emit(f"uint chunk = (per + {TILE - 1}u) / {TILE}u * {TILE}u;")
        if r.min_chunk:
            minc = -(-r.min_chunk // TILE) * TILE
            emit(f"chunk = max(chunk, {minc}u);  // a short length runs on fewer splits")
        emit("uint k0 = min(split * chunk, LK);")
        emit("uint k1 = min(k0 + chunk, LK);")
        if fused:
            emit("uint nact = LK == 0u ? 1u : (LK + chunk - 1u) / chunk;  // splits with a key")
            emit("if (split >= nact) return;  // uniform over the workgroup")
    else:
        emit("uint k0 = 0u;")
        emit("uint k1 = LK;")
    emit(f"uint nit = (k1 - k0 + {TILE - 1}u) / {TILE}u;")
    emit("uint kvrow = bg * LK_CAP;  // first key row of this KV head")
    if DS:
        emit("uint ksrow = b * LK_CAP;  // first k_shared row of this batch row")
    emit("uint LAST = LK_CAP - 16u;  // the last key block that starts inside the buffers")
    # the block's query rows, scaled, as f16 (rows past R are zero)
    emit(f"for (uint i = lane; i < {16 * DK // 4}u; i += {r.local_size}u) {{")
    emit(f"uint rr = i / {DK // 4}u;", 2)
    emit(f"uint qb = (bg * {GR}u + rbase + rr) * {DK}u + i % {DK // 4}u * 4u;", 2)
    emit(f"vec4 x = rr < {R}u ? vec4(q[qb], q[qb + 1u], q[qb + 2u], q[qb + 3u]) * SCALE"
         " : vec4(0.0);", 2)
    emit("f16vec4 h = f16vec4(x);", 2)
    emit(f"sQ[rr * {QS}u + i % {DK // 4}u] = h;", 2)
    if r.q_split:
        emit(f"sQl[rr * {QS}u + i % {DK // 4}u] = f16vec4(x - vec4(h));  // what f16 dropped",
             2)
    emit("}")
    emit(f"for (uint i = lane; i < {16 * PS}u; i += {r.local_size}u) "
         "sP[i] = f16vec4(0.0);  // rows past R stay zero")
    # the softmax rows this subgroup owns
    for j in range(RJ):
        emit(f"uint sr{j} = sg + {j * NSG}u;  // a softmax row (valid when < {R})")
        emit(f"float m{j} = NEG_INF;")
        emit(f"float l{j} = 0.0;")
        if r.mask is not None:
            mb, mh, mq = r.mask
            emit(f"uint rg{j} = rbase + sr{j};")
            h = f"(g * {r.n_rep}u + rg{j} / {r.lq}u)"
            qi = f"(rg{j} % {r.lq}u)"
            emit(f"uint mrow{j} = (({'b' if mb > 1 else '0u'} * {mh}u + "
                 f"{h if mh > 1 else '0u'}) * {mq}u + {qi if mq > 1 else '0u'}) * LK_CAP;")
    for i in range(TI):
        emit(f"uint c{i} = min(sg + {i * NSG}u, {DT - 1}u);  // an output tile"
             + ("" if DT % NSG == 0 else f" (owned when sg + {i * NSG} < {DT})"))
        emit(f"{ACC} o{i} = {ACC}(0.0);")
    emit("barrier();")

    def kload(d: int, row: str, name: str, decl: bool, ind: int) -> None:
        """K block d (16 channels) of the 16 keys starting at key row ``row``."""
        if d < DKN // 16:
            src = f"k, (kvrow + {row}) * {DKN // 4}u + {d * 4}u, {DKN // 4}u"
        else:
            src = f"ks, (ksrow + {row}) * {DS // 4}u + {(d - DKN // 16) * 4}u, {DS // 4}u"
        if decl:
            emit(f"{A16} {name};", ind)
        emit(f"coopMatLoad({name}, {src}, {ROW});", ind)

    def vload(kc: int, i: int, name: str, decl: bool, ind: int) -> None:
        if decl:
            emit(f"{B16} {name};", ind)
        emit(f"coopMatLoad({name}, v, (kvrow + min(t0 + {kc * 16}u, LAST)) * {DV // 4}u + "
             f"c{i} * 4u, {DV // 4}u, {ROW});", ind)

    if r.prefetch:
        for d in range(DKT):
            kload(d, "min(k0 + sg * 16u, LAST)", f"kw{d}", True, 1)
    emit("for (uint it = 0u; it < nit; ++it) {")
    emit(f"uint t0 = k0 + it * {TILE}u;  // this step's first key", 2)
    emit("uint kt = t0 + sg * 16u;  // this subgroup's key block", 2)
    if r.prefetch:
        for kc in range(NKC):
            for i in range(TI):
                vload(kc, i, f"vb{kc}_{i}", True, 2)
        for d in range(DKT):
            kload(d, f"min(kt + {TILE}u, LAST)", f"kn{d}", True, 2)
    # 1. scores
    emit("if (kt < k1) {  // uniform over the subgroup", 2)
    emit(f"{ACC} acc = {ACC}(0.0);", 3)
    for d in range(DKT):
        if not r.prefetch:
            kload(d, "kt", f"kw{d}", True, 3)
        emit(f"{{ {B16} qb; coopMatLoad(qb, sQ, {d * 4}u, {QS}u, {COL}); "
             f"acc = coopMatMulAdd(kw{d}, qb, acc); }}", 3)
        if r.q_split:
            emit(f"{{ {B16} qb; coopMatLoad(qb, sQl, {d * 4}u, {QS}u, {COL}); "
                 f"acc = coopMatMulAdd(kw{d}, qb, acc); }}", 3)
    emit(f"coopMatStore(acc, sS, sg * {16 * SS}u, {SS}u, {ROW});  // key-major, rows in vec4s",
         3)
    emit("}", 2)
    emit("barrier();", 2)
    # 2. online softmax, one subgroup per row
    for j in range(RJ):
        emit(f"if (sr{j} < {R}u) {{  // uniform over the subgroup", 2)
        for e in range(KL):
            emit(f"uint tk{e} = t0 + ln + {32 * e}u;", 3)
            emit(f"float s{e} = sS[(ln + {32 * e}u) * {SS}u + sr{j} / 4u][sr{j} % 4u];", 3)
            if r.softcap is not None:
                emit(f"s{e} = SOFTCAP * tanh(clamp(s{e} / SOFTCAP, -15.0, 15.0));", 3)
            if r.mask is not None:
                emit(f"s{e} += mask[mrow{j} + min(tk{e}, LK_CAP - 1u)];", 3)
            emit(f"s{e} = tk{e} < k1 ? s{e} : NEG_INF;", 3)
        mx = "s0"
        for e in range(1, KL):
            mx = f"max({mx}, s{e})"
        emit(f"float mx = {mx};", 3)
        emit("for (uint off = 16u; off >= 1u; off >>= 1u) "
             "mx = max(mx, subgroupShuffleXor(mx, off));", 3)
        emit(f"float mn = max(m{j}, mx);", 3)
        emit(f"float al = (m{j} == NEG_INF) ? 0.0 : exp(m{j} - mn);", 3)
        emit("float sum = 0.0;", 3)
        for e in range(KL):
            emit(f"float p{e} = (s{e} == NEG_INF) ? 0.0 : exp(s{e} - mn);", 3)
            emit(f"sP[sr{j} * {PS}u + (ln + {32 * e}u) / 4u][ln % 4u] = float16_t(p{e});", 3)
            emit(f"sum += p{e};", 3)
        emit("for (uint off = 16u; off >= 1u; off >>= 1u) sum += subgroupShuffleXor(sum, off);",
             3)
        emit(f"l{j} = l{j} * al + sum;", 3)
        emit(f"m{j} = mn;", 3)
        emit(f"if (ln == 0u) sAl[sr{j}] = al;", 3)
        emit("}", 2)
    emit("barrier();", 2)
    # 3. rescale the accumulators of rows whose max moved, then O += P V. Workgroup memory
    # moves between lanes only across workgroup barriers (a cooperative-matrix shader runs
    # under the Vulkan memory model, where a subgroup barrier does not order these private
    # accesses): every subgroup takes every step below, the tiles it does not own included
    # (clamped to the last one, stored and reloaded but never multiplied into).
    emit("bool resc = false;", 2)
    emit(f"for (uint rr = 0u; rr < {R}u; ++rr) resc = resc || sAl[rr] != 1.0;", 2)
    emit("if (resc) {  // uniform over the workgroup", 2)
    for i in range(TI):
        emit(f"coopMatStore(o{i}, sO, sg * {16 * OS}u, {OS}u, {ROW});", 3)
        emit("barrier();", 3)
        emit("for (uint e = ln; e < 64u; e += 32u) "
             f"if (e / 4u < {R}u) sO[sg * {16 * OS}u + e / 4u * {OS}u + e % 4u] *= sAl[e / 4u];",
             3)
        emit("barrier();", 3)
        emit(f"coopMatLoad(o{i}, sO, sg * {16 * OS}u, {OS}u, {ROW});", 3)
        emit("barrier();", 3)
    emit("}", 2)
    emit("uint nkc = (min(k1, t0 + " f"{TILE}u) - t0 + 15u) / 16u;  // key blocks with a key", 2)
    emit(f"uint skc = (k1 < t0 + {TILE}u && ((k1 - t0) & 15u) != 0u) ? nkc - 1u : 99u;"
         "  // the key block straddling k1", 2)
    for kc in range(NKC):
        emit(f"if ({kc}u < nkc) {{  // uniform over the workgroup", 2)
        emit(f"{A16} pa;", 3)
        emit(f"coopMatLoad(pa, sP, {kc * 4}u, {PS}u, {ROW});", 3)
        emit(f"bool st = skc == {kc}u;  // uniform over the workgroup", 3)
        for i in range(TI):
            emit(f"{B16} vs{i};", 3)
        emit("if (st) {  // V rows past k1 read as zero through workgroup memory", 3)
        for i in range(TI):
            emit("barrier();", 4)
            emit("for (uint e = ln; e < 64u; e += 32u) {", 4)
            emit(f"uint t = t0 + {kc * 16}u + e / 4u;", 5)
            emit(f"sV[sg * {16 * VS}u + e / 4u * {VS}u + e % 4u] = t < k1 ? "
                 f"v[(kvrow + t) * {DV // 4}u + c{i} * 4u + e % 4u] : f16vec4(0.0);", 5)
            emit("}", 4)
            emit("barrier();", 4)
            emit(f"coopMatLoad(vs{i}, sV, sg * {16 * VS}u, {VS}u, {ROW});", 4)
        emit("}", 3)
        for i in range(TI):
            guard = "" if DT % NSG == 0 else f"if (sg + {i * NSG}u < {DT}u) "
            emit(f"{guard}{{", 3)
            emit("if (st) {", 4)
            emit(f"o{i} = coopMatMulAdd(pa, vs{i}, o{i});", 5)
            emit("} else {", 4)
            if r.prefetch:
                emit(f"o{i} = coopMatMulAdd(pa, vb{kc}_{i}, o{i});", 5)
            else:
                vload(kc, i, "vb", True, 5)
                emit(f"o{i} = coopMatMulAdd(pa, vb, o{i});", 5)
            emit("}", 4)
            emit("}", 3)
        emit("}", 2)
    if r.prefetch:
        for d in range(DKT):
            emit(f"kw{d} = kn{d};", 2)
    emit("}")

    # the rows' (m, l), then each subgroup's tiles out (every subgroup takes every barrier)
    for j in range(RJ):
        emit(f"if (sr{j} < {R}u && ln == 0u) {{ sM[sr{j}] = m{j}; sL[sr{j}] = l{j}; }}")
    for i in range(TI):
        emit("barrier();")
        emit(f"coopMatStore(o{i}, sO, sg * {16 * OS}u, {OS}u, {ROW});")
        emit("barrier();")
        own = "" if DT % NSG == 0 else f" || sg + {i * NSG}u >= {DT}u"
        emit("for (uint e = ln; e < 64u; e += 32u) {")
        emit("uint rr = e / 4u;", 2)
        emit(f"if (rr >= {R}u{own}) continue;", 2)
        emit(f"uint orow = bg * {GR}u + rbase + rr;", 2)
        emit(f"uint col = c{i} * 16u + e % 4u * 4u;", 2)
        emit(f"vec4 val = sO[sg * {16 * OS}u + rr * {OS}u + e % 4u];", 2)

        def put(buf: str, base: str, scale: str, ind: int) -> None:
            for cc, comp in enumerate("xyzw"):
                emit(f"{buf}[{base} + {cc}u] = val.{comp}{scale};", ind)

        if split:
            if fused:
                emit("if (nact == 1u) {  // the only split with keys: the output itself", 2)
                put("dst", f"orow * {DV}u + col", " / sL[rr]", 3)
                emit("continue;", 3)
                emit("}", 2)
            put(pdst, f"(orow * {r.splits}u + split) * {DV + 2}u + col", "", 2)
        else:
            put("dst", f"orow * {DV}u + col", " / sL[rr]", 2)  # no key seen: 0/0 = NaN
        emit("}")
    if split:
        cond = f"lane < {R}u" + (" && nact != 1u" if fused else "")
        emit(f"if ({cond}) {{")
        emit(f"uint pb = ((bg * {GR}u + rbase + lane) * {r.splits}u + split) * {DV + 2}u;", 2)
        emit(f"{pdst}[pb + {DV}u] = sM[lane];", 2)
        emit(f"{pdst}[pb + {DV + 1}u] = sL[lane];", 2)
        emit("}")
    if fused:
        emit_fused_combine(r, emit, "lane")

    consts = [
        "layout(push_constant) uniform Push { uint lk; } pc;  // keys per K/V head (stride)",
        f"#define SCALE {float_lit(r.scale)}",
        f"#define NEG_INF {NEG_INF}",
    ]
    if r.softcap is not None:
        consts.append(f"#define SOFTCAP {float_lit(r.softcap)}")
    ext = [
        "#extension GL_EXT_control_flow_attributes : require",
        "#extension GL_KHR_shader_subgroup_basic : require",
        "#extension GL_KHR_shader_subgroup_shuffle : require",
        "#extension GL_KHR_memory_scope_semantics : require",
        "#extension GL_KHR_cooperative_matrix : require",
        "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require",
        "#extension GL_EXT_shader_16bit_storage : require",
    ]
    return (
        "#version 450\n" + "\n".join(ext) + "\n"
        + f"layout(local_size_x = {r.local_size}) in;\n"
        + f"// {r.describe().replace(f'Lk={r.lk}', 'Lk=pc.lk')}\n"
        + "\n".join(binds) + "\n" + "\n".join(consts) + "\n" + "\n".join(shared)
        + "\n\nvoid main() {\n" + "\n".join(L) + "\n}\n"
    )
