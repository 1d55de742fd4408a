"""GLSL for the tensor-core decode kernel (``DecodeRequest.matrix`` = 16): cooperative
matrices fed from K/V tiles staged in workgroup memory.

Why tensor cores: with 16-bit K/V the scalar kernel's per-key work (every query row's dot
and P.V per 16-bit word, in F32 FMAs) bounds wide heads (the MLA decode shape does ~128
FLOP per byte: no FP32 kernel passes 11.8% of the H200's read ceiling there).

Why staged: on the H200's driver a cooperative-matrix load straight from a storage buffer
costs about one memory latency and the loads of one step barely overlap
(``bench/coopmat_load_probe.py``: 38-57% of the read ceiling streaming K alone), while
16-byte vector loads overlap freely and a matrix load from workgroup memory is cheap (53-68%
staged). So each step copies a tile of K and V with 16-byte loads into workgroup memory
(the next tile's words are loaded into registers while this one is used: ``prefetch``),
and every matrix operand comes from there. The copy also zero-fills the rows past the
chunk's end, so a NaN past a live length never reaches a product, and no read leaves the
buffers (rows are clamped to the last key), whatever the capacity.

One workgroup per (batch row, KV head, row block, split), ``NSG`` subgroups, ``TILE`` keys
(``NKB`` = TILE / 16 key blocks) per step:

1. Scores ``S^T[16 keys, 16 rows] = K[16 keys, Dk] Q^T[Dk, 16 rows]`` per key block. With
   at least as many blocks as subgroups a subgroup takes whole blocks; with fewer (the MLA
   shape: one block, eight subgroups) the ``G`` = NSG / NKB subgroups of a block each take
   every G-th 16-channel chunk and store a partial that the softmax sums. The query chunks
   a subgroup uses are held in registers (f16, scaled; with ``q_split`` as hi + lo parts).
2. The online softmax: row ``r`` on ``LPR`` = min(32, TILE) lanes of one subgroup (every
   lane of a row holds its m, l), the step's max and sum by xor shuffles, P as f16 to
   workgroup memory, the rescale factor too.
3. Each subgroup owns the 16-column output tiles ``c = s + i NSG`` as f32 accumulators:
   when a row's reference max moved (only past RESCALE_SLACK, rarely) they make a round
   trip through the subgroup's score rows to be rescaled; then ``O += P V`` per key block.

Workgroup memory moves between lanes only across workgroup barriers (the shader runs under
the Vulkan memory model, where subgroup barriers do not order these private accesses), and
every shared variable is a multiple of 16 bytes long (a matrix load misreads rows that are
not 16-byte aligned). The end: (m, l) per row, each subgroup's tiles out (normalised, or
the split's partial), the fused combine of the scalar kernel (``emit_fused_combine``).
"""

from __future__ import annotations

from ..plan.decode_schedule import DecodeRequest, check_request
from .attention_decode import (
    NEG_INF,
    decode_bindings,
    emit_chunk_prologue,
    emit_fused_combine,
    mask_row,
    select_shared,
)
from .common import float_lit

CM = "coopmat<{t}, gl_ScopeSubgroup, 16, 16, gl_MatrixUse{u}>"
A16 = CM.format(t="float16_t", u="A")
B16 = CM.format(t="float16_t", u="B")
ACC = CM.format(t="float", u="Accumulator")
ROW, COL = "gl_CooperativeMatrixLayoutRowMajor", "gl_CooperativeMatrixLayoutColumnMajor"


#: How far (natural log) a row's running max may pass its reference before the reference
#: moves and the accumulators are rescaled: the weights exp(s - m) stay <= e^8 ~ 2981,
#: which f16 holds exactly to its 11 bits (FlashAttention-4's conditional rescaling).
RESCALE_SLACK = 8.0


def x4(n: int) -> int:
    """``n`` floats rounded up to whole 16-byte words: the matrix kernels declare every
    workgroup array so (``staged_shared_bytes``, ``regfed_shared_bytes``)."""
    return -(-n // 4) * 4


def fused_combine_shared(r: DecodeRequest) -> list[str]:
    """The fused combine's per-(row, split) weights and sums and per-row denominators
    (``emit_fused_combine``'s s_cw, s_cl, s_cden) as both matrix kernels declare them."""
    R = r.rows_per_wg
    return [f"shared float s_cw[{x4(R * r.splits)}];", f"shared float s_cl[{x4(R * r.splits)}];",
            f"shared float s_cden[{x4(R)}];"]


def emit_matrix_prologue(r: DecodeRequest, emit) -> None:
    """Both matrix kernels' start: the chunk's bounds (``emit_chunk_prologue``), the
    lane's index in the workgroup (``lane``), its subgroup (``sg``) and place in it
    (``ln``), and the KV head's first key row (``kvrow``)."""
    emit_chunk_prologue(r, emit)
    emit("uint lane = gl_LocalInvocationIndex;")
    emit("uint sg = gl_SubgroupID;")
    emit("uint ln = gl_SubgroupInvocationID;")
    emit("uint kvrow = bg * LK_CAP;  // first key row of this KV head")


def generate_decode_staged(r: DecodeRequest) -> str:
    check_request(r)
    WG = r.local_size
    NSG = WG // 32
    TILE = r.tile
    NKB = TILE // 16
    R, DK, DV, GR = r.rows_per_wg, r.dk, r.dv, r.group_rows
    DS = r.dk_shared
    DKN = DK - DS
    DKT, DT = DK // 16, DV // 16
    RT = -(-R // 16)  # 16-row tiles of the block's query rows
    SR = NSG // RT  # subgroups per row tile (scores)
    G = max(1, SR // NKB)  # subgroups sharing one (row tile, key block): partial scores
    KBS = max(1, NKB // SR)  # key blocks per subgroup
    QD = -(-DKT // G)  # query chunks per subgroup
    NA = min(r.score_accumulators, QD)  # independent score accumulators
    OT = RT * DT  # output tiles (row tile, 16 columns)
    TI = -(-OT // NSG)  # output tiles per subgroup
    LPR = min(32, TILE)  # lanes per softmax row
    RPS = 32 // LPR  # softmax rows per subgroup pass
    KL = TILE // LPR  # scores per lane per row
    RJ = -(-R // (NSG * RPS))  # softmax passes
    KS, VS, SS, PS = DK // 4 + 2, DV // 4 + 2, 5, TILE // 4 + 2  # row strides in vectors
    SLOTS = RT * NKB * G  # (row tile, key block, part) score tiles
    SROWS = 16 * max(SLOTS, NSG)  # 16 x 16 tiles in sS (also one round-trip tile a subgroup)
    split = r.splits > 1
    fused = split and r.fused_combine
    assert not r.q_split or TILE >= 32  # the lo part is staged in sK rows 16..31
    assert NSG % RT == 0 and R <= 16 * RT

    binds = decode_bindings(r, "vec4", "uvec4", "float")  # (query rows: 16-byte words)
    pdst = "part" if fused else "dst"

    shared = [f"shared f16vec4 sK[{TILE * KS}];", f"shared f16vec4 sV[{TILE * VS}];",
              f"shared vec4 sS[{SROWS * SS}];", f"shared f16vec4 sP[{16 * RT * PS}];",
              f"shared float sAl[{16 * RT}];", f"shared float sM[{16 * RT}];",
              f"shared float sL[{16 * RT}];",
              "shared uvec4 s_last4;", "#define s_last s_last4.x"]
    if r.select_block:  # the row's block table (attention_decode.select_shared)
        shared += select_shared(r.select_block, r.select_k)
    if fused:
        shared += fused_combine_shared(r)

    L: list[str] = []

    def emit(s: str, ind: int = 1) -> None:
        L.append("    " * ind + s)

    emit_matrix_prologue(r, emit)
    if DS:
        emit("uint ksrow = b * LK_CAP;  // first k_shared row of this batch row")
    if r.select_block:  # logical keys: clamped to the row's last, read through its table
        emit("uint TMAX = max(LK, 1u) - 1u;  // reads clamp to the row's last selected key")
    else:
        emit("uint TMAX = max(LK_CAP, 1u) - 1u;  // reads clamp to the last key")

    # --- the K/V copy: streams of 16-byte words, TILE rows each -----------------------------
    streams = [("k", "kvrow", DKN // 8, "sK", KS, 0)]
    if DS:
        streams.append(("ks", "ksrow", DS // 8, "sK", KS, DKN // 4))
    streams.append(("v", "kvrow", DV // 8, "sV", VS, 0))
    words = [(name, base, wpr, dst, stride, col, i)
             for name, base, wpr, dst, stride, col in streams
             for i in range(-(-TILE * wpr // WG))]

    def guard(wpr: int, i: int) -> str:
        return "" if (TILE * wpr) % WG == 0 or (i + 1) * WG <= TILE * wpr else \
            f"if (lane + {i * WG}u < {TILE * wpr}u) "

    def load_words(tbase: str, ind: int, decl: bool, ws: int = 0) -> None:
        """Register set ``ws`` <- the 16-byte words of the tile at key ``tbase``."""
        for name, base, wpr, _d, _s, _c, i in words:
            var = f"w{ws}{name}{i}"
            if decl:
                emit(f"uvec4 {var} = uvec4(0u);", ind)
            key = f"min({tbase} + x / {wpr}u, TMAX)"
            row = f"{base} + " + (f"sel_row({key})" if r.select_block else key)
            emit(f"{guard(wpr, i)}{{ uint x = lane + {i * WG}u; "
                 f"{var} = {name}[({row}) * {wpr}u + x % {wpr}u]; }}", ind)

    def store_words(ind: int, ws: int = 0) -> None:
        for name, _b, wpr, dst, stride, col, i in words:
            var = f"w{ws}{name}{i}"
            emit(f"{guard(wpr, i)}{{", ind)
            emit(f"uint x = lane + {i * WG}u;", ind + 1)
            emit(f"uint rw = x / {wpr}u;", ind + 1)
            emit(f"uint o = rw * {stride}u + {col}u + x % {wpr}u * 2u;", ind + 1)
            emit("bool ok = t0 + rw < k1;  // rows past the chunk read as zero", ind + 1)
            emit(f"{dst}[o] = ok ? f16vec4(unpackFloat2x16({var}.x), unpackFloat2x16({var}.y)) "
                 ": f16vec4(0.0);", ind + 1)
            emit(f"{dst}[o + 1u] = ok ? f16vec4(unpackFloat2x16({var}.z), "
                 f"unpackFloat2x16({var}.w)) : f16vec4(0.0);", ind + 1)
            emit("}", ind)

    # the first steps' words are in flight while the query is staged (DP register sets of
    # words in flight, the loop unrolled DP times: set j is stored at sub-step j and
    # refilled with the tile DP steps ahead)
    DP = r.prefetch_steps if r.prefetch else 1
    if r.prefetch:
        emit("uint t0 = k0;")
        for ws in range(DP):
            load_words(f"k0 + {ws}u * KSTEP", 1, True, ws)

    # --- the query: each row tile in turn scaled to f16 in sK (lo parts in rows 16..31), and
    # the subgroups of that tile load the chunks they use into registers
    emit(f"for (uint i = lane; i < {16 * RT * PS}u; i += {WG}u) "
         "sP[i] = f16vec4(0.0);  // rows >= R stay zero")
    emit(f"uint rt = sg / {SR}u;  // this subgroup's row tile (scores)")
    emit(f"uint sq = sg % {SR}u;  // its place among the tile's subgroups")
    emit(f"uint kb0 = sq % {NKB}u;  // its (first) key block" if G > 1 else
         f"uint kb0 = sq;  // its first key block (then + {SR} ...)")
    emit(f"uint jq = sq / {NKB}u;  // its share of the channels: chunks jq, jq + {G} ..."
         if G > 1 else "uint jq = 0u;")
    for i in range(QD):
        emit(f"{B16} qh{i};")
        if r.q_split:
            emit(f"{B16} ql{i};")
    # every tile's query words are loaded into registers before any is used (a loop of
    # load-then-store made each load wait for the one before: ~10 us of the MLA kernel's
    # prologue on the H200, bench/mla_phases.py)
    QW = 16 * DK // 4  # float vectors of a row tile's query
    NQ = -(-QW // WG)
    for t in range(RT):
        for j in range(NQ):
            emit(f"vec4 qx{t}_{j} = vec4(0.0);")
            emit(f"{{ uint i = min(lane + {j * WG}u, {QW - 1}u);")
            emit(f"uint rr = {16 * t}u + i / {DK // 4}u;", 2)
            emit(f"uint qv = (bg * {GR}u + rbase + min(rr, {R - 1}u)) * {DK // 4}u + "
                 f"i % {DK // 4}u;", 2)
            emit(f"if (rr < {R}u) qx{t}_{j} = q[qv] * SCALE; }}", 2)
    for t in range(RT):
        for j in range(NQ):
            emit(f"if (lane + {j * WG}u < {QW}u) {{" if (j + 1) * WG > QW else "{")
            emit(f"uint i = lane + {j * WG}u;", 2)
            emit(f"uint rr = i / {DK // 4}u;  // the row within the tile", 2)
            emit(f"f16vec4 h = f16vec4(qx{t}_{j});", 2)
            emit(f"sK[rr * {KS}u + i % {DK // 4}u] = h;", 2)
            if r.q_split:
                emit(f"sK[(rr + 16u) * {KS}u + i % {DK // 4}u] = f16vec4(qx{t}_{j} - vec4(h));"
                     "  // f16's rest", 2)
            emit("}")
        emit("barrier();")
        emit(f"if (rt == {t}u) {{  // uniform over the subgroup")
        for i in range(QD):
            gd = "" if G == 1 or DKT % G == 0 or i < DKT // G else \
                f"if (jq + {i * G}u < {DKT}u) "
            emit(f"{gd}coopMatLoad(qh{i}, sK, min(jq + {i * G}u, {DKT - 1}u) * 4u, {KS}u, {COL});",
                 2)
            if r.q_split:
                emit(f"{gd}coopMatLoad(ql{i}, sK, {16 * KS}u + min(jq + {i * G}u, {DKT - 1}u) * 4u,"
                     f" {KS}u, {COL});", 2)
        emit("}")
        emit("barrier();  // the tile's query rows in sK are read")
    # softmax rows of this subgroup
    for j in range(RJ):
        emit(f"uint sr{j} = (sg + {j * NSG}u) * {RPS}u + ln / {LPR}u;  // a softmax row (< {R})")
        emit(f"float m{j} = NEG_INF;")
        emit(f"float l{j} = 0.0;")
        if r.mask is not None:
            emit(mask_row(r, f"mrow{j}", f"rbase + sr{j}"))
    for i in range(TI):
        emit(f"uint ot{i} = min(sg + {i * NSG}u, {OT - 1}u);  // an output tile (row tile, cols)")
        emit(f"uint orb{i} = ot{i} / {DT}u * 16u;  // its first row")
        emit(f"uint c{i} = ot{i} % {DT}u;  // its 16 columns")
        emit(f"{ACC} o{i} = {ACC}(0.0);")

    def step_head(ws: int, ind: int) -> None:
        """Step ``it + ws``'s first key, its words (register set ``ws``) into workgroup
        memory and the words DP steps ahead into the same set, in flight meanwhile."""
        step = f"(it + {ws}u)" if ws else "it"
        emit(f"{'' if r.prefetch else 'uint '}t0 = k0 + {step} * KSTEP;  // this step's "
             "first key", ind)
        if not r.prefetch:
            load_words("t0", ind, True)
        store_words(ind, ws)
        if r.prefetch:
            load_words(f"t0 + {DP}u * KSTEP", ind, False, ws)

    emit(f"for (uint it = 0u; it < nit; it += {DP}u) {{")
    tail_start = len(L)  # the rest of a step is the same whatever its register set
    emit("barrier();", 2)
    # 1. scores (or partial scores) per key block
    for kbi in range(KBS):
        kb = f"kb0 + {kbi * SR}u" if KBS > 1 else "kb0"
        emit(f"if (t0 + ({kb}) * 16u < k1) {{  // uniform over the subgroup", 2)
        # the chunks' products alternate between NA accumulators, so they do not all wait
        # on one another (the MLA shape: 9 chunks a subgroup)
        for a in range(NA):
            emit(f"{ACC} acc{a} = {ACC}(0.0);", 3)
        for i in range(QD):
            acc = f"acc{i % NA}"
            gd = "" if G == 1 or DKT % G == 0 or i < DKT // G else f"if (jq + {i * G}u < {DKT}u) "
            emit(f"{gd}{{", 3)
            emit(f"{A16} ka;", 4)
            emit(f"coopMatLoad(ka, sK, ({kb}) * {16 * KS}u + (jq + {i * G}u) * 4u, {KS}u, {ROW});",
                 4)
            emit(f"{acc} = coopMatMulAdd(ka, qh{i}, {acc});", 4)
            if r.q_split:
                emit(f"{acc} = coopMatMulAdd(ka, ql{i}, {acc});", 4)
            emit("}", 3)
        for a in range(1, NA):
            emit(f"acc0 = acc0 + acc{a};", 3)
        # score tile (row tile, part, key block) = rt * NKB * G + jq * NKB + kb
        slot = f"(rt * {NKB * G}u + jq * {NKB}u + {kb})"
        emit(f"coopMatStore(acc0, sS, {slot} * {16 * SS}u, {SS}u, {ROW});", 3)
        emit("}", 2)
    emit("barrier();", 2)
    # 2. online softmax
    for j in range(RJ):
        # (a pass whose rows all exist runs unguarded, so the passes can interleave)
        emit("{" if (j + 1) * NSG * RPS <= R else
             f"if (sr{j} < {R}u) {{  // uniform over the row's lanes", 2)
        for e in range(KL):
            emit(f"uint kk{e} = ln % {LPR}u + {LPR * e}u;  // key within the step", 3)
            parts = " + ".join(
                f"sS[((sr{j} / 16u * {NKB * G}u + {jj * NKB}u + kk{e} / 16u) * 16u + kk{e} % 16u)"
                f" * {SS}u + sr{j} % 16u / 4u][sr{j} % 4u]" for jj in range(G))
            emit(f"float s{e} = {parts};", 3)
            if r.softcap is not None:
                emit(f"s{e} = SOFTCAP * tanh(clamp(s{e} / SOFTCAP, -15.0, 15.0));", 3)
            if r.mask is not None:
                emit(f"s{e} += mask[mrow{j} + min(t0 + kk{e}, LK_CAP - 1u)];", 3)
            emit(f"s{e} = t0 + kk{e} < k1 ? s{e} : NEG_INF;", 3)
        mx = "s0"
        for e in range(1, KL):
            mx = f"max({mx}, s{e})"
        emit(f"float mx = {mx};", 3)
        emit(f"for (uint off = {LPR // 2}u; off >= 1u; off >>= 1u) "
             "mx = max(mx, subgroupShuffleXor(mx, off));", 3)
        # The row's reference max moves only when the step's max passes it by more than
        # RESCALE_SLACK: until then the weights exp(s - m) stay below e^8 (f16 holds them,
        # l and O in f32 too), and the accumulators need no round trip. With 16 rows a max
        # moved on most steps (1/n per row and step), and every move cost the whole
        # workgroup three barriers per accumulator tile.
        emit(f"float mn = max(m{j}, mx);", 3)
        emit(f"bool up = mn > m{j} + RESCALE_SLACK;  // (from -inf: any key)", 3)
        emit(f"float al = up ? ((m{j} == NEG_INF) ? 0.0 : exp(m{j} - mn)) : 1.0;", 3)
        emit(f"mn = up ? mn : m{j};", 3)
        emit("float sum = 0.0;", 3)
        for e in range(KL):
            emit(f"float p{e} = (s{e} == NEG_INF) ? 0.0 : exp(s{e} - mn);", 3)
            emit(f"sP[sr{j} * {PS}u + kk{e} / 4u][kk{e} % 4u] = float16_t(p{e});", 3)
            emit(f"sum += p{e};", 3)
        emit(f"for (uint off = {LPR // 2}u; off >= 1u; off >>= 1u) "
             "sum += subgroupShuffleXor(sum, off);", 3)
        emit(f"l{j} = l{j} * al + sum;", 3)
        emit(f"m{j} = mn;", 3)
        emit(f"if (ln % {LPR}u == 0u) sAl[sr{j}] = al;", 3)
        emit("}", 2)
    emit("barrier();", 2)
    # 3. rescale, then O += P V
    # a row whose first key arrived (al = 0) holds zero accumulators (or NaN, which a
    # zero factor keeps): only 0 < al < 1 (or NaN) needs the round trip
    # (lane rr reads row rr's factor, an OR across the subgroup: a loop over the rows made
    # a chain of R dependent workgroup-memory reads and branches, ~1.5k of the MLA step's
    # ~5.8k cycles on the H200, bench/mla_phases.py)
    emit(f"float alr = sAl[min(ln, {R - 1}u)];", 2)
    emit("uint rf = (!(alr == 1.0 || alr == 0.0)) ? 1u : 0u;", 2)
    emit("for (uint off = 16u; off >= 1u; off >>= 1u) rf |= subgroupShuffleXor(rf, off);", 2)
    emit("if (rf != 0u) {  // uniform over the workgroup (every subgroup reads every row)", 2)
    for i in range(TI):
        emit(f"coopMatStore(o{i}, sS, sg * {16 * SS}u, {SS}u, {ROW});", 3)
        emit("barrier();", 3)
        emit("for (uint e = ln; e < 64u; e += 32u) "
             f"if (orb{i} + e / 4u < {R}u) sS[sg * {16 * SS}u + e / 4u * {SS}u + e % 4u] *= "
             f"sAl[orb{i} + e / 4u];", 3)
        emit("barrier();", 3)
        emit(f"coopMatLoad(o{i}, sS, sg * {16 * SS}u, {SS}u, {ROW});", 3)
        emit("barrier();", 3)
    emit("}", 2)
    # with DT a multiple of NSG, tile i's rows are row tile i * NSG / DT for every subgroup:
    # each row tile's weights are loaded once, not once per output tile
    static_rt = RT > 1 and DT % NSG == 0
    for kb in range(NKB):
        emit(f"if (t0 + {kb * 16}u < k1) {{  // uniform over the workgroup", 2)
        if RT == 1:
            emit(f"{A16} pa;", 3)
            emit(f"coopMatLoad(pa, sP, {kb * 4}u, {PS}u, {ROW});", 3)
        elif static_rt:
            for t in sorted({i * NSG // DT for i in range(TI)}):
                emit(f"{A16} pa{t};", 3)
                emit(f"coopMatLoad(pa{t}, sP, {16 * t * PS + kb * 4}u, {PS}u, {ROW});", 3)
        for i in range(TI):
            gd = "" if OT % NSG == 0 else f"if (sg + {i * NSG}u < {OT}u) "
            emit(f"{gd}{{", 3)
            if static_rt:
                emit(f"{A16} pa = pa{i * NSG // DT};", 4)
            elif RT > 1:  # the weights of this tile's rows
                emit(f"{A16} pa;", 4)
                emit(f"coopMatLoad(pa, sP, orb{i} * {PS}u + {kb * 4}u, {PS}u, {ROW});", 4)
            emit(f"{B16} vb;", 4)
            emit(f"coopMatLoad(vb, sV, {kb * 16 * VS}u + c{i} * 4u, {VS}u, {ROW});", 4)
            emit(f"o{i} = coopMatMulAdd(pa, vb, o{i});", 4)
            emit("}", 3)
        emit("}", 2)
    emit("barrier();  // sK, sV, sP are read before the next step writes them", 2)
    tail = L[tail_start:]
    del L[tail_start:]
    if DP == 1:
        step_head(0, 2)
        L.extend(tail)
    else:  # one step per register set, each guarded
        for ws in range(DP):
            emit(f"if (it + {ws}u < nit) {{  // uniform over the workgroup", 2)
            step_head(ws, 3)
            L.extend("    " + line for line in tail)
            emit("}", 2)
    emit("}")

    # the rows' (m, l), then each subgroup's tiles out (every subgroup takes every barrier)
    for j in range(RJ):
        emit(f"if (sr{j} < {R}u && ln % {LPR}u == 0u) {{ sM[sr{j}] = m{j}; sL[sr{j}] = l{j}; }}")
    for i in range(TI):
        emit("barrier();")
        emit(f"coopMatStore(o{i}, sS, sg * {16 * SS}u, {SS}u, {ROW});")
        emit("barrier();")
        own = "" if OT % NSG == 0 else f" || sg + {i * NSG}u >= {OT}u"
        emit("for (uint e = ln; e < 64u; e += 32u) {")
        emit(f"uint rr = orb{i} + e / 4u;  // the block row", 2)
        emit(f"if (rr >= {R}u{own}) continue;", 2)
        emit(f"uint orow = bg * {GR}u + rbase + rr;", 2)
        emit(f"uint col = c{i} * 16u + e % 4u * 4u;", 2)
        emit(f"vec4 val = sS[sg * {16 * SS}u + e / 4u * {SS}u + e % 4u];", 2)

        def put(bname: str, base: str, scale: str, ind: int) -> None:
            for cc, comp in enumerate("xyzw"):
                emit(f"{bname}[{base} + {cc}u] = val.{comp}{scale};", ind)

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

    return matrix_shader(r, binds, shared, L,
                         (f"#define RESCALE_SLACK {float_lit(RESCALE_SLACK)}",))


def matrix_shader(r: DecodeRequest, binds: list[str], shared: list[str], body: list[str],
                  consts: tuple[str, ...] = ()) -> str:
    """A matrix decode kernel's whole source (staged and register-fed alike): the
    cooperative-matrix extensions, the workgroup size, the request as a comment, the
    bindings, the length push constant, SCALE / NEG_INF / SOFTCAP and ``consts``, the
    workgroup variables, then ``body`` as main()."""
    defs = [
        "layout(push_constant) uniform Push { uint lk; } pc;  // keys per K/V head (stride)",
        f"#define SCALE {float_lit(r.scale)}",
        f"#define NEG_INF {NEG_INF}",
        *consts,
    ]
    if r.softcap is not None:
        defs.append(f"#define SOFTCAP {float_lit(r.softcap)}")
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
        + "".join(binds) + "\n".join(defs) + "\n" + "\n".join(shared)
        + "\n\nvoid main() {\n" + "\n".join(body) + "\n}\n"
    )
