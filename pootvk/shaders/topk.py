"""GLSL for TopK and BlockTopK (``plan.topk.TopKRequest``): a radix selection per row.

One workgroup takes one row of the last axis (rows folded over a 2-D grid). Sorting a row
per thread would cost O(N log N) serial steps and a private array; instead the workgroup
*selects*:

1. Each value maps to an order-preserving 32-bit key: ``-0`` reads as ``+0`` and NaN maps
   to 1, below every number's key (``-inf`` is ``0x007fffff``), so comparing keys is
   comparing values in TopK's order, and equal keys are equal values. Key 0 is no value:
   a lane's slot past the row's end, or an ineligible block of BlockTopK (below all).
2. Up to four radix passes (8 bits each, most significant first) find the K-th largest
   key: the lanes histogram the digit of every key that matches the prefix found so far
   (shared atomics; a lane adds a run of equal digits at once), the bins' counts are
   summed from the top to find the bin holding the K-th key, and the count above it is
   taken off K. A bin that is taken whole ends the search.
3. The selection is every key above the threshold plus the ``need`` lowest-index keys equal
   to it. Each lane owns a contiguous chunk of the row and counts its (above, equal) keys;
   one workgroup prefix sum over the pair gives each lane its first output slot (the
   selected keys before its chunk: ``above_before + min(equal_before, need)``), and the
   lane writes its chosen indices there in ascending order: the output is ascending.

What keeps the chain short (a decode step waits on it):

- ``per_lane`` > 0 (rows up to 32 keys a lane): each lane reads its chunk once (16-byte
  loads where the row and chunk allow), before BlockTopK's position arrives, and keeps the
  keys as named registers ``k0, k1, ...``; the passes and the selection never touch memory
  again. Otherwise every pass re-reads the row from the buffer.
- Three histogram buffers in rotation: pass p counts into buffer p % 3 and clears buffer
  (p + 1) % 3 (last read two passes ago), so one barrier a pass (after the counting)
  orders everything.
- ``subgroup``: every subgroup finds the bin on its own from the histogram (lane s sums
  256 / size bins, a shuffle scan of the sums, a shuffle butterfly of (bins above, keys
  above) packed in one word) with no barrier at all, and the final prefix sum is a
  shuffle scan plus one barrier for the subgroups' totals. Without subgroups (the
  fallback, the same answers): a workgroup-memory scan of log2(lanes) barrier pairs, and
  the lane holding the bin publishes it through workgroup memory (one more barrier).

Barriers per row at 256 lanes with subgroups: 1 + passes + 1 (at most 6; 101 before).
"""

from __future__ import annotations

from ..ir import prims as P
from ..plan.topk import HIST_BUFFERS, HIST_WORDS, RADIX_BITS, TopKRequest
from .common import declare_bindings, group_id, header
from .prims import ROW_KERNELS
from .table import generators

#: TopK has a generator of its own (a workgroup per row), not an elementwise body
ROW_KERNELS[P.TOPK] = TopKRequest

BINS = 1 << RADIX_BITS
PASSES = 32 // RADIX_BITS

SUBGROUP_EXT = (
    "#extension GL_KHR_shader_subgroup_basic : require\n"
    "#extension GL_KHR_shader_subgroup_shuffle : require\n"
)

_KEYS = """
const uint KEY_NEG_INF = 0x007fffffu;  // -inf's key: the least number, above NaN's 1

// TopK's order as unsigned keys: NaN 1 (lowest but for 0: no value), -0 == +0, otherwise
// the value's order
uint order_key(uint u) {
    uint a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 1u;  // NaN (any sign or payload)
    if (a == 0u) return 0x80000000u;  // -0 reads as +0
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// the word of bin b of histogram buffer h: a pad word after every 32 bins
uint bin(uint h, uint b) { return h * HIST + b + (b >> 5); }
"""

_SHARED_SCAN = """
// exclusive prefix sum of v over the workgroup's lanes (every lane must call it)
uvec2 scan_lanes(uint lane, uvec2 v) {
    s_scan[lane] = v;
    barrier();
    for (uint off = 1u; off < LANES; off <<= 1) {
        uvec2 t = lane >= off ? s_scan[lane - off] : uvec2(0u);
        barrier();
        s_scan[lane] += t;
        barrier();
    }
    return s_scan[lane] - v;
}
"""

def _scan_fn(t: str) -> str:
    """An inclusive prefix sum of a ``t`` over the subgroup's lanes (shuffles)."""
    return (f"{t} sg_scan({t} v) {{\n"
            "    uint s = gl_SubgroupInvocationID;\n"
            "    for (uint off = 1u; off < SG; off <<= 1) {\n"
            f"        {t} t = subgroupShuffle(v, s - min(s, off));\n"
            "        if (s >= off) v += t;\n"
            "    }\n"
            "    return v;\n"
            "}\n")


_SUBGROUP_SCAN = ("\n// inclusive prefix sums over the subgroup's lanes (shuffles; every lane "
                  "must call them)\n" + _scan_fn("uint") + "\n" + _scan_fn("uvec2"))


def _sg_lanes_scan(subgroups: int) -> str:
    """The workgroup's exclusive prefix sum on subgroup scans (lanes numbered subgroup by
    subgroup), the subgroups' totals through workgroup memory: one barrier."""
    if subgroups == 1:
        return ("\n// exclusive prefix sum of v over the workgroup (one subgroup)\n"
                "uvec2 scan_lanes(uint sgid, uvec2 v) { return sg_scan(v) - v; }\n")
    return """
// exclusive prefix sum of v over the workgroup's lanes, subgroup by subgroup (every lane
// must call it, once: s_part is written once)
uvec2 scan_lanes(uint sgid, uvec2 v) {
    uvec2 inc = sg_scan(v);
    if (gl_SubgroupInvocationID == SG - 1u) s_part[sgid] = inc;
    barrier();
    for (uint s = 0u; s < sgid; ++s) inc += s_part[s];
    return inc - v;
}
"""


def _find_bin(sg: int, k: int) -> str:
    """The bin of the need-th largest key, from histogram buffer ``h``, by one subgroup
    alone (every subgroup computes the same answer): (digit, keys in the bins above). The
    lanes' (bins above, keys above) sum in one shuffle butterfly: packed in one word
    (9 bits of bins, the keys above < need <= K above them) where K < 2^23."""
    bps = BINS // sg
    lines = [
        "\n// the bin holding the need-th largest key and the keys above it, by each subgroup",
        "// alone (the same answer in every lane): lane s reads bins BPS*s.. from the top",
        "uvec2 find_bin(uint h, uint need) {",
        "    uint top = BINS - 1u - gl_SubgroupInvocationID * BPS;",
    ]
    lines += [f"    uint c{c} = s_hist[bin(h, top - {c}u)];" for c in range(bps)]
    lines += [
        "    uint tot = " + " + ".join(f"c{c}" for c in range(bps)) + ";",
        "    uint start = sg_scan(tot) - tot;  // keys in the bins above this lane's",
        "    uint cum = start, nb = 0u, kb = start;  // bins wholly above the need-th key",
    ]
    for c in range(bps):
        lines.append(f"    cum += c{c};")
        lines.append(f"    if (cum < need) {{ nb = {c + 1}u; kb = cum; }}")
    lines.append("    kb -= start;  // keys in this lane's bins wholly above")
    if k < 1 << 23:
        lines += [
            "    uint v = nb | (kb << 9);",
            "    for (uint off = 1u; off < SG; off <<= 1) v += subgroupShuffleXor(v, off);",
            "    return uvec2(BINS - 1u - (v & 511u), v >> 9);",
            "}",
        ]
    else:
        lines += [
            "    uvec2 v = uvec2(nb, kb);",
            "    for (uint off = 1u; off < SG; off <<= 1) v += subgroupShuffleXor(v, off);",
            "    return uvec2(BINS - 1u - v.x, v.y);",
            "}",
        ]
    return "\n".join(lines) + "\n"


def _count(key: str, ind: str) -> str:
    """Histogram one key (a run of equal digits goes in as one atomic)."""
    return (
        f"{ind}if (({key} & mask) == prefix) {{\n"
        f"{ind}    uint d = ({key} >> shift) & (BINS - 1u);\n"
        f"{ind}    if (d != last && run != 0u) {{ atomicAdd(s_hist[bin(h, last)], run); "
        "run = 0u; }\n"
        f"{ind}    last = d;\n"
        f"{ind}    run += 1u;\n"
        f"{ind}}}\n"
    )


def _shared_find(r: TopKRequest) -> str:
    """The bin by a workgroup-memory scan: lane l holds bins BPL*l.. from the top; the lane
    holding the need-th key publishes (digit, keys above) in this pass's slot."""
    bpl = max(1, BINS // r.lanes)
    guard = r.lanes * bpl > BINS  # lanes past the bins hold none
    out = ""
    for c in range(bpl):
        get = f"s_hist[bin(h, BINS - 1u - (lane * {bpl}u + {c}u))]"
        out += (f"        uint hv{c} = lane * {bpl}u + {c}u < BINS ? {get} : 0u;\n" if guard
                else f"        uint hv{c} = {get};\n")
    out += ("        uint above = scan_lanes(lane, uvec2("
            + " + ".join(f"hv{c}" for c in range(bpl)) + ", 0u)).x;\n")
    for c in range(bpl):
        out += (
            f"        if (above < need && need <= above + hv{c}) "
            f"s_sel[pass] = uvec2(BINS - 1u - (lane * {bpl}u + {c}u), above);\n"
            f"        above += hv{c};\n"
        )
    out += "        barrier();\n        uvec2 sel = s_sel[pass];\n"
    return out


def _load_registers(r: TopKRequest, key: str) -> tuple[str, str]:
    """(the raw loads of a lane's chunk, the keys made of them): named registers u0.., k0..
    (0: past the row, or BlockTopK's ineligible blocks at and past ``n``)."""
    e_n = r.per_lane
    full = r.lanes * e_n == r.n  # no lane's chunk runs past the row
    loads = ""
    if e_n % 4 == 0 and r.n % 4 == 0:  # 16-byte loads: rows and chunks start aligned
        for j in range(e_n // 4):
            ld = f"x[(base + first) / 4u + {j}u]"
            loads += (f"    uvec4 w{j} = {ld};\n" if full
                      else f"    uvec4 w{j} = first + {4 * j}u < N ? {ld} : uvec4(0u);\n")
        raw = [f"w{e // 4}.{'xyzw'[e % 4]}" for e in range(e_n)]
    else:
        for e in range(e_n):
            ld = f"x[base + first + {e}u]"
            loads += (f"    uint u{e} = {ld};\n" if full
                      else f"    uint u{e} = first + {e}u < N ? {ld} : 0u;\n")
        raw = [f"u{e}" for e in range(e_n)]
    keys = ""
    for e in range(e_n):
        k = key.replace("RAW", raw[e])
        keys += (f"    uint k{e} = {k};\n" if full and not r.masked
                 else f"    uint k{e} = first + {e}u < n ? {k} : 0u;\n")
    return loads, keys


def _compact_registers(r: TopKRequest) -> str:
    out = "    uint gt = 0u, eq = 0u;\n"
    for e in range(r.per_lane):
        out += (f"    gt += (k{e} & mask) > prefix ? 1u : 0u;\n"
                f"    eq += (k{e} & mask) == prefix ? 1u : 0u;\n")
    out += _slots(r)
    for e in range(r.per_lane):
        out += (
            f"    if ((k{e} & mask) > prefix || ((k{e} & mask) == prefix && tie < need)) {{\n"
            f"        y[row * K + slot] = int(first + {e}u);\n"
            "        slot += 1u;\n"
            "    }\n"
            f"    if ((k{e} & mask) == prefix) tie += 1u;\n"
        )
    return out


def _slots(r: TopKRequest) -> str:
    who = "sgid" if r.subgroup else "lane"
    return (
        f"    uvec2 before = scan_lanes({who}, uvec2(gt, eq));\n"
        "    uint tie = before.y;  // equal keys at lower indices\n"
        "    uint slot = before.x + min(tie, need);\n"
    )


def _compact_stream(r: TopKRequest, key: str) -> str:
    k = key.replace("RAW", "x[base + i]")
    return (
        "    uint chunk = (n + LANES - 1u) / LANES;\n"
        "    uint lo = min(lane * chunk, n), hi = min(lo + chunk, n);\n"
        "    uint gt = 0u, eq = 0u;\n"
        "    for (uint i = lo; i < hi; ++i) {\n"
        f"        uint km = ({k}) & mask;\n"
        "        gt += km > prefix ? 1u : 0u;\n"
        "        eq += km == prefix ? 1u : 0u;\n"
        "    }\n"
        + _slots(r)
        + "    uint left = gt + min(eq, need - min(tie, need));  // this lane's picks\n"
        "    for (uint i = lo; i < hi && left != 0u; ++i) {\n"
        f"        uint km = ({k}) & mask;\n"
        "        bool take = km > prefix || (km == prefix && tie < need);\n"
        "        if (km == prefix) tie += 1u;\n"
        "        if (take) { y[row * K + slot] = int(i); slot += 1u; left -= 1u; }\n"
        "    }\n"
    )


@generators.register(TopKRequest)
def generate_topk(r: TopKRequest) -> str:
    """The kernel of one TopK (or BlockTopK, ``r.masked``) request."""
    regs = r.per_lane > 0
    vec = regs and r.per_lane % 4 == 0 and r.n % 4 == 0
    key = "max(order_key(RAW), KEY_NEG_INF)" if r.masked else "order_key(RAW)"  # NaN: -inf
    if r.masked:
        prologue = (
            f"    int qp = qpos[(row / {r.heads * r.lq}u) * {r.lq}u + row % {r.lq}u];\n"
            f"    uint ok = qp > 0 ? uint(qp) / {r.block_size}u : 0u;  // complete blocks\n"
            "    if (ok <= K) {  // uniform: every complete block, then -1\n"
            "        for (uint j = lane; j < K; j += LANES) "
            "y[row * K + j] = j < ok ? int(j) : -1;\n"
            "        return;\n"
            "    }\n"
            "    uint n = min(ok, N);  // the K picks are all complete blocks\n"
        )
    elif r.k == r.n:  # every index, in order
        prologue = ("    for (uint j = lane; j < K; j += LANES) y[row * K + j] = int(j);\n"
                    "    return;\n")
    else:
        prologue = "    const uint n = N;\n"
    consts = (f"const uint N = {r.n}u, K = {r.k}u, LANES = {r.lanes}u, ROWS = {r.rows}u;\n"
              f"const uint BINS = {BINS}u, HIST = {HIST_WORDS}u;\n"
              f"shared uint s_hist[{HIST_BUFFERS}u * HIST];\n")
    if r.subgroup:
        consts += (f"const uint SG = {r.subgroup_size}u, BPS = {BINS // r.subgroup_size}u;"
                   "  // lanes of a subgroup, bins a subgroup lane sums\n")
        if r.subgroups > 1:
            consts += f"shared uvec2 s_part[{r.subgroups}u];  // the subgroups' totals\n"
        funcs = _KEYS + _SUBGROUP_SCAN + _sg_lanes_scan(r.subgroups) + \
            _find_bin(r.subgroup_size, r.k)
        lane = ("    uint sgid = gl_SubgroupID;\n"
                "    uint lane = sgid * SG + gl_SubgroupInvocationID;  // in scan order\n")
        find = "        uvec2 sel = find_bin(h, need);\n"
    else:
        consts += (f"shared uvec2 s_scan[LANES];\n"
                   f"shared uvec2 s_sel[{PASSES}u];  // each pass's (digit, keys above)\n")
        funcs = _KEYS + _SHARED_SCAN
        lane = "    uint lane = gl_LocalInvocationID.x;\n"
        find = _shared_find(r)

    body = (
        f"    uint row = {group_id(r.grid[0])};\n"
        "    if (row >= ROWS) return;  // uniform over the workgroup\n"
        + lane
        + "    uint base = row * N;\n"
    )
    if r.k == r.n and not r.masked:
        body += prologue
        main = "void main() {\n" + body + "}\n"
        return (header(r.lanes) + (SUBGROUP_EXT if r.subgroup else "")
                + declare_bindings(r.bindings(), {"x": "uint"}) + consts + funcs + main)
    clear0 = "    for (uint b = lane; b < HIST; b += LANES) s_hist[b] = 0u;  // buffer 0\n"
    if regs:
        loads, keys = _load_registers(r, key)
        body += (
            f"    uint first = lane * {r.per_lane}u;  // this lane's keys: first.. (registers)\n"
            "    // the chunk's raw bits, read once (issued before the position is known)\n"
            + loads + prologue + clear0
            + "    // the keys; 0 past the row (and past BlockTopK's eligible blocks)\n"
            + keys
        )
        count = "".join(_count(f"k{e}", "        ") for e in range(r.per_lane))
        compact = _compact_registers(r)
    else:
        body += prologue + clear0
        count = (
            "        for (uint i = lane; i < n; i += LANES) {\n"
            f"            uint key = {key.replace('RAW', 'x[base + i]')};\n"
            + _count("key", "            ")
            + "        }\n"
        )
        compact = _compact_stream(r, key)
    body += (
        "    barrier();\n"
        "    // radix select: the K-th largest key's digits, most significant first\n"
        "    uint prefix = 0u, mask = 0u, need = K;  // the same in every lane\n"
        f"    for (uint pass = 0u; pass < {PASSES}u; ++pass) {{\n"
        f"        uint shift = {32 - RADIX_BITS}u - {RADIX_BITS}u * pass;\n"
        f"        uint h = pass % {HIST_BUFFERS}u;  // this pass's buffer\n"
        f"        if (pass + 1u < {PASSES}u)  // the next pass's buffer (read two passes ago)\n"
        "            for (uint b = lane; b < HIST; b += LANES) "
        f"s_hist[((pass + 1u) % {HIST_BUFFERS}u) * HIST + b] = 0u;\n"
        "        uint last = 0u, run = 0u;  // a run of equal digits: one atomic\n"
        + count
        + "        if (run != 0u) atomicAdd(s_hist[bin(h, last)], run);\n"
        "        barrier();\n"
        + find
        + "        need -= sel.y;  // keys of the chosen bin still to take\n"
        "        prefix |= sel.x << shift;\n"
        "        mask |= (BINS - 1u) << shift;\n"
        "        if (s_hist[bin(h, sel.x)] == need) break;  // the bin is taken whole: done\n"
        "    }\n"
        "    // keys (masked) above prefix are taken, and the first `need` equal to it\n"
        + compact
    )
    return (
        header(r.lanes)
        + (SUBGROUP_EXT if r.subgroup else "")
        + declare_bindings(r.bindings(), {"x": "uvec4" if vec else "uint"})  # raw bits
        + consts
        + funcs
        + "void main() {\n" + body + "}\n"
    )
