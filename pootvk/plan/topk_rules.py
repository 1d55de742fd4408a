"""Plan rules of TopK and BlockTopK: one ``TopKRequest`` launch per eqn, a workgroup per row
(``plan.topk``; the kernel: ``shaders.topk``)."""

from __future__ import annotations

import math

from ..ir import Eqn
from ..ir import prims as P
from .profile import DeviceProfile
from .requests import fold_grid
from .rules import KernelCall, PlanContext, RuleResult, _pow2, _row_workgroup, plan_rules
from .topk import TopKRequest

#: elements a lane takes per pass before the workgroup grows: a small row uses fewer lanes
#: (the scans' barriers cost more than a few extra loads per lane)
ELEMENTS_PER_LANE = 4
#: lanes of a workgroup at least (one warp of most GPUs)
MIN_LANES = 32


def topk_lanes(n: int, profile: DeviceProfile) -> int:
    """Lanes of a row's workgroup: ~``ELEMENTS_PER_LANE`` elements each, at least
    ``MIN_LANES``, at most the row workgroup the device runs (a power of two)."""
    cap = _row_workgroup(profile)
    return min(cap, max(MIN_LANES, _pow2(-(-n // ELEMENTS_PER_LANE))))


def topk_request(
    rows: int, n: int, k: int, profile: DeviceProfile, *, block_size: int = 0,
    heads: int = 1, lq: int = 1,
) -> TopKRequest:
    """The request of one TopK (or, with ``block_size``, BlockTopK) launch."""
    return TopKRequest(rows=rows, n=n, k=k, lanes=topk_lanes(n, profile),
                       grid=fold_grid(rows, profile.max_grid), block_size=block_size,
                       heads=heads, lq=lq)


@plan_rules.register(P.TOPK)
def _topk(e: Eqn, ctx: PlanContext) -> RuleResult:
    """A workgroup per row of the last axis."""
    (x,) = e.inputs
    req = topk_request(math.prod(x.shape[:-1]), x.shape[-1], e.params["k"], ctx.profile)
    return RuleResult([KernelCall(req, (x, e.out), str(e.prim))])


@plan_rules.register(P.BLOCK_TOPK)
def _block_topk(e: Eqn, ctx: PlanContext) -> RuleResult:
    """A workgroup per (b, h, l) row; the masking happens as the kernel reads the scores."""
    scores, qpos = e.inputs
    b, hs, lq, nb = scores.shape
    req = topk_request(b * hs * lq, nb, e.params["top_k"], ctx.profile,
                       block_size=e.params["block_size"], heads=hs, lq=lq)
    return RuleResult([KernelCall(req, (scores, qpos, e.out), str(e.prim))])
