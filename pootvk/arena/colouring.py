"""Colouring values and plan-local scratch into offsets of shared arena buffers.

Each item has a byte size and a liveness interval [first, last] of eqn indices (scratch
lives exactly as long as the eqn that declares it). Items are placed first-fit by address
among the items whose intervals overlap theirs, largest first; offsets are aligned
to the device's ``minStorageBufferOffsetAlignment``. No item may be wider than one binding
(``maxStorageBufferRange``); an arena buffer never passes ``maxMemoryAllocationSize``, so a
large plan spreads over several arena buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import BindingRange, ScratchBytes


@dataclass(frozen=True)
class Item:
    name: str
    nbytes: int
    first: int
    last: int
    scratch: bool = False

    def overlaps(self, other: Item) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class Placement:
    item: Item
    arena: int
    offset: int


@dataclass
class ArenaLayout:
    placements: dict[str, Placement] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)  # bytes of each arena buffer
    naive_bytes: int = 0  # what one buffer per item would take

    @property
    def peak_bytes(self) -> int:
        return sum(self.sizes)

    def __str__(self) -> str:
        lines = [f"arena: {len(self.sizes)} buffer(s), peak {self.peak_bytes} bytes "
                 f"(unshared {self.naive_bytes})"]
        for p in sorted(self.placements.values(), key=lambda p: (p.arena, p.offset)):
            it = p.item
            tag = " scratch" if it.scratch else ""
            lines.append(
                f"  {it.name:<6} arena{p.arena}+{p.offset:<10d} {it.nbytes:>10d} B  "
                f"live [{it.first}, {it.last}]{tag}"
            )
        return "\n".join(lines)


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def colour(
    items: list[Item], *, alignment: int, max_binding: int, max_buffer: int
) -> ArenaLayout:
    """First-fit colouring; raises BindingRange / ScratchBytes before anything is placed."""
    for it in items:
        if it.nbytes > max_binding:
            raise BindingRange(it.name, it.nbytes, max_binding)
        if it.nbytes > max_buffer:
            raise ScratchBytes(it.nbytes, max_buffer)
    layout = ArenaLayout(naive_bytes=sum(_align(it.nbytes, alignment) for it in items))
    placed: list[list[Placement]] = []
    # Largest first, each at the lowest free offset: placing in definition order instead
    # fragments (a long-lived layer output pushes later small values above it, layer after
    # layer), and the arena would grow with the layer count.
    for it in sorted(items, key=lambda i: (-i.nbytes, i.first, i.last, i.name)):
        size = _align(max(it.nbytes, 4), alignment)
        for a, arena in enumerate([*placed, []]):
            busy = sorted(
                (p.offset, p.offset + _align(max(p.item.nbytes, 4), alignment))
                for p in arena if p.item.overlaps(it)
            )
            off = 0
            for lo, hi in busy:
                if off + size <= lo:
                    break
                off = max(off, hi)
            if off + size <= max_buffer:
                if a == len(placed):
                    placed.append([])
                    layout.sizes.append(0)
                p = Placement(it, a, off)
                placed[a].append(p)
                layout.placements[it.name] = p
                layout.sizes[a] = max(layout.sizes[a], off + size)
                break
    return layout
