"""Liveness over the kernel schedule: values and declared scratch as colourable items.

The schedule is the list of kernels the plan rules produced, each tagged with the eqn it
runs. A value lives from the first kernel of the eqn that produces it to the last kernel of
the eqn that last uses it (``ir.UseInfo``, the same walk DCE and the oracle use); a scratch
lives exactly over the kernels of the eqn that declared it. Values with a fixed home (slots,
states, exports) are not coloured.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence

from ..ir import UseInfo, Var
from .colouring import Item


def kernel_items(
    info: UseInfo,
    kernel_eqns: Sequence[int],
    *,
    fixed: set[Var],
    scratch: Mapping[object, int],
    views: Mapping[Var, Var] | None = None,
) -> tuple[list[Item], dict[object, str]]:
    """Items with [first, last] kernel intervals, and each value's/scratch's item name.

    ``kernel_eqns[k]`` is the eqn kernel ``k`` runs (non-decreasing); ``scratch`` maps each
    declared scratch (an object with ``nbytes``) to its eqn. ``views`` maps a value that
    shares another's bytes (a Reshape run as a view) to that root: a view is no item, and
    its root lives until the view's last use too.
    """
    ends: dict[Var, int] = {}
    for view, root in (views or {}).items():
        end = info.last_use(view)
        if end is not None:
            ends[root] = max(ends.get(root, end), end)
    ks = list(kernel_eqns)

    def first(eqn: int) -> int:
        return min(bisect_left(ks, eqn), max(len(ks) - 1, 0))

    def last(eqn: int) -> int:
        return max(bisect_right(ks, eqn) - 1, 0)

    items: list[Item] = []
    names: dict[object, str] = {}
    for v, p in info.producer.items():
        if v in fixed or v in (views or {}):
            continue
        end = max((e for e in (info.last_use(v), ends.get(v)) if e is not None), default=None)
        name = f"v{len(names)}"
        names[v] = name
        items.append(Item(name, v.nbytes, first(p), max(last(p if end is None else end),
                                                         first(p))))
    for sc, eqn in scratch.items():
        name = f"s{len(names)}"
        names[sc] = name
        items.append(Item(name, sc.nbytes, first(eqn), last(eqn), scratch=True))  # type: ignore[attr-defined]
    return items, names
