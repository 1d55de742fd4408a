"""The checked paged write map: the only value a WRITEMAP slot is bound as.

A paged graph writes its new K/V rows into the pools with ScatterUpdate through a write map
(``[rows * tokens]`` i32, one pool slot per new token). ScatterUpdate itself would skip a row
outside the pool and let the last of two writes to one slot win; neither may happen silently
in a KV cache (a lost token, or two sequences' keys in one slot). So a write map is bound only
as a ``ForwardSlotMap``, whose constructor refuses, with a typed ``WriteMapError``, any word
outside ``[0, pool_slots)`` other than ``-1`` (a padding token writes nothing) and any pool
slot named twice. ``check_bind`` wraps a plain array bound to a WRITEMAP slot in one, so every
binder (the oracle, the Vulkan replay) refuses a bad map before anything is written.

A read map (SLOTMAP) needs no such type: it is declared in ``[0, pool_slots)`` and the bind's
range check refuses a word outside (``SlotRangeError``); repeats are legal there (a shared
prefix block is read by several rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import BindError, WriteMapError

#: A write-map word that writes nothing (a padding token).
NO_SLOT = -1


class ForwardSlotMap:
    """A write map checked against a pool of ``pool_slots`` slots: every word is a pool slot
    or ``-1`` and no pool slot is named twice. Immutable once built (its words are a
    read-only i32 copy); ``np.asarray(m)`` gives them."""

    __slots__ = ("words", "pool_slots", "slot")

    def __init__(self, words: object, pool_slots: int, slot: str = "write") -> None:
        arr = np.asarray(words)
        if arr.ndim != 1:
            raise BindError(slot, "[n] (one pool slot per new token)", arr.shape, "shape")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise BindError(slot, "int32", arr.dtype.name, "dtype")
        if pool_slots < 1:
            raise WriteMapError(slot, 0, 0, pool_slots, "the pool has no slot")
        w = arr.astype(np.int64)
        bad = np.flatnonzero((w < NO_SLOT) | (w >= pool_slots))
        if bad.size:
            i = int(bad[0])
            raise WriteMapError(slot, i, int(w[i]), pool_slots, "not a slot of the pool")
        live = np.flatnonzero(w != NO_SLOT)
        vals, first = np.unique(w[live], return_index=True)
        if vals.size != live.size:  # a repeat: the first position naming an earlier slot
            seen = np.zeros(live.size, bool)
            seen[first] = True
            i = int(live[np.flatnonzero(~seen)[0]])
            j = int(live[np.flatnonzero(w[live] == w[i])[0]])
            raise WriteMapError(slot, i, int(w[i]), pool_slots,
                                f"slot named twice (first at word {j})", first=j)
        self.words = w.astype(np.int32)
        self.words.flags.writeable = False
        self.pool_slots = int(pool_slots)
        self.slot = slot

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.words if dtype is None else self.words.astype(dtype)

    def __len__(self) -> int:
        return int(self.words.size)

    def __repr__(self) -> str:
        return f"ForwardSlotMap({self.slot!r}, {self.words.tolist()}, pool_slots={self.pool_slots})"


def write_map_pool(slot_name: str, rng: tuple[int, int] | None) -> int:
    """The pool size S of a WRITEMAP slot from its declared range ``(-1, S - 1)``."""
    if rng is None or rng[0] != NO_SLOT or rng[1] < 0:
        raise BindError(slot_name, "a declared range (-1, pool_slots - 1)", rng,
                        "write-map range")
    return rng[1] + 1
