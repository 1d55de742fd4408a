"""The streaming attention kernel generator (decode and prefill are the same kernel).

One workgroup of ``lanes`` invocations per (batch row, query head, query row). Lane ``i``
walks keys i, i + lanes, ... and keeps its running (max m, denominator l, accumulator
o[dv]) in *workgroup* memory (``shared`` arrays indexed by lane: never a private array
indexed at run time). After one barrier the lanes fold their partials:

    M = max_i m_i,   out[c] = sum_i o_i[c] * exp(m_i - M) / sum_i l_i * exp(m_i - M)

A -inf score adds exactly zero weight (guarded, so -inf - -inf never makes a NaN), and a row
that sees no key at all yields 0/0 = NaN, as the oracle's softmax does.

A lane takes ``keys_per_step`` of its keys per loop step (t, t + lanes, ...): their loads
are all in flight together and the accumulator is rescaled once per step, not per key. The
key-to-lane assignment and the order each lane sees its keys are unchanged.

Loops over the head dimension stay loops (``[[dont_unroll]]``): with them unrolled, the
first call at D=128 took 40 s on lavapipe from Mesa 25.0.7 (3.5 s on Mesa 22.3); rolled,
2.1 s and 0.45 s, and the rolled kernel ran 1.2-2.8x faster on lavapipe (BENCHMARKS.md).
The key count Lk is a push constant, so one SPIR-V module and one driver pipeline serve
every length.

With ``live`` the request binds ``len`` (I32 [B]): row b's loop visits keys
``t < clamp(len[b], 0, Lk)`` only (``live_bound``); Lk stays the K/V row stride, and the
grid and recording do not depend on the length.

A paged key (``pool_slots`` S > 0): k and v are pools [S, Hkv, D] and a lane reads key t's
slot from ``read`` (i32 [B, Lk]) once per key, clamped into [0, S): its K/V rows are pool row
``read[b, t] * Hkv + g``. Nothing else changes (the mask and the live length index the
logical t); S is a second push constant.

Selected keys (``select_block`` = bs > 0, SelectedAttention): the workgroup first builds its
row's block table in workgroup memory (``attention_decode.select_table``: one lane, a
barrier), then runs the live-length loop over the row's logical keys, logical key t read at
physical key ``sel_row(t)`` (``s_blk[t / bs] * bs + t % bs``) of its KV head: no key the row
does not see is ever read. ``ids`` and ``qpos`` are bound after v.

Bindings: the request's ``bindings()`` (q, k, [k_shared], v, [ids, qpos], [mask], [len],
[read], o); with
``vec == 4`` q/k/v/o are read as vec4. A split key (``dk_shared = s``) scores each key
against k's own ``Dk - s`` channels and then the batch row's k_shared row (one for every
head): the broadcast key is never built. The kernel is composed of named parts that later
schedules reuse: bindings, indexing (which rows a workgroup owns), the score transform
(scale, softcap, mask), the online update (running max, denominator, accumulator), the fold
across lanes, and the epilogue (normalise and store).
"""

from __future__ import annotations

from ..plan.requests import AttentionRequest
from .attention_decode import select_shared, select_table
from .common import declare_bindings, float_lit, group_id, header
from .table import generators

NEG_INF = float_lit(float("-inf"))


def _vec(r: AttentionRequest) -> str:
    return "vec4" if r.vec == 4 else "float"


def bindings_part(r: AttentionRequest) -> str:
    t = _vec(r)
    return declare_bindings(r.bindings(), {"q": t, "k": t, "k_shared": t, "v": t, "o": t})


def indexing_part(r: AttentionRequest) -> str:
    """Which (batch, head, query row) this workgroup owns, and where its q, k/v rows start
    (a split key's k_shared rows: those of the batch row, the same for every head; a paged
    key's read words: those of the batch row, its K/V rows found through them)."""
    rows = f"    uint kbase = (b * {r.hkv}u + g) * LK_CAP;\n"
    if r.dk_shared:
        rows += "    uint ksbase = b * LK_CAP;\n"
    if r.paged:
        rows = ("    uint rbase = b * LK_CAP;  // row b's read words (the pool slots)\n"
                "    int SLOT_MAX = int(pc.slots) - 1;\n")
    return f"""    uint wg = {group_id(r.grid[0])};
    if (wg >= {r.workgroups}u) return;  // uniform over the workgroup: before any barrier
    uint row = wg % {r.lq}u;
    uint h = (wg / {r.lq}u) % {r.hq}u;
    uint b = wg / {r.lq * r.hq}u;
    uint g = h / {r.n_rep}u;
    uint lane = gl_LocalInvocationID.x;
    uint qb = ((b * {r.hq}u + h) * {r.lq}u + row) * DK;
{rows}"""


def score_transform(r: AttentionRequest, s: str, t: str, indent: str = "        ") -> list[str]:
    """Scale, softcap, then the additive mask, applied to score ``s`` of key index ``t``."""
    lines = [f"{s} *= {float_lit(r.scale)};"]
    if r.softcap is not None:
        cap = float_lit(r.softcap)
        lines.append(f"{s} = {cap} * tanh(clamp({s} / {cap}, -15.0, 15.0));")
    if r.mask is not None:
        mb, mh, mq = r.mask
        mrow = (
            f"(({'b' if mb > 1 else '0u'} * {mh}u + {'h' if mh > 1 else '0u'}) * {mq}u"
            f" + {'row' if mq > 1 else '0u'}) * LK_CAP"
        )
        lines.append(f"{s} += mask[{mrow} + {t}];")
    return [indent + x for x in lines]


def live_bound(r: AttentionRequest) -> str:
    """``LK``, the keys this row visits: all of them, or with a live length ``len[b]``
    clamped into 0..=Lk (no length reads outside the buffers; the grid never changes); a
    selected row's logical key count, from the block table built here."""
    if r.select_block:
        hs = "g" if r.select_heads > 1 else "0u"
        lines = ["uint srow = row;",
                 *select_table(r.select_block, r.select_k, r.select_heads, r.lq, hs)]
        return "".join(f"    {x}\n" for x in lines)
    if r.live:
        return "    uint LK = uint(clamp(len[b], 0, int(LK_CAP)));\n"
    return "    uint LK = LK_CAP;\n"


def online_update(r: AttentionRequest) -> str:
    """One loop step of a lane: ``keys_per_step`` keys' scores, then one rescale of the
    running (m, l, acc) and the accumulation of their value rows."""
    t = _vec(r)
    keys = range(r.keys_per_step)
    def dot(buf: str, j: int) -> str:
        return f"dot(qd, {buf}[{buf}b{j} + d])" if r.vec == 4 else f"qd * {buf}[{buf}b{j} + d]"

    body = []
    for j in keys:
        if j:
            body.append(f"        uint t{j} = t + {j}u * LANES;")
            body.append(f"        bool ok{j} = t{j} < LK;")
            body.append(f"        if (!ok{j}) t{j} = t;")
        else:
            body.append("        uint t0 = t;")
        if r.paged:  # the key's pool row: its slot (clamped into the pool) * Hkv + g
            body.append(f"        uint kr{j} = uint(clamp(read[rbase + t{j}], 0, SLOT_MAX))"
                        f" * {r.hkv}u + g;")
            body.append(f"        uint kb{j} = kr{j} * DKN;")
        elif r.select_block:  # a selected key: its physical row through the block table
            body.append(f"        uint kr{j} = kbase + sel_row(t{j});")
            body.append(f"        uint kb{j} = kr{j} * DKN;")
        else:
            body.append(f"        uint kb{j} = (kbase + t{j}) * DKN;")
        if r.dk_shared:  # the batch row's shared key part, at the same physical key
            row = f"sel_row(t{j})" if r.select_block else f"t{j}"
            body.append(f"        uint k_sharedb{j} = (ksbase + {row}) * DKS;")
        body.append(f"        float s{j} = 0.0;")
    # the key's own channels from k, then (split key) the shared ones from k_shared: the
    # broadcast key is never built
    body.append("        [[dont_unroll]] for (uint d = 0u; d < DKN; ++d) {")
    body.append("            " + t + " qd = q[qb + d];")
    for j in keys:
        body.append(f"            s{j} += {dot('k', j)};")
    body.append("        }")
    if r.dk_shared:
        body.append("        [[dont_unroll]] for (uint d = 0u; d < DKS; ++d) {")
        body.append("            " + t + " qd = q[qb + DKN + d];")
        for j in keys:
            body.append(f"            s{j} += {dot('k_shared', j)};")
        body.append("        }")
    for j in keys:
        body += score_transform(r, f"s{j}", f"t{j}")
        if j:  # a key past the end adds zero weight (its reads were clamped to a valid row)
            body.append(f"        if (!ok{j}) s{j} = NEG_INF;")
    smax = "s0"
    for j in keys[1:]:
        smax = f"max({smax}, s{j})"
    # No skip of all -inf steps: as in the oracle's matmul, a masked key's value row is
    # multiplied by its zero weight (so a NaN there reaches the row); a NaN score makes p
    # and l NaN even when GLSL's max drops it from m.
    body.append(f"        float sm = {smax};")
    body.append("        float m_new = max(m, sm);")
    body.append("        float rescale = (m == NEG_INF) ? 0.0 : exp(m - m_new);")
    for j in keys:
        body.append(f"        float p{j} = (s{j} == NEG_INF) ? 0.0 : exp(s{j} - m_new);")
        body.append(f"        uint vb{j} = kr{j} * DV;" if r.paged or r.select_block
                    else f"        uint vb{j} = (kbase + t{j}) * DV;")
    body.append("        l = l * rescale" + "".join(f" + p{j}" for j in keys) + ";")
    # a key past the end read a clamped row: it adds nothing, even if that row holds inf
    upd = "".join(
        f" + p{j} * v[vb{j} + c]" if j == 0 else f" + (ok{j} ? p{j} * v[vb{j} + c] : {t}(0.0))"
        for j in keys
    )
    body.append("        [[dont_unroll]] for (uint c = 0u; c < DV; ++c) {")
    body.append(f"            s_acc[c * LANES + lane] = s_acc[c * LANES + lane] * rescale{upd};")
    body.append("        }")
    body.append("        m = m_new;")
    loop = "\n".join(body)
    return f"""    for (uint c = 0u; c < DV; ++c) s_acc[c * LANES + lane] = {t}(0.0);
    float m = NEG_INF;
    float l = 0.0;
    for (uint t = lane; t < LK; t += {r.keys_per_step}u * LANES) {{
{loop}
    }}
"""


def fold_part(r: AttentionRequest) -> str:
    """The lanes' partials to one (M, den): M = max m_i, den = sum l_i exp(m_i - M); a lane
    whose l is NaN (it saw a NaN score) makes den, hence the row, NaN even if its m is -inf."""
    return """    s_m[lane] = m;
    s_l[lane] = l;
    barrier();
    float mx = NEG_INF;
    for (uint i = 0u; i < LANES; ++i) mx = max(mx, s_m[i]);
    float den = 0.0;
    for (uint i = 0u; i < LANES; ++i) {
        float li = s_l[i];
        den += isnan(li) ? li : (s_m[i] == NEG_INF) ? 0.0 : li * exp(s_m[i] - mx);
    }
"""


def epilogue(r: AttentionRequest) -> str:
    """out[c] = sum_i acc_i[c] exp(m_i - M) / den; a row that saw no key is 0/0 = NaN."""
    t = _vec(r)
    return f"""    uint ob = ((b * {r.hq}u + h) * {r.lq}u + row) * DV;
    for (uint c = lane; c < DV; c += LANES) {{
        {t} acc = {t}(0.0);
        for (uint i = 0u; i < LANES; ++i) {{
            float f = (s_m[i] == NEG_INF) ? 0.0 : exp(s_m[i] - mx);
            acc += s_acc[c * LANES + i] * f;
        }}
        o[ob + c] = acc / den;
    }}
"""


def push_part(r: AttentionRequest) -> str:
    """The push constants: the key count (and a paged key's pool slots), so one kernel
    serves every length and pool size."""
    if r.paged:
        return "\nlayout(push_constant) uniform Push { uint lk; uint slots; } pc;  // keys, slots"
    return ("\nlayout(push_constant) uniform Push { uint lk; } pc;  "
            "// keys: one kernel, every length")


@generators.register(AttentionRequest)
def generate_attention(r: AttentionRequest) -> str:
    t = _vec(r)
    sel = "".join(x + "\n" for x in select_shared(r.select_block, r.select_k)) \
        if r.select_block else ""
    return (
        header(r.lanes)
        + "#extension GL_EXT_control_flow_attributes : require\n"
        + bindings_part(r)
        + push_part(r)
        + f"""
const uint LANES = {r.lanes}u;
const uint DK = {r.dk // r.vec}u;  // in units of {t}
const uint DKN = {(r.dk - r.dk_shared) // r.vec}u;  // k's own row width
"""
        + (f"const uint DKS = {r.dk_shared // r.vec}u;  // k_shared's row width\n"
           if r.dk_shared else "")
        + f"""const uint DV = {r.dv // r.vec}u;
shared {t} s_acc[DV * LANES];  // [channel][lane]
shared float s_m[LANES];
shared float s_l[LANES];
{sel}
void main() {{
    const float NEG_INF = {NEG_INF};  // a bit pattern: not a constant expression globally
    uint LK_CAP = pc.lk;  // the K/V row stride
"""
        + indexing_part(r)
        + live_bound(r)
        + online_update(r)
        + fold_part(r)
        + epilogue(r)
        + "}\n"
    )
