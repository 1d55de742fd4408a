"""GLSL for the register-fed tensor-core decode kernel (``DecodeRequest.matrix`` = 16 with
``matrix_feed`` = "registers"): cooperative matrices filled element by element from K/V
words loaded with plain 16-byte loads, no workgroup-memory staging in the key loop.

Why: with 16-bit K/V and a GQA group of several query rows the scalar kernel does F32 FMAs
per 16-bit element per row (4 rows: ~2 FMAs a byte) and is latency- and issue-bound at 8
warps an SM; under the H200's 700 W cap that ALU work also costs clock. The staged matrix
kernel removes the FMAs but pays workgroup barriers and a copy per tile, and a matrix load
straight from a buffer costs a memory latency on NVIDIA's driver
(``bench/coopmat_load_probe.py``). Here every lane issues 16-byte loads a step ahead, as the
scalar kernel does, and writes the words into the matrix elements it owns.

That needs the element layout, which VK_KHR_cooperative_matrix leaves to the
implementation. This kernel is written for the layout NVIDIA's driver uses for 16x16x16 f16
(the mma.m16n8k16 fragments), lane ``l`` = 4 ``lr`` + ``lc``:

- A (16 x 16, row-major) element i: row ``lr + 8 (i >> 2)``, column
  ``2 lc + (i & 1) + 8 ((i >> 1) & 1)``;
- B (16 x 16) element i: row ``2 lc + (i & 1) + 8 ((i >> 1) & 1)``, column ``lr + 8 (i >> 2)``;
- the f32 accumulator: as A.

``pootvk.vk.coopmat_layout.probe_coopmat_layout`` reads it back from the device (a matrix of known
elements loaded, every lane's elements written out); the planner takes this kernel only
where the device's profile records ``coopmat_layout`` = "nv_mma" (``REGFED_LAYOUT``).

Within that layout the order of a dot product's channels is free, so the channels are
permuted to make each lane's elements whole 16-byte words of memory, and the lanes that
load together read contiguous bytes (a lane's words are interleaved with its neighbours',
not adjacent: each load instruction of a subgroup then touches half as many 32-byte
sectors, every one in full; H200, one call: (1,32,8,32768) F16 45.2 us against 45.7,
(8,32,8,8192) 71.1 against 71.9, (32,32,8,2048) 69.5 against 70.1):

- scores ``S[16 rows, 16 keys] = Q[16, Dk] K^T`` per 16-key block: K is the B operand (its
  column is the key: lane ``(lr, lc)`` holds keys ``lr`` and ``lr + 8``); k-tile ``j``'s
  slot ``s`` holds channel ``32 (o >> 3) + 8 lc(s) + (o & 7)`` with ``o = 4 j + e(s)``, so
  a lane's ``Dk / 32`` 16-byte words of one key are words ``lc + 4 w`` of the row: the 4
  lanes of a key read 64 contiguous bytes a load;
- ``O[16 rows, Dv] += P[16, 16 keys] V`` per 16-column tile ``j``: V is the B operand (its
  row is the key slot: lane ``(lr, lc)`` holds keys ``2 lc + {0, 1, 8, 9}``); column ``n``
  of tile ``j`` is channel ``64 (j >> 2) + 8 (n & 7) + 2 (j & 3) + (n >> 3)``, so a lane's
  ``Dv / 64`` words of one key are words ``lr + 8 w``: the 8 lanes of a key read 128
  contiguous bytes a load;
- the scores' accumulator layout equals P's A layout element for element (row ``lr``, keys
  ``2 lc + {0, 1, 8, 9}``), so P is the f16 of the lane's own softmax weights.

Query rows are the matrix rows (``R`` <= 16 of 16; lanes of rows past R compute zeros that
are never stored). The softmax runs on the 4 scores a lane holds per row, its max over the
4 lanes of a row by two xor shuffles; each row's sum is kept per lane and summed at the
end. Keys past the chunk (or the live length) score -inf, and every read is clamped to the
chunk's last key, so a NaN stored past a live length never reaches a product (0 x NaN
would) and no read leaves the buffers; a block wholly inside the chunk reads from one base
address per operand, unclamped.

One workgroup per (batch row, KV head, row block, split), ``NSG`` subgroups each taking one
16-key block of a ``16 NSG``-key step; with ``prefetch`` the next block's words are loaded
while a step computes. At the end the subgroups' (m, l, O) fold through workgroup memory
(all at once where ``regfed_fold_slots`` gives every subgroup a slot, else in log2(NSG)
rounds), then the output (or the split's partial and the scalar kernel's fused combine,
``emit_fused_combine``).
"""

from __future__ import annotations

from ..plan.decode_schedule import (
    DecodeRequest,
    check_request,
    regfed_fold_slots,
    regfed_fold_stride,
)
from .attention_decode import decode_bindings, emit_fused_combine, mask_row
from .attention_decode_staged import (
    A16,
    ACC,
    B16,
    emit_matrix_prologue,
    fused_combine_shared,
    matrix_shader,
    x4,
)

#: Key offsets (within a 16-key block) of a lane's four scores of one row and of its four
#: V rows, from ``lc``: 2 lc + KOFF[e]. The same e indexes both.
KOFF = (0, 1, 8, 9)


def generate_decode_regfed(r: DecodeRequest) -> str:
    check_request(r)
    WG = r.local_size
    NSG = WG // 32
    R, DK, DV, GR = r.rows_per_wg, r.dk, r.dv, r.group_rows
    DKT, DT = DK // 16, DV // 16
    KW, VW = DK // 32, DV // 64  # 16-byte words a lane loads per key (K, V)
    RH = 1 if R <= 8 else 2  # row halves: rows lr (elements 0..3), lr + 8 (4..7)
    split = r.splits > 1
    fused = split and r.fused_combine
    pf = r.prefetch

    binds = decode_bindings(r, "vec4", "uvec4", "float")
    pdst = "part" if fused else "dst"
    shared = [f"shared float sM[{x4(NSG * R)}];", f"shared float sL[{x4(NSG * R)}];",
              "shared uvec4 s_last4;", "#define s_last s_last4.x"]
    SLOTS = regfed_fold_slots(NSG, R, DV)
    FLAT = SLOTS == NSG  # else a tree of log2(NSG) rounds through NSG / 2 slots
    RS = regfed_fold_stride(DV)  # a slot row: Dv floats, one pad word per 16 channels
    if SLOTS:
        shared.append(f"shared float sO[{SLOTS * R * RS}];")
    if fused:
        shared += fused_combine_shared(r)

    L: list[str] = []

    def emit(s: str, ind: int = 1) -> None:
        L.append("    " * ind + s)

    emit_matrix_prologue(r, emit)
    emit("uint lr = ln >> 2u;  // the lane's matrix row (and B column)")
    emit("uint lc = ln & 3u;  // its column pair")
    # Reads clamp to the chunk's last key: a key past it (a NaN past a live length, or the
    # next step's prefetch past the end) reads a row of this chunk instead, finite, whose
    # weight is 0; so no V word needs zeroing before the product
    emit("uint KMAX = max(k1, 1u) - 1u;")

    def row(h: int) -> str:
        return f"(lr + {8 * h}u)" if h else "lr"

    # --- the query: pre-scaled, f16 hi (+ lo) parts, in A's layout ------------------------
    for h in range(RH):
        emit(f"bool real{h} = {row(h)} < {R}u;  // a query row of this block")
        emit(f"uint qrow{h} = (bg * {GR}u + rbase + min({row(h)}, {R - 1}u)) * {DK // 4}u "
             f"+ 2u * lc;")
        for j in range(DKT):  # channels 32 (j >> 1) + 8 lc + 4 (j & 1) + 0..3: kchan()
            emit(f"vec4 qx{h}_{j} = real{h} ? q[qrow{h} + {8 * (j >> 1) + (j & 1)}u] * SCALE "
                 f": vec4(0.0);")
    for j in range(DKT):
        emit(f"{A16} qh{j};")
        if r.q_split:
            emit(f"{A16} ql{j};")
        for i in range(8):
            h, e = i >> 2, i & 3
            if h >= RH:
                emit(f"qh{j}[{i}] = float16_t(0.0);")
                if r.q_split:
                    emit(f"ql{j}[{i}] = float16_t(0.0);")
                continue
            x = f"qx{h}_{j}.{'xyzw'[e]}"
            emit(f"qh{j}[{i}] = float16_t({x});")
            if r.q_split:
                emit(f"ql{j}[{i}] = float16_t({x} - float(float16_t({x})));  // f16's rest")
    for j in range(DT):
        emit(f"{ACC} o{j} = {ACC}(0.0);")
    for h in range(RH):
        emit(f"float m{h} = NEG_INF;")
        emit(f"float l{h} = 0.0;  // this lane's keys' share of the row's sum")
        if r.mask is not None:
            emit(mask_row(r, f"mrow{h}", f"rbase + min({row(h)}, {R - 1}u)"))

    def load(pre: str, kb: str, ind: int, decl: bool) -> None:
        """The 16-byte words of the 16-key block at ``kb`` that this lane's elements take."""
        if decl:
            names = [f"{pre}k{hk}_{w}" for hk in range(2) for w in range(KW)] + \
                    [f"{pre}v{c}_{w}" for c in range(4) for w in range(VW)]
            emit("uvec4 " + ", ".join(names) + ";", ind)
        # A block wholly inside the chunk reads from one base address per operand (the
        # rest immediate offsets); the last one clamps each row (one address a key: more
        # registers, so only where needed)
        emit(f"if ({kb} + 16u <= k1) {{  // uniform over the subgroup", ind)
        emit(f"uint kr = (kvrow + {kb} + lr) * {DK // 8}u + lc;", ind + 1)
        for hk in range(2):
            for w in range(KW):
                emit(f"{pre}k{hk}_{w} = k[kr + {8 * hk * DK // 8 + 4 * w}u];", ind + 1)
        emit(f"uint vr = (kvrow + {kb} + 2u * lc) * {DV // 8}u + lr;", ind + 1)
        for c, off in enumerate(KOFF):
            for w in range(VW):
                emit(f"{pre}v{c}_{w} = v[vr + {off * DV // 8 + 8 * w}u];", ind + 1)
        emit("} else {", ind)
        for hk in range(2):
            emit(f"{{ uint kr = (kvrow + min({kb} + lr + {8 * hk}u, KMAX)) * {DK // 8}u "
                 f"+ lc;", ind + 1)
            for w in range(KW):
                emit(f"  {pre}k{hk}_{w} = k[kr + {4 * w}u];", ind + 1)
            emit("}", ind + 1)
        for c, off in enumerate(KOFF):
            emit(f"{{ uint vr = (kvrow + min({kb} + 2u * lc + {off}u, KMAX)) * {DV // 8}u "
                 f"+ lr;", ind + 1)
            for w in range(VW):
                emit(f"  {pre}v{c}_{w} = v[vr + {8 * w}u];", ind + 1)
            emit("}", ind + 1)
        emit("}", ind)

    def body(ws: str, ind: int) -> None:
        """One step on the block at ``kb`` whose words are register set ``ws``."""
        for e, off in enumerate(KOFF):
            emit(f"bool ok{e} = kb + 2u * lc + {off}u < k1;  // a key of the split", ind)
        # 1. scores
        emit(f"{ACC} sc = {ACC}(0.0);", ind)
        for j in range(DKT):
            emit("{", ind)
            emit(f"{B16} kt;", ind + 1)
            for i in range(8):
                hk, e = i >> 2, i & 3
                o = 4 * j + e  # the element's offset among the lane's Dk / 4 channels of a key
                emit(f"kt[{i}] = unpackFloat2x16({ws}k{hk}_{o >> 3}.{'xyzw'[(o & 7) >> 1]})"
                     f".{'xy'[e & 1]};", ind + 1)
            emit(f"sc = coopMatMulAdd(qh{j}, kt, sc);", ind + 1)
            if r.q_split:
                emit(f"sc = coopMatMulAdd(ql{j}, kt, sc);", ind + 1)
            emit("}", ind)
        # 2. the online softmax of the lane's 4 scores per row
        emit(f"{A16} pm = {A16}(float16_t(0.0));", ind)
        for h in range(RH):
            for e, off in enumerate(KOFF):
                sv = f"s{h}{e}"
                emit(f"float {sv} = sc[{4 * h + e}];", ind)
                if r.softcap is not None:
                    emit(f"{sv} = SOFTCAP * tanh(clamp({sv} / SOFTCAP, -15.0, 15.0));", ind)
                if r.mask is not None:
                    emit(f"{sv} += mask[mrow{h} + min(kb + 2u * lc + {off}u, LK_CAP - 1u)];",
                         ind)
                emit(f"{sv} = ok{e} ? {sv} : NEG_INF;", ind)
            emit(f"float bm{h} = max(max(s{h}0, s{h}1), max(s{h}2, s{h}3));", ind)
            emit(f"bm{h} = max(bm{h}, subgroupShuffleXor(bm{h}, 1u));", ind)
            emit(f"bm{h} = max(bm{h}, subgroupShuffleXor(bm{h}, 2u));", ind)
            emit(f"float mn{h} = max(m{h}, bm{h});", ind)
            emit(f"float al{h} = (m{h} == NEG_INF) ? 0.0 : exp(m{h} - mn{h});", ind)
            for e in range(4):
                emit(f"float p{h}{e} = (s{h}{e} == NEG_INF) ? 0.0 : exp(s{h}{e} - mn{h});", ind)
                emit(f"pm[{4 * h + e}] = float16_t(p{h}{e});", ind)
            emit(f"l{h} = l{h} * al{h} + ((p{h}0 + p{h}1) + (p{h}2 + p{h}3));", ind)
            emit(f"m{h} = mn{h};", ind)
        # 3. O = O * al + P V
        for j in range(DT):
            emit("{", ind)
            emit(f"{B16} vt;", ind + 1)
            for i in range(8):
                c = (i & 1) + 2 * ((i >> 1) & 1)
                emit(f"vt[{i}] = unpackFloat2x16({ws}v{c}_{j >> 2}.{'xyzw'[j & 3]})"
                     f".{'xy'[i >> 2]};", ind + 1)
            for h in range(RH):
                for e in range(4):
                    emit(f"o{j}[{4 * h + e}] *= al{h};", ind + 1)
            emit(f"o{j} = coopMatMulAdd(pm, vt, o{j});", ind + 1)
            emit("}", ind)

    if pf:
        # the next block's words load into a second register set while this step computes,
        # then move over (unrolling twice into two sets without copies measured slower on
        # the H200: 147.8-165.3 us against 137.6 at (1,32,8,131072) F16, spilled registers)
        emit("uint kb = k0 + sg * 16u;  // this subgroup's first block")
        load("a", "kb", 1, True)
        if r.interleave:
            # Tiles in turn: each subgroup walks its own 16-key blocks until the first past
            # the keys (a block index stepped by KSTEP / 16), not the workgroup's step count.
            # H200, one call alternated against the step-count loop: (1,32,8,32768) F16
            # 41.74 -> 41.31 us, (8,32,8,8192) 70.35 -> 70.02, (1,32,8,131072) 129.2 -> 128.6
            emit("uint NB = (k1 + 15u) >> 4u;  // blocks holding a key")
            emit("uint tb = kb >> 4u;")
            emit("while (tb < NB) {  // uniform over the subgroup")
            emit("kb = tb * 16u;", 2)
        else:
            emit("for (uint it = 0u; it < nit; ++it) {")
            emit("kb = k0 + it * KSTEP + sg * 16u;", 2)
        load("n", "kb + KSTEP", 2, True)
        body("a", 2)
        for hk in range(2):
            for w in range(KW):
                emit(f"ak{hk}_{w} = nk{hk}_{w};", 2)
        for c in range(4):
            for w in range(VW):
                emit(f"av{c}_{w} = nv{c}_{w};", 2)
        if r.interleave:
            emit("tb += KSTEP >> 4u;", 2)
        emit("}")
    else:
        emit("for (uint it = 0u; it < nit; ++it) {")
        emit("uint kb = k0 + it * KSTEP + sg * 16u;", 2)
        load("a", "kb", 2, True)
        body("a", 2)
        emit("}")

    # --- the end: rows' sums over their 4 lanes, the subgroups folded, the output --------
    def cols(j: int, e: int) -> str:
        """Channel of accumulator tile j's element e (+ 4 h) in this lane."""
        return f"16u * lc + {8 * (e & 1) + 64 * (j >> 2) + 2 * (j & 3) + (e >> 1)}u"

    def padded(c: str) -> str:
        """Channel ``c``'s word in a fold slot's row (``regfed_fold_stride``: a pad word
        per 16 channels, so a store's lanes hit distinct banks)."""
        return f"({c}) + (({c}) >> 4u)"

    def each_row_element(slot: str, stmt: str, ind: int) -> None:
        """Per row half of a real query row: ``ob``, the row's place in fold slot ``slot``
        of sO, then ``stmt`` for each accumulator element ({o}: the element, {c}: its
        word in the row)."""
        for h in range(RH):
            emit(f"if (real{h}) {{", ind)
            emit(f"uint ob = ({slot} * {R}u + {row(h)}) * {RS}u;", ind + 1)
            for j in range(DT):
                for e in range(4):
                    emit(stmt.format(o=f"o{j}[{4 * h + e}]", c=padded(cols(j, e))), ind + 1)
            emit("}", ind)

    def emit_tree_fold() -> None:
        """Half of the subgroups hand their accumulators to the other half, log2(NSG) rounds;
        subgroup 0 writes the rows."""
        half = NSG // 2
        while half >= 1:
            emit(f"if (sg >= {half}u && sg < {2 * half}u) {{")
            each_row_element(f"(sg - {half}u)", "sO[ob + {c}] = {o};", 2)
            emit("}")
            emit("barrier();")
            emit(f"if (sg < {half}u) {{")
            each_row_element("sg", "{o} += sO[ob + {c}];", 2)
            emit("}")
            emit("barrier();")
            half //= 2
        emit("if (sg == 0u) {")
        for h in range(RH):
            emit(f"if (real{h}) {{", 2)
            emit(f"uint orow = bg * {GR}u + rbase + {row(h)};", 3)

            def put(base: str, div: str, ind: int, h: int = h) -> None:
                for j in range(DT):
                    for e in range(4):
                        emit(f"{base} + {cols(j, e)}] = o{j}[{4 * h + e}]{div};", ind)

            if split:
                if fused:
                    emit("if (nact == 1u) {  // the only split with keys: the output itself", 3)
                    put(f"dst[orow * {DV}u", f" / lt{h}", 4)
                    emit("} else {", 3)
                ind = 4 if fused else 3
                emit(f"uint pb = (orow * {r.splits}u + split) * {DV + 2}u;", ind)
                put(f"{pdst}[pb", "", ind)
                emit(f"if (lc == 0u) {{ {pdst}[pb + {DV}u] = M{h}; "
                     f"{pdst}[pb + {DV + 1}u] = lt{h}; }}", ind)
                if fused:
                    emit("}", 3)
            else:
                put(f"dst[orow * {DV}u", f" / lt{h}", 3)  # no key seen: 0/0 = NaN
            emit("}", 2)
        emit("}")

    for h in range(RH):
        emit(f"l{h} += subgroupShuffleXor(l{h}, 1u);")
        emit(f"l{h} += subgroupShuffleXor(l{h}, 2u);")
        emit(f"if (real{h} && lc == 0u) {{ sM[sg * {R}u + {row(h)}] = m{h}; "
             f"sL[sg * {R}u + {row(h)}] = l{h}; }}")
    emit("barrier();")
    for h in range(RH):
        rr = f"min({row(h)}, {R - 1}u)"
        emit(f"float M{h} = NEG_INF;")
        emit(f"for (uint s = 0u; s < {NSG}u; ++s) M{h} = max(M{h}, sM[s * {R}u + {rr}]);")
        emit(f"float lt{h} = 0.0;  // the row's sum over the workgroup")
        emit(f"for (uint s = 0u; s < {NSG}u; ++s) {{ float ms = sM[s * {R}u + {rr}]; "
             f"lt{h} += ms == NEG_INF ? 0.0 : sL[s * {R}u + {rr}] * exp(ms - M{h}); }}")
        emit(f"float w{h} = m{h} == NEG_INF ? 0.0 : exp(m{h} - M{h});  // this subgroup's weight")
        for j in range(DT):
            for e in range(4):
                emit(f"o{j}[{4 * h + e}] *= w{h};")
    if FLAT:
        # every subgroup's weighted accumulators at once, then the workgroup sums them
        # column by column (one barrier) and writes the rows with coalesced stores
        each_row_element("sg", "sO[ob + {c}] = {o};", 1)
        emit("barrier();")
        n = -(-R * DV // WG)
        emit(f"for (uint i = 0u; i < {n}u; ++i) {{")
        emit(f"uint x = lane + i * {WG}u;", 2)
        if (R * DV) % WG:
            emit(f"if (x >= {R * DV}u) break;", 2)
        emit(f"uint rr = x / {DV}u;", 2)
        emit(f"uint c = x % {DV}u;", 2)
        emit("float acc = 0.0;", 2)
        emit(f"uint xo = rr * {RS}u + {padded('c')};  // its word in a slot", 2)
        emit(f"for (uint s = 0u; s < {NSG}u; ++s) acc += sO[s * {R * RS}u + xo];", 2)
        emit("float M = NEG_INF;", 2)
        emit(f"for (uint s = 0u; s < {NSG}u; ++s) M = max(M, sM[s * {R}u + rr]);", 2)
        emit("float lt = 0.0;", 2)
        emit(f"for (uint s = 0u; s < {NSG}u; ++s) {{ float ms = sM[s * {R}u + rr]; "
             f"lt += ms == NEG_INF ? 0.0 : sL[s * {R}u + rr] * exp(ms - M); }}", 2)
        emit(f"uint orow = bg * {GR}u + rbase + rr;", 2)
        if split:
            if fused:
                emit("if (nact == 1u) { dst[orow * " + f"{DV}u + c] = acc / lt; continue; }}", 2)
            emit(f"uint pb = (orow * {r.splits}u + split) * {DV + 2}u;", 2)
            emit(f"{pdst}[pb + c] = acc;", 2)
            emit(f"if (c == 0u) {{ {pdst}[pb + {DV}u] = M; {pdst}[pb + {DV + 1}u] = lt; }}", 2)
        else:
            emit(f"dst[orow * {DV}u + c] = acc / lt;  // no key seen: 0/0 = NaN", 2)
        emit("}")
    else:
        emit_tree_fold()
    if fused:
        emit_fused_combine(r, emit, "lane")

    return matrix_shader(r, binds, shared, L)
