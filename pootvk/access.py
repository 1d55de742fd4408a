"""How a kernel uses one of its buffer bindings: one enum that the planner (a request's
bindings), the generators (readonly blocks) and the recorder (barriers only on hazards)
share, and the dependency levels both the planner (``plan.group``: one launch per level's
small elementwise kernels) and the recorder (``vk.hazards``: level order) derive from those
uses. It sits below every stage so no stage imports another for it."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence

import numpy as np


class Access(enum.Flag):
    READ = 1
    WRITE = 2
    READ_WRITE = READ | WRITE

    @property
    def reads(self) -> bool:
        return bool(self & Access.READ)

    @property
    def writes(self) -> bool:
        return bool(self & Access.WRITE)


#: One binding of one kernel as the hazard rules see it: (buffer key, start byte, end byte,
#: how the kernel uses it)
Touch = tuple[Hashable, int, int, Access]


def levels(kernels: Sequence[Sequence[Touch]]) -> tuple[int, ...]:
    """Each kernel's level in the hazard DAG of ``kernels`` (in their order, each given as
    its touches): 1 + the highest level of the earlier kernels it has a hazard with (it
    reads or writes bytes one wrote: RAW, WAW; it writes bytes one read: WAR), 0 if none.
    Two kernels of one level have no hazard between them.

    Per buffer, the byte ranges' end points cut the buffer into pieces; each piece keeps the
    highest level that wrote it and the highest that read it. A kernel's reads wait for the
    writes of their pieces, its writes for the writes and the reads: the per-byte form of
    the pairwise rule, in O(kernels x bindings x pieces touched)."""
    cuts: dict[Hashable, set[int]] = {}
    for ts in kernels:
        for buffer, lo, hi, _ in ts:
            cuts.setdefault(buffer, set()).update((lo, hi))
    edges = {b: np.array(sorted(c), np.int64) for b, c in cuts.items()}
    wrote = {b: np.full(len(e), -1, np.int64) for b, e in edges.items()}
    read = {b: np.full(len(e), -1, np.int64) for b, e in edges.items()}
    out: list[int] = []
    for ts in kernels:
        pieces = []
        level = 0
        for buffer, lo, hi, access in ts:
            e = edges[buffer]
            i, j = int(np.searchsorted(e, lo)), int(np.searchsorted(e, hi))
            pieces.append((buffer, i, j, access))
            level = max(level, int(wrote[buffer][i:j].max()) + 1)
            if access & Access.WRITE:
                level = max(level, int(read[buffer][i:j].max()) + 1)
        for buffer, i, j, access in pieces:  # after all reads: a binding never waits on itself
            if access & Access.READ:
                np.maximum(read[buffer][i:j], level, out=read[buffer][i:j])
            if access & Access.WRITE:
                np.maximum(wrote[buffer][i:j], level, out=wrote[buffer][i:j])
        out.append(level)
    return tuple(out)
