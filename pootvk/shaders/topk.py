"""GLSL for TopK and BlockTopK (``plan.topk.TopKRequest``): a radix selection per row.

One workgroup takes one row of the last axis (rows folded over a 2-D grid). Sorting a row
per thread would cost O(N log N) serial steps and a private array; instead the workgroup
*selects*:

1. Each value maps to an order-preserving 32-bit key: ``-0`` reads as ``+0`` and NaN maps
   to 0, below every number's key (``-inf`` is ``0x007fffff``), so comparing keys is
   comparing values in TopK's order, and equal keys are equal values.
2. Four radix passes (8 bits each, most significant first) find the K-th largest key: the
   lanes histogram the digit of every key that matches the prefix found so far (shared
   atomics; a lane adds a run of equal digits at once, so a row of similar values does not
   queue on one bin), a scan over the 256 bins (descending) finds the bin holding the K-th
   key, and the count above it is taken off K. A bin that is taken whole ends the search.
3. The selection is every key above the threshold plus the ``need`` lowest-index keys equal
   to it. Each lane owns a contiguous chunk of the row and counts its (above, equal) keys;
   one workgroup prefix sum over the pair gives each lane its first output slot (the
   selected keys before its chunk: ``above_before + min(equal_before, need)``), and the
   lane writes its chosen indices there in ascending order: the output is ascending.

Every pass reads the row from the global buffer (a row need not fit workgroup memory).

BlockTopK folds its mask into the load: with ``ok = max(qpos, 0) // bs`` complete blocks,
a row with ``ok <= K`` takes every complete block and pads with -1 (ineligible blocks rank
as -inf and lose ties to the lower, eligible ids), with no pass at all; otherwise the K
picks are all complete blocks, so the selection runs over the first ``min(ok, NB)`` scores
only, NaN reading as -inf (``max(key, KEY(-inf))``).

No private arrays, no subgroup operations: the scans and the histogram are in workgroup
memory (the same source runs on every device; shared atomics are core GLSL 450).
"""

from __future__ import annotations

from ..ir import prims as P
from ..plan.topk import RADIX_BITS, TopKRequest
from .common import declare_bindings, group_id, header
from .prims import ROW_KERNELS
from .table import generators

#: TopK has a generator of its own (a workgroup per row), not an elementwise body
ROW_KERNELS[P.TOPK] = TopKRequest

BINS = 1 << RADIX_BITS
PASSES = 32 // RADIX_BITS

_FUNCTIONS = """
const uint KEY_NEG_INF = 0x007fffffu;  // -inf's key: the least number, above NaN's 0

// TopK's order as unsigned keys: NaN lowest, -0 == +0, otherwise the value's order
uint order_key(uint u) {
    uint a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0u;  // NaN (any sign or payload)
    if (a == 0u) return 0x80000000u;  // -0 reads as +0
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

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


@generators.register(TopKRequest)
def generate_topk(r: TopKRequest) -> str:
    """The kernel of one TopK (or BlockTopK, ``r.masked``) request."""
    per_lane = max(1, BINS // r.lanes)
    if r.masked:
        key = "max(order_key(x[base + i]), KEY_NEG_INF)"  # NaN reads as -inf
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
    else:
        key = "order_key(x[base + i])"
        prologue = "    const uint n = N;\n"
    return (
        header(r.lanes)
        + declare_bindings(r.bindings(), {"x": "uint"})  # raw bits: no float op touches them
        + f"const uint N = {r.n}u, K = {r.k}u, LANES = {r.lanes}u, ROWS = {r.rows}u;\n"
        + f"const uint BINS = {BINS}u, BINS_PER_LANE = {per_lane}u;\n"
        + "shared uint s_hist[BINS];\n"
        + "shared uvec2 s_scan[LANES];\n"
        + "shared uint s_digit, s_above;\n"
        + _FUNCTIONS
        + "void main() {\n"
        + f"    uint row = {group_id(r.grid[0])};\n"
        + "    if (row >= ROWS) return;  // uniform over the workgroup\n"
        + "    uint lane = gl_LocalInvocationID.x;\n"
        + "    uint base = row * N;\n"
        + prologue
        + "    // radix select: the K-th largest key's digits, most significant first\n"
        + "    uint prefix = 0u, mask = 0u, need = K;  // uniform (read from shared)\n"
        + f"    for (uint pass = 0u; pass < {PASSES}u; ++pass) {{\n"
        + f"        uint shift = {32 - RADIX_BITS}u - {RADIX_BITS}u * pass;\n"
        + "        for (uint b = lane; b < BINS; b += LANES) s_hist[b] = 0u;\n"
        + "        barrier();\n"
        + "        uint last = 0u, run = 0u;  // a run of equal digits: one atomic\n"
        + "        for (uint i = lane; i < n; i += LANES) {\n"
        + f"            uint key = {key};\n"
        + "            if ((key & mask) != prefix) continue;\n"
        + "            uint d = (key >> shift) & (BINS - 1u);\n"
        + "            if (d != last && run != 0u) { atomicAdd(s_hist[last], run); run = 0u; }\n"
        + "            last = d;\n"
        + "            run += 1u;\n"
        + "        }\n"
        + "        if (run != 0u) atomicAdd(s_hist[last], run);\n"
        + "        barrier();\n"
        + "        // lane l owns bins BINS-1-l*BINS_PER_LANE downwards: its exclusive prefix\n"
        + "        // sum counts the keys in higher bins\n"
        + "        uint cnt = 0u;\n"
        + "        for (uint c = 0u; c < BINS_PER_LANE; ++c) {\n"
        + "            uint p = lane * BINS_PER_LANE + c;\n"
        + "            if (p < BINS) cnt += s_hist[BINS - 1u - p];\n"
        + "        }\n"
        + "        uint above = scan_lanes(lane, uvec2(cnt, 0u)).x;\n"
        + "        for (uint c = 0u; c < BINS_PER_LANE; ++c) {\n"
        + "            uint p = lane * BINS_PER_LANE + c;\n"
        + "            if (p >= BINS) break;\n"
        + "            uint h = s_hist[BINS - 1u - p];\n"
        + "            if (above < need && need <= above + h) {  // one lane, one bin\n"
        + "                s_digit = BINS - 1u - p;\n"
        + "                s_above = above;\n"
        + "            }\n"
        + "            above += h;\n"
        + "        }\n"
        + "        barrier();\n"
        + "        uint d = s_digit;\n"
        + "        need -= s_above;  // keys of the chosen bin still to take\n"
        + "        prefix |= d << shift;\n"
        + "        mask |= (BINS - 1u) << shift;\n"
        + "        bool whole = s_hist[d] == need;  // the bin is taken whole: done\n"
        + "        barrier();  // before the next pass clears the bins\n"
        + "        if (whole) break;\n"
        + "    }\n"
        + "    // keys (masked) above prefix are taken, and the first `need` equal to it\n"
        + "    uint chunk = (n + LANES - 1u) / LANES;\n"
        + "    uint lo = min(lane * chunk, n), hi = min(lo + chunk, n);\n"
        + "    uint gt = 0u, eq = 0u;\n"
        + "    for (uint i = lo; i < hi; ++i) {\n"
        + f"        uint km = ({key}) & mask;\n"
        + "        gt += km > prefix ? 1u : 0u;\n"
        + "        eq += km == prefix ? 1u : 0u;\n"
        + "    }\n"
        + "    uvec2 before = scan_lanes(lane, uvec2(gt, eq));\n"
        + "    uint tie = before.y;  // equal keys at lower indices\n"
        + "    uint slot = before.x + min(tie, need);\n"
        + "    uint left = gt + min(eq, need - min(tie, need));  // this lane's picks\n"
        + "    for (uint i = lo; i < hi && left != 0u; ++i) {\n"
        + f"        uint km = ({key}) & mask;\n"
        + "        bool take = km > prefix || (km == prefix && tie < need);\n"
        + "        if (km == prefix) tie += 1u;\n"
        + "        if (take) { y[row * K + slot] = int(i); slot += 1u; left -= 1u; }\n"
        + "    }\n"
        + "}\n"
    )
