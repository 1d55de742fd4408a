"""The kernel request of the selection primitives TopK and BlockTopK (``shaders.topk``).

Both run one kernel: one workgroup per row of the last axis, a parallel radix selection of
the row's K-th largest order key, then a compaction that writes the chosen indices in
ascending order. BlockTopK is the same kernel with its masking folded in (NaN and incomplete
blocks read as -inf, a picked incomplete block written as -1), so the scores are read where
they lie and no masked copy is ever stored. The plan rules are in ``plan.topk_rules`` (this
module imports no rules, so ``plan.rules`` can name the request in ``KernelRequest``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ShapeError
from ..ir import F32, I32
from .bindings import Access, Binding

#: bits of the key one radix pass resolves (256 histogram bins in workgroup memory)
RADIX_BITS = 8


@dataclass(frozen=True)
class TopKRequest:
    """TopK over ``rows`` rows of ``n`` f32 values -> ``k`` i32 indices per row, ascending.

    A workgroup of ``lanes`` (a power of two) per row; rows past the X grid limit fold over
    a 2-D ``grid`` (``fold_grid``). ``block_size`` > 0 makes it BlockTopK: row ``r`` is
    (b, h, l) of scores [B, ``heads``, ``lq``, n] and reads its position ``qpos[b, l]``
    (bound as ``qpos``, i32 [B, lq]); block j is eligible iff j < max(qpos, 0) // bs, a NaN
    or ineligible score ranks as -inf, and a picked ineligible block is written as -1. The
    request names only shapes and the schedule: one kernel serves every step's values."""

    rows: int
    n: int
    k: int
    lanes: int
    grid: tuple[int, int]
    block_size: int = 0  # > 0: BlockTopK's masking (0: plain TopK)
    heads: int = 1  # BlockTopK: Hs
    lq: int = 1  # BlockTopK: Lq

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.n:
            raise ShapeError(f"TopK k={self.k} is not in [1, {self.n}]")
        if self.lanes < 1 or self.lanes & (self.lanes - 1):
            raise ShapeError(f"TopK lanes={self.lanes} is not a power of two")
        if self.block_size < 0 or self.rows % (self.heads * self.lq):
            raise ShapeError(f"BlockTopK rows={self.rows} are not [B, Hs={self.heads}, "
                             f"Lq={self.lq}] (block_size={self.block_size})")

    @property
    def masked(self) -> bool:
        """BlockTopK: the scores are masked by block eligibility on load."""
        return self.block_size > 0

    @property
    def local_size(self) -> int:
        return self.lanes

    @property
    def workgroups(self) -> int:
        return self.rows

    @property
    def shared_bytes(self) -> int:
        """Workgroup memory: the histogram's bins and the lanes' scan pairs."""
        return (1 << RADIX_BITS) * 4 + self.lanes * 8 + 16

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        qpos = (Binding("qpos", Access.READ, I32),) if self.masked else ()
        return (Binding("x", Access.READ, F32), *qpos, Binding("y", Access.WRITE, I32))

    def describe(self) -> str:
        what = (f"BlockTopK[bs={self.block_size} Hs={self.heads} Lq={self.lq}]"
                if self.masked else "TopK")
        return (f"{what} rows={self.rows} n={self.n} k={self.k} lanes={self.lanes} "
                f"grid={self.grid[0]}x{self.grid[1]}")
