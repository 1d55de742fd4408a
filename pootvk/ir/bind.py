"""Checking values bound to a graph's input slots against their declarations.

Every binder (the oracle, the Vulkan replay) calls :func:`check_bind` before anything runs,
so a wrong shape, dtype or out-of-range word is refused with a typed error naming the slot
and nothing is written or published. A paged write map (WRITEMAP) is bound only as a checked
``ForwardSlotMap`` (``ir.slotmap``): a plain array is wrapped in one, so a slot outside the pool
or named twice is refused (``WriteMapError``) like any other bad word.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import BindError, SlotRangeError
from .dtypes import BF16, is_float_array, storage_values
from .graph import Graph, Slot, SlotKind
from .slotmap import ForwardSlotMap, write_map_pool


def check_slot(slot: Slot, value: object) -> np.ndarray:
    arr = np.asarray(value)
    dt = slot.var.dtype
    want = dt.numpy
    if arr.shape != slot.var.shape:
        raise BindError(slot.name, slot.var.shape, arr.shape, "shape")
    if slot.kind is SlotKind.WRITEMAP:  # checked whether or not it came as a ForwardSlotMap
        arr = np.asarray(ForwardSlotMap(arr, write_map_pool(slot.name, slot.range), slot.name))
    if dt.is_float and is_float_array(arr):
        # any float (bfloat16 included) is rounded to the slot's storage type
        arr = arr if arr.dtype == want and dt is not BF16 else storage_values(arr, dt)
    elif arr.dtype != want:
        same_kind = any(
            np.issubdtype(arr.dtype, k) and np.issubdtype(want, k)
            for k in (np.floating, np.integer)
        )
        if not same_kind:
            raise BindError(slot.name, want.name, arr.dtype.name, "dtype")
        if np.issubdtype(want, np.integer):
            info = np.iinfo(want)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                bad = int(arr.min()) if arr.min() < info.min else int(arr.max())
                raise SlotRangeError(slot.name, bad, int(info.min), int(info.max))
        arr = arr.astype(want)
    if slot.range is not None and arr.size:
        lo, hi = slot.range
        bad_mask = (arr < lo) | (arr > hi)
        if bad_mask.any():
            raise SlotRangeError(slot.name, int(arr[bad_mask].flat[0]), lo, hi)
    return arr if arr.flags.c_contiguous else arr.copy()


def check_bind(
    g: Graph, values: Mapping[str, object], *, only: set[str] | None = None
) -> dict[str, np.ndarray]:
    """Check ``values`` against the slots (all of them, or the names in ``only``).

    Unknown names are refused too: a typo must not silently leave a slot unbound.
    """
    names = {s.name for s in g.slots if s.kind.bound}
    for k in values:
        if k not in names:
            raise BindError(k, sorted(names), k, "slot name (one of)")
    out: dict[str, np.ndarray] = {}
    for s in g.slots:
        if not s.kind.bound or (only is not None and s.name not in only):
            continue
        if s.name not in values:
            raise BindError(s.name, s.var.aval(), "nothing", "a value of")
        out[s.name] = check_slot(s, values[s.name])
    return out
