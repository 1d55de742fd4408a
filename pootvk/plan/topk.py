"""The kernel request of the selection primitives TopK and BlockTopK (``shaders.topk``).

Both run one kernel: one workgroup per row of the last axis, a parallel radix selection of
the row's K-th largest order key, then a compaction that writes the chosen indices in
ascending order. The request names its variant (part of the plan key): the row held in
registers or streamed from memory each pass, the prefix sums on subgroup shuffles or
through workgroup memory. BlockTopK is the same kernel with its masking folded in (NaN
and incomplete blocks read as -inf, a picked incomplete block written as -1), so the
scores are read where they lie and no masked copy is ever stored. The plan rules are in
``plan.topk_rules`` (this module imports no rules, so ``plan.rules`` can name the request
in ``KernelRequest``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ShapeError
from ..ir import F32, I32
from .bindings import Access, Binding

#: bits of the key one radix pass resolves (256 histogram bins in workgroup memory)
RADIX_BITS = 8
#: histogram buffers in workgroup memory: pass p counts into buffer p % 3 while it clears
#: buffer (p + 1) % 3, so no barrier separates a pass's clearing from its counting
HIST_BUFFERS = 3
#: words of one histogram buffer: the bins, one pad word after every 32 (bank-conflict
#: free reads of contiguous runs of bins by the lanes of a subgroup)
HIST_WORDS = (1 << RADIX_BITS) + (1 << RADIX_BITS) // 32
#: the narrowest subgroup the subgroup variant uses (its lanes read 256 / size bins each)
MIN_SUBGROUP = 4


def subgroup_fits(size: int) -> bool:
    """Whether subgroups of ``size`` lanes serve the subgroup variant: a power of two
    between ``MIN_SUBGROUP`` and the histogram's bins (each lane sums 256 / size bins)."""
    return MIN_SUBGROUP <= size <= 1 << RADIX_BITS and size & (size - 1) == 0


@dataclass(frozen=True)
class TopKRequest:
    """TopK over ``rows`` rows of ``n`` f32 values -> ``k`` i32 indices per row, ascending.

    A workgroup of ``lanes`` (a power of two) per row; rows past the X grid limit fold over
    a 2-D ``grid`` (``fold_grid``). ``per_lane`` > 0: lane l holds keys ``l * per_lane ..``
    of its row in registers (named scalars), read from memory once (``lanes * per_lane >=
    n``); 0: every radix pass re-reads the row from the buffer. ``subgroup``: the prefix
    sums run on subgroup shuffles, the device's ``subgroup_size`` lanes at a time (the
    profile's ``subgroup_shuffle``; ``lanes`` a multiple of it); else through workgroup
    memory (log2(lanes) barriers a scan). ``block_size`` > 0 makes it BlockTopK: row ``r`` is
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
    per_lane: int = 0  # > 0: keys a lane holds in registers; 0: streamed from memory
    subgroup: bool = False  # prefix sums on subgroup shuffles (else workgroup memory)
    subgroup_size: int = 0  # the device's subgroup size the subgroup variant assumes

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.n:
            raise ShapeError(f"TopK k={self.k} is not in [1, {self.n}]")
        if self.lanes < 1 or self.lanes & (self.lanes - 1):
            raise ShapeError(f"TopK lanes={self.lanes} is not a power of two")
        if self.block_size < 0 or self.rows % (self.heads * self.lq):
            raise ShapeError(f"BlockTopK rows={self.rows} are not [B, Hs={self.heads}, "
                             f"Lq={self.lq}] (block_size={self.block_size})")
        if self.per_lane < 0 or (self.per_lane and self.lanes * self.per_lane < self.n):
            raise ShapeError(f"TopK {self.lanes} lanes x {self.per_lane} keys do not hold "
                             f"a row of {self.n}")
        sg = self.subgroup_size
        if self.subgroup and not (subgroup_fits(sg) and self.lanes % sg == 0):
            raise ShapeError(f"TopK subgroup variant: subgroups of {sg} lanes do not tile "
                             f"{self.lanes} lanes and {1 << RADIX_BITS} bins")

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
    def subgroups(self) -> int:
        """Subgroups of a workgroup (subgroup variant; 0 otherwise)."""
        return self.lanes // self.subgroup_size if self.subgroup else 0

    @property
    def shared_bytes(self) -> int:
        """Workgroup memory: the histogram buffers, then the subgroups' scan totals
        (subgroup variant) or the lanes' scan pairs and each pass's chosen bin."""
        scan = self.subgroups * 8 if self.subgroup else self.lanes * 8 + (32 // RADIX_BITS) * 8
        return HIST_BUFFERS * HIST_WORDS * 4 + scan + 16

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        qpos = (Binding("qpos", Access.READ, I32),) if self.masked else ()
        return (Binding("x", Access.READ, F32), *qpos, Binding("y", Access.WRITE, I32))

    def describe(self) -> str:
        what = (f"BlockTopK[bs={self.block_size} Hs={self.heads} Lq={self.lq}]"
                if self.masked else "TopK")
        keys = f"regs={self.per_lane}" if self.per_lane else "stream"
        scan = f"subgroup{self.subgroup_size}" if self.subgroup else "shared"
        return (f"{what} rows={self.rows} n={self.n} k={self.k} lanes={self.lanes} {keys} "
                f"{scan} grid={self.grid[0]}x{self.grid[1]}")
