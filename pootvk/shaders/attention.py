"""The streaming attention kernel generator (decode and prefill are the same kernel).

One workgroup of ``lanes`` invocations per (batch row, query head, query row). Lane ``i``
walks keys i, i + lanes, ... and keeps its running (max m, denominator l, accumulator
o[dv]) in *workgroup* memory (``shared`` arrays indexed by lane: never a private array
indexed at run time). After one barrier the lanes fold their partials:

    M = max_i m_i,   out[c] = sum_i o_i[c] * exp(m_i - M) / sum_i l_i * exp(m_i - M)

A -inf score adds exactly zero weight (guarded, so -inf - -inf never makes a NaN), and a row
that sees no key at all yields 0/0 = NaN, as the oracle's softmax does.

Bindings: q, k, v, [mask], out. With ``vec == 4`` q/k/v/out are read as vec4.
"""

from __future__ import annotations

from ..plan.requests import AttentionRequest
from .common import buffer_block, float_lit, group_id, header


def generate_attention(r: AttentionRequest) -> str:
    w = r.vec
    t = "vec4" if w == 4 else "float"
    dk, dv = r.dk // w, r.dv // w
    neg_inf = float_lit(float("-inf"))
    binds = [
        buffer_block(0, "q", t, readonly=True),
        buffer_block(1, "k", t, readonly=True),
        buffer_block(2, "v", t, readonly=True),
    ]
    if r.mask is not None:
        binds.append(buffer_block(3, "mask", "float", readonly=True))
    binds.append(buffer_block(4 if r.mask is not None else 3, "o", t, readonly=False))

    score = [f"    s *= {float_lit(r.scale)};"]
    if r.softcap is not None:
        cap = float_lit(r.softcap)
        score.append(f"    s = {cap} * tanh(clamp(s / {cap}, -15.0, 15.0));")
    if r.mask is not None:
        mb, mh, mq = r.mask
        mrow = (
            f"(({'b' if mb > 1 else '0u'} * {mh}u + {'h' if mh > 1 else '0u'}) * {mq}u"
            f" + {'row' if mq > 1 else '0u'}) * {r.lk}u"
        )
        score.append(f"    s += mask[{mrow} + t];")
    dot = "dot(q[qb + d], k[kb + d])" if w == 4 else "q[qb + d] * k[kb + d]"
    score_code = "\n".join("    " + line for line in score)

    return (
        header(r.lanes)
        + "".join(binds)
        + f"""
const uint LANES = {r.lanes}u;
const uint DK = {dk}u;  // in units of {t}
const uint DV = {dv}u;
shared {t} s_acc[DV * LANES];  // [channel][lane]
shared float s_m[LANES];
shared float s_l[LANES];

void main() {{
    uint wg = {group_id(r.grid[0])};
    if (wg >= {r.workgroups}u) return;  // uniform over the workgroup: before any barrier
    uint row = wg % {r.lq}u;
    uint h = (wg / {r.lq}u) % {r.hq}u;
    uint b = wg / {r.lq * r.hq}u;
    uint g = h / {r.n_rep}u;
    uint lane = gl_LocalInvocationID.x;
    uint qb = ((b * {r.hq}u + h) * {r.lq}u + row) * DK;
    uint kbase = (b * {r.hkv}u + g) * {r.lk}u;
    const float NEG_INF = {neg_inf};

    for (uint c = 0u; c < DV; ++c) s_acc[c * LANES + lane] = {t}(0.0);
    float m = NEG_INF;
    float l = 0.0;
    for (uint t = lane; t < {r.lk}u; t += LANES) {{
        uint kb = (kbase + t) * DK;
        float s = 0.0;
        for (uint d = 0u; d < DK; ++d) s += {dot};
{score_code}
        if (s == NEG_INF) continue;  // zero weight
        float m_new = max(m, s);
        float rescale = (m == NEG_INF) ? 0.0 : exp(m - m_new);
        float p = exp(s - m_new);
        l = l * rescale + p;
        uint vb = (kbase + t) * DV;
        for (uint c = 0u; c < DV; ++c) {{
            s_acc[c * LANES + lane] = s_acc[c * LANES + lane] * rescale + p * v[vb + c];
        }}
        m = m_new;
    }}
    s_m[lane] = m;
    s_l[lane] = l;
    barrier();
    float mx = NEG_INF;
    for (uint i = 0u; i < LANES; ++i) mx = max(mx, s_m[i]);
    float den = 0.0;
    for (uint i = 0u; i < LANES; ++i) {{
        den += (s_m[i] == NEG_INF) ? 0.0 : s_l[i] * exp(s_m[i] - mx);
    }}
    uint ob = ((b * {r.hq}u + h) * {r.lq}u + row) * DV;
    for (uint c = lane; c < DV; c += LANES) {{
        {t} acc = {t}(0.0);
        for (uint i = 0u; i < LANES; ++i) {{
            float f = (s_m[i] == NEG_INF) ? 0.0 : exp(s_m[i] - mx);
            acc += s_acc[c * LANES + i] * f;
        }}
        o[ob + c] = acc / den;
    }}
}}
"""
    )


def generate_attention_coop(r: AttentionRequest) -> str:
    """The cooperative form: same lanes, same per-lane state, same key-to-lane assignment
    (key t belongs to lane t % lanes), but the loads are coalesced.

    Keys are staged ``tile`` at a time: K and V rows of consecutive keys are one contiguous
    block, copied into workgroup memory by all threads. Then ``group`` = lanes / tile
    threads work on each staged key: partial dots, a sum over the group (the same order in
    every thread of the group, so all see the same score), and each thread updates its
    share of the owning lane's accumulator. Owners within a tile are distinct, so no two
    groups touch the same state. Accumulators are laid out [lane][channel] here, so a
    group's vec4 updates are contiguous.
    """
    assert r.vec == 4 and r.tile > 0
    dk, dv, lanes, kt, g = r.dk // 4, r.dv // 4, r.lanes, r.tile, r.group
    neg_inf = float_lit(float("-inf"))
    binds = [
        buffer_block(0, "q", "vec4", readonly=True),
        buffer_block(1, "k", "vec4", readonly=True),
        buffer_block(2, "v", "vec4", readonly=True),
    ]
    if r.mask is not None:
        binds.append(buffer_block(3, "mask", "float", readonly=True))
    binds.append(buffer_block(4 if r.mask is not None else 3, "o", "vec4", readonly=False))
    score = [f"s *= {float_lit(r.scale)};"]
    if r.softcap is not None:
        cap = float_lit(r.softcap)
        score.append(f"s = {cap} * tanh(clamp(s / {cap}, -15.0, 15.0));")
    if r.mask is not None:
        mb, mh, mq = r.mask
        mrow = (
            f"(({'b' if mb > 1 else '0u'} * {mh}u + {'h' if mh > 1 else '0u'}) * {mq}u"
            f" + {'row' if mq > 1 else '0u'}) * {r.lk}u"
        )
        score.append(f"if (t < LK) s += mask[{mrow} + t];")
    score_code = "\n".join("        " + line for line in score)
    return (
        header(lanes)
        + "".join(binds)
        + f"""
const uint LANES = {lanes}u;
const uint KT = {kt}u;     // keys staged per tile
const uint G = {g}u;       // threads per staged key
const uint DK = {dk}u;     // vec4 units
const uint DV = {dv}u;
const uint KS = {dk + 1}u; // padded row strides of the staged tiles
const uint VS = {dv + 1}u;
const uint LK = {r.lk}u;
shared vec4 s_acc[LANES * DV];  // [lane][channel]
shared float s_m[LANES];
shared float s_l[LANES];
shared vec4 s_k[KT * KS];
shared vec4 s_v[KT * VS];
shared float s_red[LANES];

void main() {{
    uint wg = {group_id(r.grid[0])};
    if (wg >= {r.workgroups}u) return;  // uniform over the workgroup: before any barrier
    uint row = wg % {r.lq}u;
    uint h = (wg / {r.lq}u) % {r.hq}u;
    uint b = wg / {r.lq * r.hq}u;
    uint tid = gl_LocalInvocationID.x;
    uint qb = ((b * {r.hq}u + h) * {r.lq}u + row) * DK;
    uint kbase = (b * {r.hkv}u + h / {r.n_rep}u) * LK;
    const float NEG_INF = {neg_inf};
    uint kr = tid / G;  // the staged key this thread works on
    uint kg = tid % G;  // its place in that key's group

    for (uint c = 0u; c < DV; ++c) s_acc[tid * DV + c] = vec4(0.0);
    s_m[tid] = NEG_INF;
    s_l[tid] = 0.0;
    for (uint t0 = 0u; t0 < LK; t0 += KT) {{
        uint n = min(KT, LK - t0);
        // rows of consecutive keys are one contiguous block: coalesced copies
        for (uint e = tid; e < n * DK; e += LANES) {{
            s_k[(e / DK) * KS + e % DK] = k[(kbase + t0) * DK + e];
        }}
        for (uint e = tid; e < n * DV; e += LANES) {{
            s_v[(e / DV) * VS + e % DV] = v[(kbase + t0) * DV + e];
        }}
        barrier();
        float part = 0.0;
        if (kr < n) {{
            for (uint c = kg; c < DK; c += G) part += dot(q[qb + c], s_k[kr * KS + c]);
        }}
        s_red[tid] = part;
        barrier();
        uint t = t0 + kr;
        float s = 0.0;
        for (uint i = 0u; i < G; ++i) s += s_red[kr * G + i];
{score_code}
        uint owner = t % LANES;
        bool live = kr < n && s != NEG_INF;  // a -inf score adds zero weight
        float m_old = s_m[owner];
        float m_new = live ? max(m_old, s) : m_old;
        float rescale = (m_old == NEG_INF) ? 0.0 : exp(m_old - m_new);
        float p = live ? exp(s - m_new) : 0.0;
        if (live) {{
            for (uint c = kg; c < DV; c += G) {{
                s_acc[owner * DV + c] = s_acc[owner * DV + c] * rescale + p * s_v[kr * VS + c];
            }}
        }}
        float l_new = s_l[owner] * rescale + p;
        barrier();  // every thread of the group has read m_old before it changes
        if (live && kg == 0u) {{
            s_m[owner] = m_new;
            s_l[owner] = l_new;
        }}
    }}
    barrier();
    float mx = NEG_INF;
    for (uint i = 0u; i < LANES; ++i) mx = max(mx, s_m[i]);
    float den = 0.0;
    for (uint i = 0u; i < LANES; ++i) {{
        den += (s_m[i] == NEG_INF) ? 0.0 : s_l[i] * exp(s_m[i] - mx);
    }}
    uint ob = ((b * {r.hq}u + h) * {r.lq}u + row) * DV;
    for (uint c = tid; c < DV; c += LANES) {{
        vec4 acc = vec4(0.0);
        for (uint i = 0u; i < LANES; ++i) {{
            float f = (s_m[i] == NEG_INF) ? 0.0 : exp(s_m[i] - mx);
            acc += s_acc[i * DV + c] * f;
        }}
        o[ob + c] = acc / den;
    }}
}}
"""
    )
