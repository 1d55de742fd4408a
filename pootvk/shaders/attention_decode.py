"""GLSL for the grouped split-KV decode schedule (``pootvk.plan.decode_schedule``).

Partial kernel: one workgroup per (batch row, KV head, row block, split). Lane ``i`` belongs
to lane group ``i / LPK`` (LPK = lanes per key) and holds the head-dimension slice
``{(d * LPK + i % LPK) * E ...}`` of every key its group takes, so one load instruction of a
group reads LPK consecutive 16-byte words of one key row and a warp reads whole rows. Per
loop step a group takes KPI keys ``base + j * GROUPS`` (j < KPI), loads their K and V slices
(all in flight together), forms the partial dots with every query row of the block,
reduces them across the LPK lanes (``subgroupShuffleXor``, or through workgroup memory),
and applies one online-softmax update per row for the KPI keys.

The running state is generated named registers: ``q{r}_{x}`` (pre-scaled query slice),
``o{r}_{x}`` (accumulator slice), ``m{r}``, ``l{r}``; every index is resolved here in
Python, so no private array exists (DESIGN.md). With ``q_workgroup`` the query slices are
instead read from workgroup memory at each use (their registers go to more keys in flight).
At the end the lane groups of a subgroup merge their (m, l, o) by xor shuffles, then the
subgroups fold through workgroup memory, one row at a time.

A -inf score adds exactly zero weight (every exp is guarded, so -inf - -inf never makes a
NaN); a split whose chunk sees no key (or only -inf) writes the neutral (0, -inf, 0); a
row that sees no key at all ends as 0/0 = NaN, as the oracle's softmax does. NaN follows
the oracle: a NaN score makes p, hence l and o, NaN (GLSL's max may drop it from m, so every
fold treats a NaN l as NaN even where m is -inf); a value row is multiplied by its weight,
so a non-finite value row poisons the row as the oracle's matmul does, while the clamped
reads of keys past the chunk are zeroed and never contribute. The key count Lk is a push
constant. With ``live_len`` row b's keys end at ``clamp(len[b], 0, Lk)`` (an I32 [B]
buffer): the split chunks are cut from that live length, so a split past it has an empty
chunk and writes the neutral partial; the grid does not change. With the fused combine the
splits past the length return before any load and the last of the active ones folds only
theirs; ``min_chunk`` keeps chunks at least that long, so a short length runs on few splits
and one that fits one chunk is a single split writing the output itself.

Combine kernel: one invocation per output element, ``out = sum_i o_i exp(m_i - M) /
sum_i l_i exp(m_i - M)``.

A split key (``dk_shared = s``, latent attention): a lane's key slice is its share of k's
own ``Dk - s`` channels followed by its share of the batch row's k_shared row (bound as
``ks``, one row per key for every KV head), the query's channels in the same order; the
dot, reduction and everything after are unchanged, and the broadcast key is never built.

A paged key (``pool_slots`` S > 0): key t's K/V rows are pool row ``read[b, t] * Hkv + g``
(the map bound as ``rmap``, i32 [B, Lk]; each word clamped into [0, S), so no word reads
outside the pools' bindings) instead of ``(b * Hkv + g) * Lk + t``; the LPK lanes of a key
group load the same word. With the prefetch the pool rows are looked up one step ahead of
the K/V loads that use them, so a step's loads never wait on a map read. Mask, live length
and chunks index the logical t as before.

Selected keys (``select_block`` = bs > 0, SelectedAttention): the prologue builds the row's
block table in workgroup memory (``select_table``: one lane compacts the row's ids that lie in
[0, own) into ``s_blk``, then the own block ``own = p / bs`` with p = qpos[b, l] clamped into
[0, Lk), and the logical length ``s_len = n * bs + p - own * bs + 1``), a barrier, and the
kernel is the live-length kernel over that logical range: logical key i reads physical key
``s_blk[i / bs] * bs + i % bs`` (``sel_row``) of its KV head, and the split chunks are cut
from the logical length. No key outside the row's visible set is ever addressed.

16-bit K/V are read as packed words (``uvec4`` = 8 halves = 16 bytes, or ``uvec2``):
``unpackHalf2x16`` for F16, a 16-bit shift into a float's top bits for BF16; all math is F32.
"""

from __future__ import annotations

from ..plan.decode_schedule import (
    DecodeCombineRequest,
    DecodeRequest,
    check_request,
    reduce_rows,
)
from .common import float_lit, group_id
from .table import generators

NEG_INF = float_lit(float("-inf"))


def _buffer(binding: int, name: str, elem: str, *, readonly: bool, access: str = "") -> str:
    access = access or ("readonly " if readonly else "writeonly ")
    return (f"layout(std430, set = 0, binding = {binding}) {access}buffer B{binding} "
            f"{{ {elem} {name}[]; }};\n")


def _kv_glsl_type(r: DecodeRequest) -> str:
    if r.kv_dtype == "f32":
        return "vec4" if r.load_elems == 4 else "float"
    return {8: "uvec4", 4: "uvec2"}[r.load_elems]


def _unpack(r: DecodeRequest, w: str) -> list[str]:
    """Float vectors (vec4, or float when vec == 1) of one loaded K/V word ``w``."""
    if r.kv_dtype == "f32":
        return [w]
    f = "unpackHalf2x16" if r.kv_dtype == "f16" else "bf2"
    if r.kv_dtype == "f16" and r.f16_convert == "fp16":
        f = "h2"
    comps = ["x", "y", "z", "w"][: r.load_elems // 2]
    return [f"vec4({f}({w}.{comps[i]}), {f}({w}.{comps[i + 1]}))" for i in range(0, len(comps), 2)]


def _scatter_gather(names: list[str], lanes: int, emit) -> None:
    """Sum every value of ``names`` over the ``lanes`` adjacent lanes of a key group.

    Reduce-scatter: while a lane holds an even count of values, each stage halves it (the
    lane keeps the half its lane bit picks and adds the partner's copy of that half: one
    shuffle per kept value); then butterfly the rest. All-gather undoes the halving stages
    (one shuffle per held value). Every index is resolved here; the sums end in ``names``.
    """
    cur = list(names)
    halved: list[int] = []
    n_tmp = 0
    off = lanes // 2
    while off >= 1:
        n = len(cur)
        if n >= 2 and n % 2 == 0:
            emit(f"bool hb{off} = (li & {off}u) != 0u;", 2)
            h = n // 2
            nxt = []
            for k in range(h):
                lo, hi = cur[k], cur[k + h]
                t = f"rs{n_tmp}"
                n_tmp += 1
                emit(f"float {t} = (hb{off} ? {hi} : {lo}) + "
                     f"subgroupShuffleXor(hb{off} ? {lo} : {hi}, {off}u);", 2)
                nxt.append(t)
            cur = nxt
            halved.append(off)
        else:
            for c in cur:
                emit(f"{c} += subgroupShuffleXor({c}, {off}u);", 2)
        off //= 2
    for off in reversed(halved):
        lo_l, hi_l = [], []
        for c in cur:
            t = f"rs{n_tmp}"
            n_tmp += 1
            emit(f"float {t} = subgroupShuffleXor({c}, {off}u);", 2)
            emit(f"float {t}a = hb{off} ? {t} : {c};", 2)
            emit(f"float {t}b = hb{off} ? {c} : {t};", 2)
            lo_l.append(f"{t}a")
            hi_l.append(f"{t}b")
        cur = lo_l + hi_l
    for name, c in zip(names, cur, strict=True):
        if name != c:
            emit(f"{name} = {c};", 2)


@generators.register(DecodeRequest)
def generate_decode_partial(r: DecodeRequest) -> str:
    if r.matrix and r.matrix_feed == "registers":
        from .attention_decode_regfed import generate_decode_regfed

        return generate_decode_regfed(r)
    if r.matrix:
        from .attention_decode_staged import generate_decode_staged

        return generate_decode_staged(r)
    check_request(r)
    W = r.vec
    vt = "vec4" if W == 4 else "float"
    E = r.load_elems
    per = E // W  # float vectors per load
    LPK, WG, KPI, R = r.lanes_per_key, r.local_size, r.keys_per_iter, r.rows_per_wg
    NG = r.key_groups
    # loads per lane per key: UKN of k's own row, then (split key) UKS of k_shared's row
    UKN, UKS = ((w // (E * LPK)) for w in (r.dk - r.dk_shared, r.dk_shared))
    UK, UV = UKN + UKS, r.dv // (E * LPK)
    NQX, NOX = UK * per, UV * per  # float vectors of q / o per lane per row
    DKW, DVW = r.dk // W, r.dv // W  # row widths in float vectors
    split = r.splits > 1
    kvt = _kv_glsl_type(r)
    dot = (lambda a, b: f"dot({a}, {b})") if W == 4 else (lambda a, b: f"{a} * {b}")

    fused = split and r.fused_combine
    binds = decode_bindings(r, vt, kvt, "float" if split else vt)
    pdst = "part" if fused else "dst"  # where the split partials go

    ext = ["#extension GL_EXT_control_flow_attributes : require"]
    if r.subgroup:
        ext += ["#extension GL_KHR_shader_subgroup_basic : require",
                "#extension GL_KHR_shader_subgroup_shuffle : require"]
    helpers = ""
    if r.kv_dtype == "f16" and r.f16_convert == "fp16":
        ext.append("#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require")
        helpers = "vec2 h2(uint w) { return vec2(unpackFloat2x16(w)); }\n"
    if r.kv_dtype == "bf16":
        helpers = ("vec2 bf2(uint w) {\n"
                   "    return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u));\n"
                   "}\n")
    red_rows = reduce_rows(R, KPI, WG)
    shared = [f"shared float s_m[{R * NG}];", f"shared float s_l[{R * NG}];",
              f"shared {vt} s_o[{r.fold_units * NG * DVW}];"]
    if r.q_workgroup:
        shared.append(f"shared {vt} s_q[{R * DKW}];")
    if not r.subgroup:
        shared.append(f"shared float s_red[{red_rows * KPI * WG}];")
    if r.select_block:
        shared += select_shared(r.select_block, r.select_k)
    if fused:
        shared.append("shared uint s_last;")
        shared += [f"shared float s_cw[{R * r.splits}];", f"shared float s_cl[{R * r.splits}];",
                   f"shared float s_cden[{R}];"]

    L: list[str] = []  # main body lines (4-space base indent)

    def emit(s: str, ind: int = 1) -> None:
        L.append("    " * ind + s)

    emit_chunk_prologue(r, emit)
    if r.subgroup:
        emit("uint lane = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;")
    else:
        emit("uint lane = gl_LocalInvocationID.x;")
    emit(f"uint li = lane % {LPK}u;  // lane within its key group")
    emit(f"uint gi = lane / {LPK}u;  // key group")
    if r.paged:
        # a paged key: key t's K/V rows are pool row read[b, t] * Hkv + g (clamped into
        # the pool, so no map word reads outside the pools' bindings)
        emit("uint rrow = b * LK_CAP;  // row b's read words")
        emit("int SMAX = int(pc.slots) - 1;  // the last pool slot")
    else:
        emit("uint kvrow = bg * LK_CAP;  // first key row of this KV head")
    if UKS:
        emit("uint ksrow = b * LK_CAP;  // first k_shared row of this batch row (every head)")

    def q_index(x: int) -> str:
        """Where a lane's query vector ``x`` sits in its row (in float vectors)."""
        d, e = divmod(x, per)
        # a split key's shared channels follow k's own ones in q
        base = "" if d < UKN else f"{(r.dk - r.dk_shared) // W}u + "
        d = d if d < UKN else d - UKN
        return f"{base}(({d * LPK}u + li) * {per}u + {e}u)"

    def qv(i: int, x: int) -> str:
        """Row ``i``'s query vector ``x``: a named register, or (``q_workgroup``) its place
        in workgroup memory, read at each use."""
        return f"s_q[{i * DKW}u + {q_index(x)}]" if r.q_workgroup else f"q{i}_{x}"

    def query_rows() -> None:
        """The block's query slices (pre-scaled) and running state: orow = (b * HKV + g) *
        GROUP_ROWS + rbase + r. Emitted after step 0's K/V loads are issued, so the query's
        loads need not precede theirs (H200, bench/decode_timeline.py: the time before the
        key loop, 3.0-3.2 us at (1,32,8,32768) F16, is step 0's first K/V latency either
        way). With ``q_workgroup`` the first lane group stores the slices to workgroup
        memory (every lane group reads the same ones) and a barrier follows the rows."""
        for i in range(R):
            emit(f"uint orow{i} = bg * {r.group_rows}u + rbase + {i}u;")
            for x in range(NQX):
                src = f"q[orow{i} * {DKW}u + {q_index(x)}] * SCALE"
                if r.q_workgroup:
                    emit(f"if (gi == 0u) {qv(i, x)} = {src};")
                else:
                    emit(f"{vt} {qv(i, x)} = {src};")
            if r.mask is not None:
                emit(mask_row(r, f"mrow{i}", f"rbase + {i}u"))
            for x in range(NOX):
                emit(f"{vt} o{i}_{x} = {vt}(0.0);")
            emit(f"float m{i} = NEG_INF;")
            emit(f"float l{i} = 0.0;")
        if r.q_workgroup:
            emit("barrier();  // s_q holds the rows' query slices")

    def key_rows(it: str, ind: int, decl: str = "uint ") -> None:
        """t/ok/tt/kb/vb of the keys of step ``it`` (reads past the chunk are clamped)."""
        emit(f"{decl}base = k0 + {it} * KSTEP + gi;", ind)
        for j in range(KPI):
            emit(f"{decl}t{j} = base + {j * NG}u;", ind)
            emit(f"{decl.replace('uint', 'bool')}ok{j} = t{j} < k1;", ind)
            emit(f"{decl}tt{j} = ok{j} ? t{j} : k0;  // a key past the chunk reads a valid row",
                 ind)

    def pool_row(pos: str) -> str:
        """A paged key's pool row of logical key ``pos`` (the LPK lanes of a key group load
        the same read word: one broadcast transaction)."""
        return f"uint(clamp(rmap[rrow + {pos}], 0, SMAX)) * {r.hkv}u + g"

    def loads(ind: int, decl: bool, src: str = "tt", rows: str = "") -> None:
        """K/V words of the keys at positions ``{src}{j}``; a paged key's pool rows are
        ``{rows}{j}`` when given (looked up a step ahead), else looked up here."""
        for j in range(KPI):
            if r.paged:
                if not rows:
                    emit(f"uint kr{j} = {pool_row(f'{src}{j}')};", ind)
                row = f"{rows or 'kr'}{j}"
                emit(f"uint kb{j} = {row} * {r.dk // E}u + li;", ind)
                emit(f"uint vb{j} = {row} * {r.dv // E}u + li;", ind)
                continue
            if r.select_block:  # a selected key: its physical row through the block table
                emit(f"uint ks{j} = sel_row({src}{j});", ind)
                emit(f"uint kr{j} = kvrow + ks{j};", ind)
                emit(f"uint kb{j} = kr{j} * {(r.dk - r.dk_shared) // E}u + li;", ind)
                if UKS:  # the batch row's shared key part of the same physical key
                    emit(f"uint ksb{j} = (ksrow + ks{j}) * {r.dk_shared // E}u + li;", ind)
                emit(f"uint vb{j} = kr{j} * {r.dv // E}u + li;", ind)
                continue
            emit(f"uint kb{j} = (kvrow + {src}{j}) * {(r.dk - r.dk_shared) // E}u + li;", ind)
            if UKS:
                emit(f"uint ksb{j} = (ksrow + {src}{j}) * {r.dk_shared // E}u + li;", ind)
            emit(f"uint vb{j} = (kvrow + {src}{j}) * {r.dv // E}u + li;", ind)
        for j in range(KPI):
            for d in range(UK):
                word = f"k[kb{j} + {d * LPK}u]" if d < UKN else f"ks[ksb{j} + {(d - UKN) * LPK}u]"
                emit(f"{kvt + ' ' if decl else ''}kw{j}_{d} = {word};", ind)
        for j in range(KPI):
            for d in range(UV):
                emit(f"{kvt + ' ' if decl else ''}vw{j}_{d} = v[vb{j} + {d * LPK}u];", ind)

    if r.prefetch:
        # software pipeline: step it's K/V words were loaded during step it - 1
        for j in range(KPI):
            for d in range(UK):
                emit(f"{kvt} kw{j}_{d};")
            for d in range(UV):
                emit(f"{kvt} vw{j}_{d};")
            if r.paged:
                emit(f"uint sr{j};  // the next step's pool row of key {j}")
        emit("{  // step 0's loads (clamped to a valid row; an empty chunk reads row k0)")
        for j in range(KPI):
            emit(f"uint px{j} = min(k0 + gi + {j * NG}u, max(k1, 1u) - 1u);", 2)
        loads(2, False, "px")
        if r.paged:  # step 1's pool rows: each step's K/V loads never wait on a map read
            for j in range(KPI):
                emit(f"sr{j} = {pool_row(f'min(k0 + gi + KSTEP + {j * NG}u, max(k1, 1u) - 1u)')};",
                     2)
        emit("}")
    query_rows()
    emit("for (uint it = 0u; it < nit; ++it) {")
    key_rows("it", 2)
    if r.prefetch:
        for j in range(KPI):
            for d in range(UK):
                emit(f"{kvt} kc{j}_{d} = kw{j}_{d};", 2)
            for d in range(UV):
                emit(f"{kvt} vc{j}_{d} = vw{j}_{d};", 2)
        # (the last step's loads read a clamped row nobody uses: guarding them with
        # `it + 1 < nit` made the H200 kernel 1.2-1.4x slower, the loop's loads no longer
        # overlapping the step's math)
        emit("{  // issue the next step's loads now", 2)
        emit("uint nb = k0 + (it + 1u) * KSTEP + gi;", 3)
        if r.paged:
            loads(3, False, rows="sr")  # rows looked up a step ago
        else:
            for j in range(KPI):
                emit(f"uint px{j} = min(nb + {j * NG}u, k1 - 1u);", 3)
            loads(3, False, "px")
        if r.paged:  # the step after next: its pool rows (read words) now
            for j in range(KPI):
                emit(f"sr{j} = {pool_row(f'min(nb + KSTEP + {j * NG}u, k1 - 1u)')};", 3)
        emit("}", 2)
        kname, vname = "kc", "vc"
    else:
        loads(2, True)
        kname, vname = "kw", "vw"
    for j in range(KPI):
        for d in range(UK):
            for e, ex in enumerate(_unpack(r, f"{kname}{j}_{d}")):
                emit(f"{vt} kf{j}_{d * per + e} = {ex};", 2)
    # partial dots
    for i in range(R):
        for j in range(KPI):
            terms = " + ".join(dot(qv(i, x), f"kf{j}_{x}") for x in range(NQX))
            emit(f"float s{i}_{j} = {terms};", 2)
    # reduce across the LPK lanes of a key group
    if LPK > 1:
        if r.subgroup and r.dot_reduce == "scatter":
            _scatter_gather([f"s{i}_{j}" for i in range(R) for j in range(KPI)], LPK, emit)
        elif r.subgroup:
            off = LPK // 2
            while off >= 1:
                for i in range(R):
                    for j in range(KPI):
                        emit(f"s{i}_{j} += subgroupShuffleXor(s{i}_{j}, {off}u);", 2)
                off //= 2
        else:
            for r0 in range(0, R, red_rows):
                rr = range(r0, min(R, r0 + red_rows))
                for n, i in enumerate(rr):
                    for j in range(KPI):
                        emit(f"s_red[{(n * KPI + j) * WG}u + lane] = s{i}_{j};", 2)
                emit("barrier();", 2)
                for n, i in enumerate(rr):
                    for j in range(KPI):
                        slot = f"{(n * KPI + j) * WG}u + gi * {LPK}u"
                        emit(f"s{i}_{j} = 0.0;", 2)
                        emit(f"for (uint u = 0u; u < {LPK}u; ++u) "
                             f"s{i}_{j} += s_red[{slot} + u];", 2)
                emit("barrier();", 2)
    # score transform, mask, keys past the chunk
    for i in range(R):
        for j in range(KPI):
            s = f"s{i}_{j}"
            if r.softcap is not None:
                emit(f"{s} = SOFTCAP * tanh(clamp({s} / SOFTCAP, -15.0, 15.0));", 2)
            if r.mask is not None:
                emit(f"{s} += mask[mrow{i} + tt{j}];", 2)
            emit(f"{s} = ok{j} ? {s} : NEG_INF;", 2)
    # V words unpacked once per key (shared by every row)
    for j in range(KPI):
        for d in range(UV):
            for e, ex in enumerate(_unpack(r, f"{vname}{j}_{d}")):
                # a key past the chunk read a clamped row: it must add nothing, even inf
                emit(f"{vt} vf{j}_{d * per + e} = ok{j} ? {ex} : {vt}(0.0);", 2)
    # online softmax: one rescale per row per step
    for i in range(R):
        smax = f"s{i}_0"
        for j in range(1, KPI):
            smax = f"max({smax}, s{i}_{j})"
        emit(f"float mn{i} = max(m{i}, {smax});", 2)
        emit(f"float al{i} = (m{i} == NEG_INF) ? 0.0 : exp(m{i} - mn{i});", 2)
        for j in range(KPI):
            emit(f"float p{i}_{j} = (s{i}_{j} == NEG_INF) ? 0.0 : exp(s{i}_{j} - mn{i});", 2)
        if r.lazy_rescale:
            # al is exactly 1 (finite m) or the state is 0 / NaN (m = -inf) when the max
            # stays: skipping the multiply changes nothing
            emit(f"if (mn{i} != m{i}) {{", 2)
            emit(f"l{i} *= al{i};", 3)
            for x in range(NOX):
                emit(f"o{i}_{x} *= al{i};", 3)
            emit("}", 2)
            emit(f"l{i} = l{i}" + "".join(f" + p{i}_{j}" for j in range(KPI)) + ";", 2)
            for x in range(NOX):
                upd = " + ".join(f"p{i}_{j} * vf{j}_{x}" for j in range(KPI))
                emit(f"o{i}_{x} += {upd};", 2)
        else:
            emit(f"l{i} = l{i} * al{i}" + "".join(f" + p{i}_{j}" for j in range(KPI)) + ";",
                 2)
            for x in range(NOX):
                upd = "".join(f" + p{i}_{j} * vf{j}_{x}" for j in range(KPI))
                emit(f"o{i}_{x} = o{i}_{x} * al{i}{upd};", 2)
        emit(f"m{i} = mn{i};", 2)
    emit("}")

    # Fold the lane groups. With subgroups, the groups of one subgroup first merge their
    # (m, l, o) by xor shuffles (log2(subgroup / LPK) steps, every lane ends with the
    # subgroup's state), so the serial fold through workgroup memory below walks one entry
    # per subgroup (8 on a 256-lane NVIDIA workgroup) instead of one per group (32 with 8
    # lanes per key): the fold was most of a short decode's time (H200, 128 keys: ~12 us).
    if r.subgroup:
        emit(f"for (uint off = {LPK}u; off < gl_SubgroupSize; off <<= 1u) {{")
        for i in range(R):
            emit("{", 2)
            emit(f"float mo = subgroupShuffleXor(m{i}, off);", 3)
            emit(f"float lo = subgroupShuffleXor(l{i}, off);", 3)
            for x in range(NOX):
                emit(f"{vt} oo{x} = subgroupShuffleXor(o{i}_{x}, off);", 3)
            emit(f"float mn = max(m{i}, mo);", 3)
            emit(f"float wa = (m{i} == NEG_INF) ? 0.0 : exp(m{i} - mn);", 3)
            emit("float wb = (mo == NEG_INF) ? 0.0 : exp(mo - mn);", 3)
            emit(f"l{i} = l{i} * wa + lo * wb;", 3)
            for x in range(NOX):
                emit(f"o{i}_{x} = o{i}_{x} * wa + oo{x} * wb;", 3)
            emit(f"m{i} = mn;", 3)
            emit("}", 2)
        emit("}")
        ent, nent = "gl_SubgroupID", "gl_NumSubgroups"  # one fold entry per subgroup
        writer = f"gl_SubgroupInvocationID < {LPK}u"  # the subgroup's first lane group
    else:
        ent, nent, writer = "gi", f"{NG}u", ""
    emit(f"if ({writer + ' && ' if writer else ''}li == 0u) {{")
    for i in range(R):
        emit(f"s_m[{i * NG}u + {ent}] = m{i};", 2)
        emit(f"s_l[{i * NG}u + {ent}] = l{i};", 2)
    emit("}")
    emit("barrier();")
    # Every lane: each row's max M{i} and sum L{i} over the fold entries (the rows' chains
    # interleaved in one pass), then the accumulators fold through s_o, which holds NG
    # entries of a row: fb = NG / entries rows at a time (4 rows of a 256-lane NVIDIA
    # workgroup at 8 lanes per key; 1 without subgroups), each batch summed by
    # (row, channel) over every lane. H200, (1,32,8,32768) F16, bench/decode_timeline.py:
    # from the fold's first barrier to the last partial store 5.0 us (median workgroup)
    # this way against 6.1 with one row at a time (each with its own M / Lsum walk and two
    # barriers); most of what is left is that barrier's wait for the slowest subgroup.
    for i in range(R):
        emit(f"float M{i} = NEG_INF;")
    emit(f"for (uint u = 0u; u < {nent}; ++u) {{")
    for i in range(R):
        emit(f"M{i} = max(M{i}, s_m[{i * NG}u + u]);", 2)
    emit("}")
    for i in range(R):
        emit(f"float L{i} = 0.0;")
    emit(f"for (uint u = 0u; u < {nent}; ++u) {{")
    for i in range(R):
        emit(f"float mu{i} = s_m[{i * NG}u + u];", 2)
        emit(f"float lu{i} = s_l[{i * NG}u + u];", 2)
        emit(f"L{i} += isnan(lu{i}) ? lu{i} : (mu{i} == NEG_INF) ? 0.0 : "
             f"lu{i} * exp(mu{i} - M{i});", 2)
    emit("}")
    emit(f"uint fb = max(1u, {r.fold_units * NG}u / {nent});  // rows s_o holds at once")

    def pick(name: str) -> str:
        """Row ``row``'s ``name{i}`` (a compare chain over named registers, no array)."""
        chain = f"{name}{R - 1}"
        for i in range(R - 2, -1, -1):
            chain = f"row == {i}u ? {name}{i} : {chain}"
        return chain

    def fold_rows(r0: str, cnt: str, ind: int, last: bool) -> None:
        """Sum the batch of rows [r0, r0 + cnt) held in s_o and store them."""
        emit("barrier();", ind)
        emit(f"for (uint id = lane; id < ({cnt}) * {DVW}u; id += {WG}u) {{", ind)
        emit(f"uint rr = id / {DVW}u;  // row within the batch", ind + 1)
        emit(f"uint c = id % {DVW}u;", ind + 1)
        emit(f"uint row = {r0} + rr;", ind + 1)
        emit(f"uint orow = bg * {r.group_rows}u + rbase + row;", ind + 1)
        emit(f"{vt} acc = {vt}(0.0);", ind + 1)
        emit(f"for (uint u = 0u; u < {nent}; ++u) acc += s_o[(rr * {nent} + u) * {DVW}u + c];",
             ind + 1)
        emit(f"float M = {pick('M')};", ind + 1)
        emit(f"float Lsum = {pick('L')};", ind + 1)
        if split:
            def store(buf: str, base: str, scale: str, i2: int) -> None:
                """acc (scaled) into a float buffer at float vector c past ``base``."""
                if W == 4:
                    for cc, comp in enumerate("xyzw"):
                        emit(f"{buf}[{base} + c * 4u + {cc}u] = acc.{comp}{scale};", i2)
                else:
                    emit(f"{buf}[{base} + c] = acc{scale};", i2)

            if fused:
                emit("if (nact == 1u) {  // the only split with keys: the output itself",
                     ind + 1)
                store("dst", f"orow * {r.dv}u", " / Lsum", ind + 2)
                emit("continue;", ind + 2)
                emit("}", ind + 1)
            emit(f"uint pb = (orow * {r.splits}u + split) * {r.dv + 2}u;", ind + 1)
            store(pdst, "pb", "", ind + 1)
            emit("if (c == 0u) {", ind + 1)
            emit(f"{pdst}[pb + {r.dv}u] = M;", ind + 2)
            emit(f"{pdst}[pb + {r.dv + 1}u] = Lsum;", ind + 2)
            emit("}", ind + 1)
        else:
            emit(f"dst[orow * {DVW}u + c] = acc / Lsum;  // no key seen: 0/0 = NaN", ind + 1)
        emit("}", ind)
        if not last:
            emit("barrier();  // the batch's reads of s_o are done", ind)

    for i in range(R):
        if i:
            emit(f"if ({i}u % fb == 0u) {{  // s_o is full: fold rows [{i} - fb, {i})")
            fold_rows(f"{i}u - fb", "fb", 2, last=False)
            emit("}")
        emit(f"float f{i} = (m{i} == NEG_INF) ? 0.0 : exp(m{i} - M{i});")
        if writer:
            emit(f"if ({writer}) {{")
        for x in range(NOX):
            d, e = divmod(x, per)
            emit(f"s_o[(({i}u % fb) * {nent} + {ent}) * {DVW}u + ({d * LPK}u + li) * {per}u"
                 f" + {e}u] = o{i}_{x} * f{i};", 2 if writer else 1)
        if writer:
            emit("}")
    emit(f"uint rlast = {R - 1}u / fb * fb;  // the last batch's first row")
    fold_rows("rlast", f"{R}u - rlast", 1, last=True)

    if fused:
        emit_fused_combine(r, emit, "lane")

    consts = [
        "layout(push_constant) uniform Push { uint lk; uint slots; } pc;  // keys, pool slots"
        if r.paged else
        "layout(push_constant) uniform Push { uint lk; } pc;  // keys per K/V head (stride)",
        f"const uint SPLITS = {r.splits}u;",
        f"#define SCALE {float_lit(r.scale)}",
        f"#define NEG_INF {NEG_INF}",
    ]
    if r.softcap is not None:
        consts.append(f"#define SOFTCAP {float_lit(r.softcap)}")
    return (
        "#version 450\n" + "\n".join(ext) + "\n"
        + f"layout(local_size_x = {WG}) in;\n"
        + f"// {r.describe().replace(f'Lk={r.lk}', 'Lk=pc.lk')}\n"  # the source omits Lk
        + "".join(binds) + "\n".join(consts) + "\n" + "\n".join(shared) + "\n" + helpers
        + "\nvoid main() {\n" + "\n".join(L) + "\n}\n"
    )


def decode_bindings(r: DecodeRequest, q: str, kv: str, dst: str) -> list[str]:
    """The partial kernel's buffer declarations in ``r.bindings()`` order (scalar and matrix
    kernels alike): q, k, [k_shared as ks], v, [mask], [lens], [rmap: the paged read map
    [B, Lk]], [part, counter: the fused combine's, coherent], dst; ``q``, ``kv`` and ``dst``
    are the element types the kernel reads them as."""
    decls = [("q", q, "readonly "), ("k", kv, "readonly ")]
    if r.dk_shared:
        decls.append(("ks", kv, "readonly "))
    decls.append(("v", kv, "readonly "))
    if r.mask is not None:
        decls.append(("mask", "float", "readonly "))
    if r.select_block:
        decls += [("ids", "int", "readonly "), ("qpos", "int", "readonly ")]
    if r.live_len:
        decls.append(("lens", "int", "readonly "))
    if r.paged:
        decls.append(("rmap", "int", "readonly "))
    if r.splits > 1 and r.fused_combine:
        decls += [("part", "float", "coherent "), ("counter", "uint", "coherent ")]
    decls.append(("dst", dst, "writeonly "))
    assert len(decls) == len(r.bindings())
    out = [_buffer(i, name, elem, readonly=False, access=access)
           for i, (name, elem, access) in enumerate(decls)]
    if r.splits > 1 and r.fused_combine and r.dv % 2 == 0:
        # the one-round combine reads a split's words two channels a load (a row's
        # partial starts at an even float: Dv + 2 floats a partial)
        i = [n for n, _, _ in decls].index("part")
        out[i] += (f"layout(std430, set = 0, binding = {i}) coherent buffer B{i}x2 "
                   "{ vec2 part2[]; };\n")
    return out


def mask_row(r: DecodeRequest, name: str, row: str) -> str:
    """``uint name = ...``: the first mask word of the block row ``row`` (rbase + i), its
    (batch, head, query) indices broadcast where the mask's extent is 1."""
    mb, mh, mq = r.mask  # type: ignore[misc]
    h = f"(g * {r.n_rep}u + ({row}) / {r.lq}u)"
    qi = f"(({row}) % {r.lq}u)"
    return (f"uint {name} = (({'b' if mb > 1 else '0u'} * {mh}u + {h if mh > 1 else '0u'}) * "
            f"{mq}u + {qi if mq > 1 else '0u'}) * LK_CAP;")


def emit_chunk_prologue(r: DecodeRequest, emit) -> None:
    """This workgroup's place (split, row block, batch row b, KV head g) and its keys: the
    live length LK (row b's ``len`` clamped into [0, Lk] when live; a selected row's
    logical length from its block table, ``select_table``), the split's keys: its first
    tile ``k0``, the end ``k1`` its clamps and validity tests use (its chunk's, or LK with
    ``interleave``), ``KSTEP`` (keys from one of its tiles to the next: the tile, or with
    ``interleave`` the active splits' tiles) and its step count ``nit``; with the fused
    combine ``nact`` (splits holding a key) and the early exit of the splits past it.
    Shared by the scalar and the matrix kernels."""
    R = r.rows_per_wg
    emit("uint LK_CAP = pc.lk;  // one kernel serves every length")
    emit(f"uint wg = {group_id(r.grid[0])};")
    emit(f"if (wg >= {r.workgroups}u) return;  // uniform over the workgroup")
    emit(f"uint split = wg % {r.splits}u;")
    emit(f"uint rest = wg / {r.splits}u;")
    emit(f"uint rbase = (rest % {r.row_blocks}u) * {R}u;  // first row of this block")
    emit(f"uint bg = rest / {r.row_blocks}u;  // b * HKV + g")
    emit(f"uint g = bg % {r.hkv}u;")
    emit(f"uint b = bg / {r.hkv}u;")
    if r.select_block:
        # the query row: one per workgroup when Lq > 1 (rows_per_wg = 1), else row 0
        emit(f"uint srow = rbase % {r.lq}u;" if r.lq > 1 else "uint srow = 0u;")
        for line in select_table(r.select_block, r.select_k, r.select_heads, r.lq,
                                 "g" if r.select_heads > 1 else "0u"):
            emit(line)
    elif r.live_len:
        # row b's live length, clamped so no length reads outside the buffers; the grid
        # does not depend on it: a split past it gets an empty chunk (the neutral partial)
        emit("uint LK = uint(clamp(lens[b], 0, int(LK_CAP)));")
    else:
        emit("uint LK = LK_CAP;")
    if r.splits > 1:
        if r.fused_combine or not r.interleave:  # the chunk: nact's unit, or the keys
            emit(f"uint per = (LK + {r.splits - 1}u) / {r.splits}u;")
            emit(f"uint chunk = (per + {r.tile - 1}u) / {r.tile}u * {r.tile}u;")
        if r.min_chunk:
            minc = -(-r.min_chunk // r.tile) * r.tile
            emit(f"chunk = max(chunk, {minc}u);  // a short length runs on fewer splits")
        if r.fused_combine:
            # Splits past the length have nothing to read and nothing to add to the
            # combine (it folds the active ones only): they leave before any load. One
            # active split (a length of at most one chunk) writes the output itself.
            emit("uint nact = LK == 0u ? 1u : (LK + chunk - 1u) / chunk;  // splits with a key")
            emit("if (split >= nact) return;  // uniform over the workgroup")
        if r.interleave:
            # the active splits take the tiles in turn (DecodeRequest.interleave): split s
            # reads tiles s, s + n, s + 2n ... of [0, LK), n the active splits
            n = "nact" if r.fused_combine else f"{r.splits}u"
            emit(f"uint KSTEP = {n} * {r.tile}u;  // keys from one of its tiles to the next")
            emit(f"uint k0 = min(split * {r.tile}u, LK);")
            emit("uint k1 = LK;")
        else:
            emit(f"uint KSTEP = {r.tile}u;")
            emit("uint k0 = min(split * chunk, LK);")
            emit("uint k1 = min(k0 + chunk, LK);")
    else:
        emit(f"uint KSTEP = {r.tile}u;")
        emit("uint k0 = 0u;")
        emit("uint k1 = LK;")
    emit("uint nit = (k1 - k0 + KSTEP - 1u) / KSTEP;")


def select_shared(bs: int, k: int) -> list[str]:
    """A selected kernel's block table (K + 2 block ids, see ``select_table``), its logical
    length, and ``sel_row``: the physical key of logical key ``i`` (bs a constant, so a
    power of two is a shift and a mask)."""
    return [f"shared uint s_blk[{k + 2}];  // the row's valid selected blocks, then its own",
            "shared uint s_len;  // the row's logical key count",
            f"uint sel_row(uint i) {{ return s_blk[i / {bs}u] * {bs}u + i % {bs}u; }}"]


def select_table(bs: int, k: int, heads: int, lq: int, hs: str) -> list[str]:
    """Lines (unindented) that build a selected row's block table and set ``uint LK``, its
    logical length. Expects ``b``, ``srow`` (the query row), ``LK_CAP`` (Lk) and the bound
    ``ids`` [B, Hs, Lq, K] and ``qpos`` [B, Lq]; ``hs`` is the selection head.

    One lane reads the row's position p (clamped into [0, Lk - 1]: no read outside K/V for
    any input) and its K ids, keeps those in [0, own) with own = p / bs (the contract: the
    valid ids, ascending, then -1s; any other id is ignored), then fills the rest of the
    table with own: the K + 1 slots plus one more, so a logical index up to the length
    itself (a clamped read just past a chunk) still names one of the row's blocks. Then a
    barrier; every lane reads the length. Must run before any return that is not uniform
    over the workgroup."""
    return [
        "if (gl_LocalInvocationIndex == 0u) {  // the row's block table",
        f"    uint p = uint(clamp(qpos[b * {lq}u + srow], 0, int(LK_CAP) - 1));",
        f"    uint own = p / {bs}u;  // the row's unfinished block",
        f"    uint ib = ((b * {heads}u + {hs}) * {lq}u + srow) * {k}u;",
        "    uint n = 0u;",
        f"    for (uint c = 0u; c < {k}u; ++c) {{",
        "        int id = ids[ib + c];",
        "        if (id >= 0 && uint(id) < own) {  // a complete block before the row's own",
        "            s_blk[n] = uint(id);",
        "            n += 1u;",
        "        }",
        "    }",
        f"    for (uint c = n; c < {k + 2}u; ++c) s_blk[c] = own;",
        f"    s_len = n * {bs}u + (p - own * {bs}u) + 1u;  // its keys up to p",
        "}",
        "barrier();",
        "uint LK = s_len;  // the row's logical keys: the chunks are cut from these",
    ]


def emit_fused_combine(r: DecodeRequest, emit, lane: str) -> None:
    """The fused combine's tail of a split partial kernel (scalar and matrix alike): the
    last workgroup of a (batch row, KV head, row block) to arrive folds every split's
    partial. Expects ``nact``, ``rest``, ``bg``, ``rbase`` and the shared ``s_last``,
    ``s_cw``, ``s_cl``, ``s_cden``; ``lane`` is the invocation's index in the workgroup."""
    # The last workgroup of this (batch, KV head, row block) to finish combines every
    # split's partial (threadfence-reduction pattern: partials are coherent, each
    # workgroup orders its writes before its arrival, the last one resets the counter).
    emit("if (nact == 1u) return;  // written above: no partial to combine")
    emit("memoryBarrierBuffer();")
    emit("barrier();")
    emit("if (gl_LocalInvocationIndex == 0u) {")
    emit("uint prev = atomicAdd(counter[rest], 1u);", 2)
    emit("s_last = (prev == nact - 1u) ? 1u : 0u;  // the last active split", 2)
    emit("}")
    emit("barrier();")
    emit("if (s_last == 0u) return;")
    emit("memoryBarrierBuffer();")
    if r.combine_rounds == 1 and combine_in_one_round(r):
        _emit_combine_one_round(r, emit, lane)
    else:
        _emit_combine_two_rounds(r, emit, lane)
    emit("if (gl_LocalInvocationIndex == 0u) counter[rest] = 0u;  // ready for the next replay")


def _emit_combine_two_rounds(r: DecodeRequest, emit, lane: str) -> None:
    """The fused combine through workgroup memory (``s_cw``, ``s_cl``, ``s_cden``)."""
    R, WG = r.rows_per_wg, r.local_size
    # Each (row, split)'s max and sum are read once into workgroup memory, each row's
    # weights exp(m_u - M) and denominator computed once, then every output element
    # sums its splits' accumulators with them: one global load per (element, split)
    # and no dependent chain of loads per element (H200, (1,32,8,4096) F32: the
    # per-element loops cost the fused combine ~6 us over the partial).
    emit(f"for (uint id = {lane}; id < {R}u * nact; id += {WG}u) {{")
    emit("uint rr = id / nact;", 2)
    emit("uint u = id % nact;", 2)
    emit(f"uint pb = (bg * {r.group_rows}u + rbase + rr) * {r.splits * (r.dv + 2)}u"
         f" + u * {r.dv + 2}u;", 2)
    emit(f"s_cw[rr * {r.splits}u + u] = part[pb + {r.dv}u];", 2)
    emit(f"s_cl[rr * {r.splits}u + u] = part[pb + {r.dv + 1}u];", 2)
    emit("}")
    emit("barrier();")
    emit(f"if ({lane} < {R}u) {{")
    emit(f"uint cb = {lane} * {r.splits}u;", 2)
    emit("float M = NEG_INF;", 2)
    emit("for (uint u = 0u; u < nact; ++u) M = max(M, s_cw[cb + u]);", 2)
    emit("float den = 0.0;", 2)
    emit("for (uint u = 0u; u < nact; ++u) {", 2)
    emit("float mu = s_cw[cb + u];", 3)
    emit("float w = (mu == NEG_INF) ? 0.0 : exp(mu - M);", 3)
    emit("float lp = s_cl[cb + u];", 3)
    emit("den += isnan(lp) ? lp : w * lp;", 3)
    emit("s_cw[cb + u] = w;", 3)
    emit("}", 2)
    emit(f"s_cden[{lane}] = den;", 2)
    emit("}")
    emit("barrier();")
    emit(f"for (uint id = {lane}; id < {R * r.dv}u; id += {WG}u) {{")
    emit(f"uint rr = id / {r.dv}u;", 2)
    emit(f"uint orow = bg * {r.group_rows}u + rbase + rr;", 2)
    emit(f"uint c = id % {r.dv}u;", 2)
    emit(f"uint base = orow * {r.splits * (r.dv + 2)}u + c;", 2)
    emit(f"uint cb = rr * {r.splits}u;", 2)
    # Every split's word is loaded before any is used (SPLITS named loads, the index
    # clamped to an active split, whose partial was written): a loop over the run-time nact
    # made each load wait for the previous one, ~4 us of L2 latencies at 16 splits for the
    # last workgroup (H200, bench/decode_timeline.py). Inactive splits add nothing (a
    # select, so their duplicate word cannot turn an inf into NaN).
    for u in range(r.splits):
        emit(f"float x{u} = part[base + min({u}u, nact - 1u) * {r.dv + 2}u];", 2)
    emit("float acc = 0.0;", 2)
    for u in range(r.splits):
        emit(f"acc += {u}u < nact ? s_cw[cb + {u}u] * x{u} : 0.0;", 2)
    emit(f"dst[orow * {r.dv}u + c] = acc / s_cden[rr];  // no key seen: 0/0 = NaN", 2)
    emit("}")


#: most global loads a lane of the one-round combine keeps in flight (its registers)
COMBINE_ROUND_LOADS = 96


def combine_in_one_round(r: DecodeRequest) -> bool:
    """Whether the fused combine loads everything it needs at once: each lane serves one
    row (``_combine_lanes_per_row`` lanes a row) and issues its elements' SPLITS words,
    within COMBINE_ROUND_LOADS counted as when it also loaded its row's SPLITS maxima and
    sums (the bound the one-round form was measured under; it now loads at most one)."""
    lpr = _combine_lanes_per_row(r)
    return lpr > 0 and (r.dv // lpr + 2) * r.splits <= COMBINE_ROUND_LOADS


def _combine_lanes_per_row(r: DecodeRequest, width: int = 1) -> int:
    """Lanes of the one-round combine a row: the most of the workgroup's ``local_size /
    rows_per_wg`` that divide the row's ``Dv / width`` loads (the lanes past
    ``rows_per_wg`` of them idle); 0 when a row would not get one."""
    n = r.dv // width
    lpr = min(r.local_size // r.rows_per_wg, n)
    while lpr > 1 and n % lpr:
        lpr -= 1
    return lpr


def _emit_combine_one_round(r: DecodeRequest, emit, lane: str) -> None:
    """The fused combine in one round of global loads: every lane issues its elements'
    words of every split, and the first ``2 R SPLITS`` lanes one split's max or sum each,
    before any is used; the maxima and sums meet in workgroup memory behind one barrier,
    and each lane folds its words in registers with its row's weights.

    Why this form: the two-round form (maxima and sums through workgroup memory, then the
    words) waits on L2 twice behind barriers. H200, one run, fused, one round against two
    (bench/decode_probe.py --calls 10): (4,32,8,8192) 8 splits F16 49.0 us against 50.6,
    F32 70.3-70.4 against 71.5; (8,32,8,8192) 6 splits F16 77.7-78.0 against 79.0, F32
    129.7-129.8 against 130.8-132.1; (1,32,8,4096) F32 16 splits 15.2 against 15.7.
    Each lane loading its row's every max and sum itself (the form before this one, 2
    SPLITS more loads a lane) made the last workgroup's combine 4.0 us of a (1,32,8,32768)
    F16 launch at 16 splits (the cut after the arrival's atomic 40.6 us, the whole kernel
    44.6); the tail grew with the loads a lane issues (4 splits' loads: 41.4). Where Dv is
    even the words load two channels at a time through the alias ``part2`` (a partial is
    Dv + 2 floats, so each starts at an even float): (1,32,8,32768) F16 41.9 us against
    42.1, F32 70.4 against 70.6, one call. Splits past ``nact`` are clamped to an active
    one's words (written) and weigh nothing (a select, so a duplicate inf cannot become
    NaN)."""
    R, WG, S, DV = r.rows_per_wg, r.local_size, r.splits, r.dv
    W = 2 if DV % 2 == 0 else 1  # channels a load (vec2 through the alias part2)
    T, src = ("vec2", "part2") if W == 2 else ("float", "part")
    lpr = _combine_lanes_per_row(r, W)
    E = DV // W // lpr  # loads a lane and split
    st = DV + 2
    emit("{  // names local to the combine")
    emit(f"uint crow = min({lane} / {lpr}u, {R - 1}u);  // the lane's row of the block", 2)
    emit(f"uint cc = {lane} % {lpr}u;  // its first {T}", 2)
    emit(f"uint cbase = (bg * {r.group_rows}u + rbase + crow) * {S * st // W}u + cc;", 2)
    for u in range(S):
        for j in range(E):
            emit(f"{T} x{j}_{u} = {src}[cbase + min({u}u, nact - 1u) * {st // W}u "
                 f"+ {j * lpr}u];", 2)  # a lane past the rows (crow clamped): unused
    # one max or sum a lane: (row, split, which) = id / 2S, id / 2 % S, id % 2
    emit(f"for (uint id = {lane}; id < {2 * R * S}u; id += {WG}u) {{", 2)
    emit(f"uint rr = id / {2 * S}u;", 3)
    emit(f"uint u = (id >> 1u) % {S}u;", 3)
    emit(f"float ml = part[(bg * {r.group_rows}u + rbase + rr) * {S * st}u "
         f"+ min(u, nact - 1u) * {st}u + {DV}u + (id & 1u)];", 3)
    emit(f"if ((id & 1u) == 0u) s_cw[rr * {S}u + u] = ml; else s_cl[rr * {S}u + u] = ml;", 3)
    emit("}", 2)
    emit("barrier();", 2)
    emit(f"if ({lane} < {R * lpr}u) {{" if R * lpr < WG else "{", 2)
    emit(f"uint cb = crow * {S}u;", 3)
    for u in range(S):
        emit(f"float m{u} = s_cw[cb + {u}u];", 3)
    emit("float M = NEG_INF;", 3)
    for u in range(S):
        emit(f"M = {u}u < nact ? max(M, m{u}) : M;", 3)
    emit("float den = 0.0;", 3)
    for u in range(S):
        emit(f"float w{u} = ({u}u < nact && m{u} != NEG_INF) ? exp(m{u} - M) : 0.0;", 3)
        emit(f"float l{u} = s_cl[cb + {u}u];", 3)
        emit(f"den += {u}u < nact ? (isnan(l{u}) ? l{u} : w{u} * l{u}) : 0.0;", 3)
    emit(f"uint orow = bg * {r.group_rows}u + rbase + crow;", 3)
    for j in range(E):
        emit(f"{T} acc{j} = {T}(0.0);", 3)
        for u in range(S):
            emit(f"acc{j} += {u}u < nact ? w{u} * x{j}_{u} : {T}(0.0);", 3)
        acc = [f"acc{j}.x", f"acc{j}.y"] if W == 2 else [f"acc{j}"]
        for e, a in enumerate(acc):  # no key seen: 0/0 = NaN
            emit(f"dst[orow * {DV}u + {W}u * (cc + {j * lpr}u) + {e}u] = {a} / den;", 3)
    emit("}", 2)
    emit("}")


def generate_decode_combine(r: DecodeRequest) -> str:
    """One invocation per output element: fold the splits' (o, m, l)."""
    S, DV = r.splits, r.dv
    return f"""#version 450
layout(local_size_x = 64) in;
// combine: {r.out_rows} rows, {S} splits, Dv={DV}
layout(std430, set = 0, binding = 0) readonly buffer B0 {{ float part[]; }};
layout(std430, set = 0, binding = 1) writeonly buffer B1 {{ float dst[]; }};
#define NEG_INF {NEG_INF}

void main() {{
    uint id = {group_id(r.combine_grid[0])} * 64u + gl_LocalInvocationID.x;
    if (id >= {r.combine_threads}u) return;
    uint row = id / {DV}u;
    uint c = id % {DV}u;
    uint base = row * {S * (DV + 2)}u;
    float M = NEG_INF;
    for (uint s = 0u; s < {S}u; ++s) M = max(M, part[base + s * {DV + 2}u + {DV}u]);
    float den = 0.0;
    float acc = 0.0;
    for (uint s = 0u; s < {S}u; ++s) {{
        uint pb = base + s * {DV + 2}u;
        float ms = part[pb + {DV}u];
        float w = (ms == NEG_INF) ? 0.0 : exp(ms - M);
        float lp = part[pb + {DV + 1}u];
        den += isnan(lp) ? lp : w * lp;  // a NaN score anywhere makes the row NaN
        acc += w * part[pb + c];
    }}
    dst[id] = acc / den;  // a row that saw no key: 0/0 = NaN
}}
"""


@generators.register(DecodeCombineRequest)
def _combine(r: DecodeCombineRequest) -> str:
    return generate_decode_combine(r.partial)


def generate_decode(r: DecodeRequest) -> list[str]:
    """The sources of the launches ``r`` needs, in order: [partial] or [partial, combine]."""
    out = [generate_decode_partial(r)]
    if r.launches == 2:
        out.append(generate_decode_combine(r))
    return out
