"""Liveness over the kernel schedule and first-fit colouring of values and scratch into
arena buffers."""

from .colouring import ArenaLayout, Item, Placement, colour
from .liveness import kernel_items

__all__ = ["ArenaLayout", "Item", "Placement", "colour", "kernel_items"]
