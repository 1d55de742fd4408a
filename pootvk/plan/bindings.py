"""Bindings as data: what a kernel binds, how it accesses it, and where buffers come from.

A request's ``bindings()`` lists its descriptor bindings in order (name, access, element
dtype). The planner resolves each to a buffer range, the generators declare their buffer
blocks from it, and the runtime tells the recorder which ranges a dispatch reads and
writes, so barriers go only where a hazard is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..access import Access
from ..ir import DType

__all__ = ["Access", "Binding", "BufferRole", "Scratch"]


class BufferRole(Enum):
    """Where a buffer's bytes come from and who sees them.

    INPUT: written by the host every step. PARAM: written when weights change. STATE:
    persistent, updated in place. CONST: written once when the plan is loaded (folded
    constants). EXPORT/WITNESS: read back by the host after a step (a witness is a guard's
    validation word). ARENA: intermediates coloured by liveness. SCRATCH: plan-local scratch
    a fused eqn declared (it lives in an arena buffer too).
    """

    INPUT = "input"
    PARAM = "param"
    STATE = "state"
    CONST = "const"
    EXPORT = "export"
    WITNESS = "witness"
    ARENA = "arena"
    SCRATCH = "scratch"

    @property
    def host_reads(self) -> bool:
        return self in (BufferRole.EXPORT, BufferRole.WITNESS)

    @property
    def host_writes_per_step(self) -> bool:
        return self is BufferRole.INPUT


@dataclass(frozen=True)
class Binding:
    """One descriptor binding of a kernel: its name in the source, access and element type."""

    name: str
    access: Access
    dtype: DType


@dataclass(frozen=True, eq=False)
class Scratch:
    """Plan-local scratch declared by a plan rule: ``elements`` of ``dtype``, alive for the
    kernels of the eqn that declared it, never an export. Identity is the declaration.

    ``persistent`` scratch keeps its bytes between replays and starts zeroed (the arrival
    counters of a fused split combine, which the kernel resets itself): it gets its own
    buffer instead of an arena slot."""

    elements: int
    dtype: DType
    label: str = field(default="scratch")
    persistent: bool = False

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype.device_itemsize
