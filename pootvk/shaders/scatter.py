"""GLSL for ScatterUpdate (``plan.requests.ScatterRequest``), in place over its output.

Workgroup ``n`` owns update row n. An index outside [0, rows) (-1 means "no row") writes
nothing, so no kernel ever writes out of bounds. Otherwise the lanes first scan the later
indices ``indices[n+1:]``; if one names the same row, that later update wins and row n
writes nothing, so each output row has exactly one writer and the result does not depend on
the order workgroups run in. Then the lanes copy the row's elements (16-bit words as
they are).
"""

from __future__ import annotations

from ..plan.requests import ScatterRequest
from .common import declare_bindings, group_id, header
from .table import generators


@generators.register(ScatterRequest)
def generate_scatter(r: ScatterRequest) -> str:
    return (
        header(r.lanes, r.dtype.is_16bit)
        + declare_bindings(r.bindings())
        + "shared uint s_later;\n"
        + "void main() {\n"
        + f"    uint n = {group_id(r.grid[0])};\n"
        + f"    if (n >= {r.n}u) return;  // uniform over the workgroup\n"
        + "    int row = indices[n];\n"
        + f"    if (row < 0 || row >= {r.rows}) return;  // uniform: no row, nothing written\n"
        + "    uint lane = gl_LocalInvocationID.x;\n"
        + "    if (lane == 0u) s_later = 0u;\n"
        + "    barrier();\n"
        + f"    for (uint m = n + 1u + lane; m < {r.n}u; m += {r.lanes}u) {{\n"
        + "        if (indices[m] == row) { atomicOr(s_later, 1u); break; }\n"
        + "    }\n"
        + "    barrier();\n"
        + "    if (s_later != 0u) return;  // a later update owns this row\n"
        + f"    uint dst = uint(row) * {r.row}u, src = n * {r.row}u;\n"
        + f"    for (uint e = lane; e < {r.row}u; e += {r.lanes}u) y[dst + e] = updates[src + e];\n"
        + "}\n"
    )
