"""Plan rules of TopK and BlockTopK: one ``TopKRequest`` launch per eqn, a workgroup per row
(``plan.topk``; the kernel: ``shaders.topk``).

The schedule: ~``ELEMENTS_PER_LANE`` keys a lane (at least a subgroup of lanes, at most the
row workgroup); the keys held in registers when a lane takes at most ``MAX_PER_LANE`` of
them (every row up to 8192 at 256 lanes), else streamed from memory each pass; the prefix
sums on subgroup shuffles where the profile has them. ``forced_topk`` overrides any of the
three (tests reach every variant on lavapipe with it; ``bench/topk.py`` compares them).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..errors import ShapeError
from ..ir import Eqn
from ..ir import prims as P
from .profile import DeviceProfile
from .requests import fold_grid
from .rules import KernelCall, PlanContext, RuleResult, _pow2, _row_workgroup, plan_rules
from .topk import TopKRequest, subgroup_fits

#: elements a lane takes before the workgroup grows: a small row uses fewer lanes (every
#: barrier waits for all of them)
ELEMENTS_PER_LANE = 8
#: lanes of a workgroup at least (one warp of most GPUs)
MIN_LANES = 32
#: keys a lane holds in registers at most (named scalars); a longer row streams from memory
MAX_PER_LANE = 32

#: what ``forced_topk`` sets: field -> value (``lanes``, ``subgroup``, ``registers``)
_forced: ContextVar[tuple[tuple[str, object], ...]] = ContextVar("pootvk_forced_topk",
                                                                  default=())
FORCIBLE = ("lanes", "subgroup", "registers")


@contextmanager
def forced_topk(**fields: object) -> Iterator[None]:
    """TopK plans made inside take these choices: ``lanes`` (a power of two the device
    runs), ``subgroup`` (False: the workgroup-memory scans; True: refused where the profile
    lacks subgroup shuffles), ``registers`` (False: stream the row from memory each pass;
    True: refused where a lane would hold more than ``MAX_PER_LANE`` keys)."""
    bad = sorted(set(fields) - set(FORCIBLE))
    if bad:
        raise ValueError(f"forced_topk takes {FORCIBLE}, not {bad}")
    token = _forced.set(tuple(sorted(fields.items())))
    try:
        yield
    finally:
        _forced.reset(token)


def subgroup_usable(profile: DeviceProfile) -> bool:
    """The profile has subgroup shuffles in compute shaders, in subgroups of a power of two
    between ``MIN_SUBGROUP`` and the histogram's bins."""
    return profile.subgroup_shuffle and subgroup_fits(profile.subgroup_size)


def topk_lanes(n: int, profile: DeviceProfile, subgroup: bool = False) -> int:
    """Lanes of a row's workgroup: ~``ELEMENTS_PER_LANE`` elements each, at least
    ``MIN_LANES`` (and, with ``subgroup``, one whole subgroup), at most the row workgroup
    the device runs (a power of two)."""
    cap = _row_workgroup(profile)
    least = max(MIN_LANES, profile.subgroup_size if subgroup else 1)
    return min(cap, max(least, _pow2(-(-n // ELEMENTS_PER_LANE))))


def topk_request(
    rows: int, n: int, k: int, profile: DeviceProfile, *, block_size: int = 0,
    heads: int = 1, lq: int = 1,
) -> TopKRequest:
    """The request of one TopK (or, with ``block_size``, BlockTopK) launch."""
    forced = dict(_forced.get())
    usable = subgroup_usable(profile)
    subgroup = bool(forced.get("subgroup", usable))
    if subgroup and not usable:
        raise ShapeError(f"TopK: forced subgroup scans, but {profile.name} has no usable "
                         f"subgroup shuffles (size {profile.subgroup_size})")
    lanes = int(forced.get("lanes", topk_lanes(n, profile, subgroup)))  # type: ignore[call-overload]
    if lanes < 1 or lanes & (lanes - 1) or lanes > _row_workgroup(profile):
        raise ShapeError(f"TopK: {lanes} lanes is not a power of two the device runs")
    if lanes % profile.subgroup_size:  # a part of a subgroup: the workgroup-memory scans
        if forced.get("subgroup"):
            raise ShapeError(f"TopK: forced subgroup scans over {lanes} lanes, not whole "
                             f"subgroups of {profile.subgroup_size}")
        subgroup = False
    per_lane = -(-n // lanes)
    registers = bool(forced.get("registers", per_lane <= MAX_PER_LANE))
    if registers and per_lane > MAX_PER_LANE:
        raise ShapeError(f"TopK: {per_lane} keys a lane exceed the {MAX_PER_LANE} held in "
                         "registers")
    return TopKRequest(rows=rows, n=n, k=k, lanes=lanes,
                       grid=fold_grid(rows, profile.max_grid), block_size=block_size,
                       heads=heads, lq=lq, per_lane=per_lane if registers else 0,
                       subgroup=subgroup,
                       subgroup_size=profile.subgroup_size if subgroup else 0)


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
