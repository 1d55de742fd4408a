"""GLSL of a group launch (``plan.requests.GroupRequest``): independent elementwise launches
of one dependency level as one (``plan.group``).

Each part's code is a function of its element index, its bindings prefixed ``p{i}_``
(``shaders.fused.fused_main``, ``shaders.prims.prim_main``: the same statements its own
launch runs after computing ``gid``); ``main`` hands each workgroup to its part: a part's
workgroups are consecutive, so the branch is uniform per workgroup. The rounding helpers
are declared once for every part that calls them.
"""

from __future__ import annotations

from ..plan.requests import FusedRequest, FusedUpdateRequest, GroupRequest, PrimRequest
from .common import BF16_ROUND, F16_ROUND, declare_bindings, group_id, header
from .fused import fused_helpers, fused_main
from .prims import prim_helpers, prim_main
from .table import generators


def _main(req: FusedRequest | FusedUpdateRequest | PrimRequest, pre: str) -> str:
    return prim_main(req, pre) if isinstance(req, PrimRequest) else fused_main(req, pre)


def _helpers(parts: tuple) -> str:
    need = {prim_helpers(p) if isinstance(p, PrimRequest) else fused_helpers(p) for p in parts}
    if any(F16_ROUND in h for h in need):
        return F16_ROUND + BF16_ROUND
    return BF16_ROUND if BF16_ROUND in need else ""


@generators.register(GroupRequest)
def generate_group(req: GroupRequest) -> str:
    binds = req.bindings()
    parts = "".join(f"void part{i}(uint gid) {{\n{_main(p, f'p{i}_')}}}\n"
                    for i, p in enumerate(req.parts))
    calls, base = [], 0
    for i, n in enumerate(req.part_groups):
        calls.append(f"    if (wg < {base + n}u) {{ part{i}((wg - {base}u) * {req.local_size}u"
                     " + gl_LocalInvocationID.x); return; }")
        base += n
    return (
        header(req.local_size, any(b.dtype.is_16bit for b in binds))
        + declare_bindings(binds)
        + _helpers(req.parts)
        + parts
        + "void main() {\n"
        + f"    uint wg = {group_id(req.grid[0])};\n"
        + "\n".join(calls)
        + "\n}\n"
    )
