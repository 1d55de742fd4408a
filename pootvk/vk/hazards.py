"""Where a recording needs a compute->compute barrier, and in which order it records.

Why: a barrier between every pair of dispatches serialises kernels that could overlap (a
decode step runs many small independent ones). A dispatch needs a barrier when it reads or
writes bytes an earlier dispatch wrote (RAW, WAW) or writes bytes an earlier one read (WAR),
counting only dispatches since the last barrier: a barrier orders everything before it, so
the tracked ranges start empty after each one. Ranges are compared per buffer, by
``[offset, offset + nbytes)``.

Why reorder: with barriers placed that way, their number depends on the order. The planner
emits kernels in graph order (``q GEMV | rope | v GEMV | ...``), which breaks runs of
independent kernels with dependent ones. :func:`levels` gives each dispatch its depth in the
hazard DAG (1 + the deepest earlier dispatch it has a hazard with, 0 if none);
:func:`level_order` records level by level (stable inside a level). Two dispatches with a
hazard are never reordered (the later one is on a deeper level), so every byte sees the same
writes in the same order and results are bit-identical. The barrier count is then the
longest hazard chain minus one, the least any order can reach: consecutive links of a chain
need a barrier between them in every order, and :func:`barriers_before` on a level order
places at most one barrier per level boundary (a level has no hazard inside it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pootvk.access import Access, Touch
from pootvk.access import levels as access_levels

if TYPE_CHECKING:
    from .recorder import Dispatch

__all__ = ["Access", "barriers_before", "level_order", "levels"]


Span = tuple[int, int]


def touches(d: Dispatch) -> list[Touch]:
    """The byte ranges ``d`` binds and how it uses each (undeclared access: READ_WRITE)."""
    return [(r.buffer, r.offset, r.offset + r.nbytes, a)
            for r, a in zip(d.bindings, d.accesses, strict=True)]


def _overlaps(seen: dict[Any, list[Span]], buffer: Any, span: Span) -> bool:
    lo, hi = span
    return any(a < hi and lo < b for a, b in seen.get(buffer, ()))


def _add(seen: dict[Any, list[Span]], items: Iterable[tuple[Any, Span]]) -> None:
    for buffer, span in items:
        seen.setdefault(buffer, []).append(span)


def barriers_before(dispatches: Sequence[Dispatch]) -> tuple[bool, ...]:
    """For each dispatch, whether a barrier must precede it (the first never needs one:
    what ran before the recording is ordered by the submit and the upload barriers)."""
    written: dict[Any, list[Span]] = {}
    read: dict[Any, list[Span]] = {}
    out: list[bool] = []
    for d in dispatches:
        reads: list[tuple[Any, Span]] = []
        writes: list[tuple[Any, Span]] = []
        for buffer, lo, hi, access in touches(d):
            if access & Access.READ:
                reads.append((buffer, (lo, hi)))
            if access & Access.WRITE:
                writes.append((buffer, (lo, hi)))
        hazard = any(_overlaps(written, b, s) for b, s in reads + writes) or any(
            _overlaps(read, b, s) for b, s in writes
        )
        if hazard:
            written.clear()
            read.clear()
        out.append(hazard)
        _add(read, reads)
        _add(written, writes)
    return tuple(out)


def levels(dispatches: Sequence[Dispatch]) -> tuple[int, ...]:
    """Each dispatch's level: 1 + the highest level of the earlier dispatches it has a
    hazard with (the rules of :func:`barriers_before`, over all earlier dispatches, not
    only those since a barrier), 0 if none (:func:`pootvk.access.levels` over their
    bindings' byte ranges)."""
    return access_levels([touches(d) for d in dispatches])


def level_order(dispatches: Sequence[Dispatch]) -> tuple[int, ...]:
    """The indices of ``dispatches`` in recording order: by level, program order inside a
    level. Every pair with a hazard keeps its order (see the module docstring)."""
    lv = levels(dispatches)
    return tuple(sorted(range(len(lv)), key=lambda i: (lv[i], i)))
