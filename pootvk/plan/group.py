"""One launch per dependency level for the small elementwise kernels of that level.

Why: on a GPU a launch costs a few microseconds whatever it computes, and launches with no
hazard between them barely overlap. Measured on the H200 in one SmolLM2 layer's decode: q's
rotation (a ``Fused`` kernel) and the k and v cache writes (two ``FusedUpdate`` kernels)
share a dependency level and took 3.2-3.5 us each, ~10 us for 3 x 576 elements. As one
launch they cost about one.

What groups: ``PrimRequest``, ``FusedRequest`` and ``FusedUpdateRequest`` kernels (one
invocation per element, no workgroup memory, no barrier: any workgroup size and grid run
them) of one level
of the plan's hazard DAG (:func:`pootvk.access.levels` over the kernels' byte ranges: the
rules the recorder places barriers by). Kernels of one level have no hazard between them,
so one launch may run them in any interleaving; every kernel they depend on has a lower
level and every kernel depending on them a higher one, so the plan, reordered level by level
(stable inside a level) with each group where its first part was, keeps every hazard's
order: each byte sees the same writes in the same order, the results are bit-identical.
A group holds at most ``MAX_BINDINGS`` bindings (the smallest ``maxPerStageDescriptor
StorageBuffers`` of the parts this runs on: 24 on Adreno) and the grid's limits.
"""

from __future__ import annotations

from ..access import Touch, levels
from .bindings import Binding
from .planner import BoundOperand, Kernel
from .profile import DeviceProfile
from .requests import FusedRequest, FusedUpdateRequest, GroupRequest, PrimRequest, fold_grid

#: kernel requests a group can hold: one invocation per element, re-gridded freely
GROUPABLE = (PrimRequest, FusedRequest, FusedUpdateRequest)
MAX_BINDINGS = 24


def touches(k: Kernel) -> list[Touch]:
    """A kernel's bindings as the hazard rules see them (the recorder binds >= 4 bytes)."""
    return [(b.location.buffer, b.location.offset, b.location.offset + max(b.location.nbytes, 4),
             b.binding.access) for b in k.bindings]


def _group(parts: list[Kernel], profile: DeviceProfile) -> Kernel:
    ls = max(k.request.local_size for k in parts)  # type: ignore[union-attr]
    reqs = tuple(k.request for k in parts)
    total = sum(-(-max(r.threads, 1) // ls) for r in reqs)  # type: ignore[union-attr]
    req = GroupRequest(reqs, ls, fold_grid(total, profile.max_grid))  # type: ignore[arg-type]
    bound = tuple(BoundOperand(Binding(f"p{i}_{b.binding.name}", b.binding.access,
                                       b.binding.dtype), b.location, b.role)
                  for i, k in enumerate(parts) for b in k.bindings)
    assert tuple(b.binding for b in bound) == req.bindings()
    return Kernel(req, bound, parts[0].eqn, "group")


def group_kernels(kernels: list[Kernel], profile: DeviceProfile) -> list[Kernel]:
    """``kernels`` in level order with each level's groupable kernels as few launches as
    the binding cap allows (a lone one stays as it is); see the module doc."""
    lv = levels([touches(k) for k in kernels])
    order = sorted(range(len(kernels)), key=lambda i: (lv[i], i))
    out: list[Kernel | list[Kernel]] = []  # a kernel, or the parts of a group in place
    open_: dict[int, list[Kernel]] = {}  # level -> the group being filled
    for i in order:
        k = kernels[i]
        if not isinstance(k.request, GROUPABLE):
            out.append(k)
            continue
        parts = open_.get(lv[i])
        if parts is not None and sum(len(p.bindings) for p in parts) + len(k.bindings) \
                <= MAX_BINDINGS:
            parts.append(k)
            continue
        open_[lv[i]] = [k]
        out.append(open_[lv[i]])
    return [x if isinstance(x, Kernel) else x[0] if len(x) == 1 else _group(x, profile)
            for x in out]
