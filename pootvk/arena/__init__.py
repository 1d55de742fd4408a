"""Liveness intervals and first-fit colouring of values and scratch into arena buffers."""

from .colouring import ArenaLayout, Item, Placement, colour

__all__ = ["ArenaLayout", "Item", "Placement", "colour"]
