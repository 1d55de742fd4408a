"""Kernel requests: hashable descriptions of one generated kernel, the pipeline-cache key.

A request names everything its generated source depends on (shapes, score transform, mask
kind, schedule) and nothing that changes per step, so equal requests share SPIR-V and
pipelines, and one recording stays valid for every step.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GridLimit
from ..ir import DType, Params

Aval = tuple[tuple[int, ...], DType]


@dataclass(frozen=True)
class LiteralOperand:
    value: float | int | bool
    dtype: DType


def tile_bytes(tile: int, dk: int, dv: int, lanes: int) -> int:
    """Bytes of the cooperative form's staging: K and V rows (padded by one vec4 so rows
    fall in different banks) for ``tile`` keys, and one partial dot per thread."""
    if not tile:
        return 0
    return tile * ((dk // 4 + 1) + (dv // 4 + 1)) * 16 + lanes * 4


@dataclass(frozen=True)
class AttentionRequest:
    """The streaming attention kernel: one workgroup of ``lanes`` per (batch, head, row)."""

    b: int
    hq: int
    hkv: int
    lq: int
    lk: int
    dk: int
    dv: int
    scale: float
    softcap: float | None
    mask: tuple[int, int, int] | None  # the mask's (B, H, Lq) extents (1 = broadcast)
    lanes: int
    vec: int  # 4: q/k/v/out read as vec4 (dk and dv multiples of 4), else 1
    grid: tuple[int, int]
    tile: int = 0  # 0: each lane loads its own keys; > 0: keys staged `tile` at a time

    @property
    def group(self) -> int:
        """Threads that cooperate on one key of a staged tile (cooperative form)."""
        return self.lanes // self.tile if self.tile else 1

    family = "attention"

    @property
    def n_rep(self) -> int:
        return self.hq // self.hkv

    @property
    def workgroups(self) -> int:
        return self.b * self.hq * self.lq

    @property
    def local_size(self) -> int:
        return self.lanes

    @property
    def shared_bytes(self) -> int:
        """Workgroup memory: the lanes' running state, plus the staged tiles when cooperative."""
        return self.lanes * (self.dv + 2) * 4 + tile_bytes(self.tile, self.dk, self.dv, self.lanes)

    def describe(self) -> str:
        m = "none" if self.mask is None else "x".join(map(str, self.mask))
        cap = "" if self.softcap is None else f" softcap={self.softcap:g}"
        return (
            f"attention B={self.b} Hq={self.hq} Hkv={self.hkv} Lq={self.lq} Lk={self.lk} "
            f"Dk={self.dk} Dv={self.dv} scale={self.scale:.6g}{cap} mask={m} "
            f"lanes={self.lanes} vec={self.vec} tile={self.tile} "
            f"grid={self.grid[0]}x{self.grid[1]}"
        )


@dataclass(frozen=True)
class PrimRequest:
    """A primitive kernel: one invocation per output element (per update element for DUS)."""

    prim: str
    params: Params
    inputs: tuple[Aval | LiteralOperand, ...]
    output: Aval
    threads: int
    local_size: int
    grid: tuple[int, int]

    family = "prim"

    def describe(self) -> str:
        ps = " ".join(f"{k}={v}" for k, v in self.params.items())
        shape = ",".join(map(str, self.output[0]))
        return (
            f"{self.prim}{'[' + ps + ']' if ps else ''} -> {self.output[1].value}[{shape}] "
            f"threads={self.threads} wg={self.local_size} grid={self.grid[0]}x{self.grid[1]}"
        )


KernelRequest = AttentionRequest | PrimRequest


def fold_grid(groups: int, max_grid: tuple[int, int, int]) -> tuple[int, int]:
    """Lay ``groups`` workgroups over X, or over a 2-D grid when X alone is too small.

    The kernel computes ``id = gid.y * gx + gid.x`` and returns when ``id >= groups``.
    """
    max_x, max_y = max_grid[0], max_grid[1]
    groups = max(groups, 1)
    if groups <= max_x:
        return groups, 1
    gy = -(-groups // max_x)
    if gy > max_y:
        raise GridLimit(groups, max_x, max_y)
    return -(-groups // gy), gy
