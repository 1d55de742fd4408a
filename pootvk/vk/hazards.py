"""Where a recording needs a compute->compute barrier: only before a dispatch with a hazard.

Why: a barrier between every pair of dispatches serialises kernels that could overlap (a
decode step runs many small independent ones). A dispatch needs a barrier when it reads or
writes bytes an earlier dispatch wrote (RAW, WAW) or writes bytes an earlier one read (WAR),
counting only dispatches since the last barrier: a barrier orders everything before it, so
the tracked ranges start empty after each one. Ranges are compared per buffer, by
``[offset, offset + nbytes)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pootvk.access import Access

if TYPE_CHECKING:
    from .recorder import Dispatch

__all__ = ["Access", "barriers_before"]


Span = tuple[int, int]


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
        for r, access in zip(d.bindings, d.accesses, strict=True):
            item = (r.buffer, (r.offset, r.offset + r.nbytes))
            if access & Access.READ:
                reads.append(item)
            if access & Access.WRITE:
                writes.append(item)
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
