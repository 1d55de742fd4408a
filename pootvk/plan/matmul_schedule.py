"""Matmul schedules: the request one MatMul/Linear eqn runs as, chosen by shape.

Three kernels (``pootvk.shaders.matmul`` generates them):

- ``GEMV_N`` (few rows, ``B[K, N]`` row-major, N contiguous): a workgroup owns ``lanes``
  16-byte words of N (``lanes * vec`` outputs) and all of K; its ``groups`` lane groups split
  K (group ``g`` takes rows ``g, g + groups, ...``). Lane ``i`` is ``(word i % lanes, group
  i / lanes)``, so a warp reads whole row segments; each lane issues ``unroll`` row loads per
  step (all in flight). The groups' partial sums fold with subgroup shuffles, then through
  workgroup memory.
- ``GEMV_T`` (few rows, ``B`` stored ``[N, K]``, K contiguous per output: the Linear layout):
  ``lanes`` adjacent lanes split one output's K row with 16-byte loads, ``groups`` groups per
  workgroup, each owning ``outs`` outputs; ``unroll`` words per output per step in flight;
  the dot products fold over the ``lanes`` with subgroup shuffles (workgroup memory past the
  subgroup or without shuffles).
- ``GEMM`` (many rows): ``tile_m x tile_n`` output tiles over ``TILE_K``-deep shared-memory
  tiles of A and B; every invocation keeps a 4x4 register block (four named vec4s).

Rows: when B has no batch (a weight), A's batch dims fold into its rows (A and the output
are contiguous), so ``x[B, S, K] @ W`` is one ``[B*S, K]`` product reading W once. Otherwise
batch dims broadcast through per-dim strides (0 where an operand is broadcast).

``vec`` is the elements one B load reads: 16 bytes (8 halves or 4 floats) where the
contiguous axis allows it, else the widest that divides it. Everything here is pure: shapes
and a ``DeviceProfile`` in, a frozen request (the pipeline-cache key) out. ``forced_matmul``
is the test and tuning hook (kind and fields for the plans made inside it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from enum import Enum

from ..errors import DtypeLowering, ShapeError
from ..ir import BF16, F16, F32, DType
from .bindings import Access, Binding
from .profile import DeviceProfile
from .requests import fold_grid


class MatMulKind(Enum):
    GEMV_N = "gemv_n"
    GEMV_T = "gemv_t"
    GEMM = "gemm"


#: Rows (after batch folding) up to which the GEMV kernels run; past it the tiled GEMM.
GEMV_MAX_ROWS = 8
TILE_K = 16
#: Floats of workgroup memory one reduction round may use (16 KiB fits every profile).
RED_FLOATS = 4096
#: Seed GEMV launch shape (not yet measured on a GPU: ``bench/gemv.py --tune`` times the
#: alternatives on one run, and the measured best replaces these, with its numbers in
#: BENCHMARKS.md). Workgroups per compute unit aimed for; invocations per workgroup (GPU, and
#: when even the narrowest N tile leaves units idle: more k groups keep more loads in flight
#: on the units that have work); loads per lane per loop step; lanes per output (GEMV_T).
GEMV_WAVES = 2
GEMV_LOCAL = 256
GEMV_LOCAL_FEW = 1024
GEMV_LOCAL_CPU = 64
GEMV_UNROLL = 4
GEMV_T_LANES = 32


@dataclass(frozen=True)
class MatMulRequest:
    """One matmul launch: ``y[batch, m, n] = a[batch, m, k] @ op(b)[batch, k, n]`` in F32."""

    kind: MatMulKind
    batch: tuple[int, ...]  # output batch dims (after folding rows)
    a_strides: tuple[int, ...]  # element strides of a per batch dim (0 = broadcast)
    b_strides: tuple[int, ...]  # element strides of the stored b per batch dim
    m: int
    k: int
    n: int
    transpose_b: bool  # b stored [.., n, k]
    b_dtype: DType
    vec: int  # b elements per load (along n for GEMV_N, along k for GEMV_T; 1 for GEMM)
    lanes: int  # GEMV_N: words of n per workgroup; GEMV_T: lanes per output
    groups: int  # GEMV_N: lane groups splitting k; GEMV_T: output groups per workgroup
    outs: int = 1  # GEMV_T: outputs per lane group
    unroll: int = 4  # GEMV: loads per lane per output per loop step
    subgroup: bool = False  # GEMV: fold partial sums with subgroup shuffles
    subgroup_size: int = 32
    tile_m: int = 64  # GEMM
    tile_n: int = 64  # GEMM
    grid: tuple[int, int] = (1, 1)
    #: a plain MatMul of 16-bit values reads a and writes y in 16 bits too (F32 arithmetic,
    #: the output rounded at its store); a Linear's are F32
    a_dtype: DType = F32
    out_dtype: DType = F32

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        return (Binding("a", Access.READ, self.a_dtype), Binding("b", Access.READ, self.b_dtype),
                Binding("y", Access.WRITE, self.out_dtype))

    @property
    def batch_size(self) -> int:
        out = 1
        for d in self.batch:
            out *= d
        return out

    @property
    def local_size(self) -> int:
        if self.kind is MatMulKind.GEMM:
            return (self.tile_m // 4) * (self.tile_n // 4)
        return self.lanes * self.groups

    @property
    def tiles(self) -> int:
        """Workgroups per batch element."""
        if self.kind is MatMulKind.GEMV_N:
            return -(-(self.n // self.vec) // self.lanes)
        if self.kind is MatMulKind.GEMV_T:
            return -(-self.n // (self.groups * self.outs))
        return -(-self.m // self.tile_m) * -(-self.n // self.tile_n)

    @property
    def workgroups(self) -> int:
        return max(1, self.batch_size * self.tiles)

    @property
    def b_bytes(self) -> int:
        """Bytes of B one launch reads (the GEMV benchmark's numerator)."""
        per = self.k * self.n * self.b_dtype.device_itemsize
        distinct = 1
        for d, s in zip(self.batch, self.b_strides, strict=True):
            distinct *= d if s else 1
        return per * distinct

    def describe(self) -> str:
        b = ",".join(map(str, self.batch))
        lay = "b^T" if self.transpose_b else "b"
        head = (f"matmul {self.kind.value} batch=[{b}] M={self.m} K={self.k} N={self.n} "
                f"{lay}:{self.b_dtype.value}")
        if self.a_dtype is not F32 or self.out_dtype is not F32:
            head += f" a:{self.a_dtype.value} y:{self.out_dtype.value}"
        if self.kind is MatMulKind.GEMM:
            tune = f"tile={self.tile_m}x{self.tile_n}x{TILE_K}"
        else:
            tune = (f"vec={self.vec} lanes={self.lanes} groups={self.groups} outs={self.outs} "
                    f"unroll={self.unroll} reduce={'subgroup' if self.subgroup else 'shared'}")
        return f"{head} {tune} wg={self.local_size} grid={self.grid[0]}x{self.grid[1]}"


# --- the forcing hook ------------------------------------------------------------------------


@dataclass(frozen=True)
class ForcedMatMul:
    kind: MatMulKind | None = None
    overrides: tuple[tuple[str, object], ...] = ()


_forced: ContextVar[ForcedMatMul] = ContextVar("pootvk_forced_matmul",
                                               default=ForcedMatMul())  # noqa: B039 (frozen)


@contextmanager
def forced_matmul(kind: MatMulKind | str | None = None, **overrides: object) -> Iterator[None]:
    """Plans made inside run every matmul as ``kind`` with the given request fields (tests
    reach every kernel on small shapes this way; ``bench/gemv.py --tune`` compares them)."""
    f = ForcedMatMul(None if kind is None else MatMulKind(kind),
                     tuple(sorted(overrides.items())))
    token = _forced.set(f)
    try:
        yield
    finally:
        _forced.reset(token)


# --- the chooser -------------------------------------------------------------------------------


def _pow2_floor(x: int) -> int:
    return 1 << (max(x, 1).bit_length() - 1)


def _vec(length: int, dtype: DType) -> int:
    """Elements per load along a contiguous axis of ``length``: 16 bytes where it divides."""
    widest = 8 if dtype in (F16, BF16) else 4
    v = widest
    while v > 1 and length % v:
        v //= 2
    return v


def _batch_layout(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], out_shape: tuple[int, ...],
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """(batch dims, a strides, b strides, rows m) with weight batches folded into rows."""
    r = len(out_shape) - 2
    m = a_shape[-2]
    batch = tuple(out_shape[:r])
    b_batch = tuple(b_shape[:-2])
    if all(d == 1 for d in b_batch):
        # B is one matrix: A's batch dims are rows (A and the output are contiguous
        # [.., M, K] and [.., M, N] with the same batch element count)
        rows = m
        for d in batch:
            rows *= d
        return (), (), (), rows

    def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
        mat = shape[-1] * shape[-2]
        dims = (1,) * (r - (len(shape) - 2)) + tuple(shape[:-2])
        out, acc = [], mat
        for d in reversed(dims):
            out.append(0 if d == 1 else acc)
            acc *= d
        return tuple(reversed(out))

    return batch, strides(a_shape), strides(b_shape), m


def choose_matmul(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], out_shape: tuple[int, ...],
    *, transpose_b: bool, b_dtype: DType, profile: DeviceProfile,
    a_dtype: DType = F32, out_dtype: DType = F32,
) -> MatMulRequest:
    """The request for ``a @ op(b)`` on ``profile`` (b's shape as stored)."""
    for dt in (a_dtype, b_dtype, out_dtype):
        if dt not in (F32, F16, BF16):
            raise DtypeLowering("MatMul", dt.value, "a float matmul kernel")
    k = a_shape[-1]
    n = out_shape[-1]
    if min(k, n, a_shape[-2]) < 1:
        raise ShapeError(f"MatMul {a_shape} @ {b_shape}: an empty axis has no kernel")
    batch, sa, sb, m = _batch_layout(a_shape, b_shape, out_shape)
    f = _forced.get()
    kind = f.kind
    if kind is None:
        kind = MatMulKind.GEMM if m > GEMV_MAX_ROWS else (
            MatMulKind.GEMV_T if transpose_b else MatMulKind.GEMV_N)
    if kind is not MatMulKind.GEMM and (kind is MatMulKind.GEMV_T) != transpose_b:
        need = "[N, K]" if kind is MatMulKind.GEMV_T else "[K, N]"
        raise ShapeError(f"{kind.value} reads b stored {need}; this b is stored "
                         f"{'[N, K]' if transpose_b else '[K, N]'}")
    base = MatMulRequest(kind=kind, batch=batch, a_strides=sa, b_strides=sb, m=m, k=k, n=n,
                         transpose_b=transpose_b, b_dtype=b_dtype, a_dtype=a_dtype,
                         out_dtype=out_dtype, vec=1, lanes=1, groups=1,
                         subgroup=profile.subgroup_shuffle,
                         subgroup_size=max(1, profile.subgroup_size))
    nb = max(1, base.batch_size)
    units = profile.compute_units or 8
    cpu = profile.device_type == "cpu"
    wg = min(GEMV_LOCAL_CPU if cpu else GEMV_LOCAL, profile.max_invocations)
    if kind is MatMulKind.GEMV_N:
        vec = _vec(n, b_dtype)
        words = n // vec
        # the widest row segment per workgroup that still gives every unit work
        lanes = 32
        while lanes > 2 and nb * -(-words // lanes) < GEMV_WAVES * units:
            lanes //= 2
        lanes = min(lanes, _pow2_floor(words))
        if not cpu and nb * -(-words // lanes) < units:
            wg = min(GEMV_LOCAL_FEW, profile.max_invocations)
        groups_max = max(1, min(_pow2_floor(k), wg))
        req = replace(base, vec=vec, lanes=lanes, groups=max(1, min(groups_max, wg // lanes)),
                      unroll=2 if cpu else GEMV_UNROLL)
    elif kind is MatMulKind.GEMV_T:
        vec = _vec(k, b_dtype)
        lanes = min(_pow2_floor(k // vec), 8 if cpu else GEMV_T_LANES)
        groups = max(1, wg // lanes)
        # fewer outputs per workgroup until every unit has work (N = 576: 8 -> 2 groups)
        while groups > 1 and nb * -(-n // groups) < GEMV_WAVES * units:
            groups //= 2
        outs = 2 if nb * -(-n // (groups * 2)) >= GEMV_WAVES * units else 1
        req = replace(base, vec=vec, lanes=lanes, groups=groups, outs=outs,
                      unroll=2 if cpu or outs > 1 else GEMV_UNROLL)
    else:
        tm = 64 if m > 32 else 32
        req = replace(base, tile_m=tm, tile_n=64 if n > 32 else 32)
    if f.overrides:
        req = replace(req, **dict(f.overrides))
    if req.subgroup and req.local_size % req.subgroup_size:
        req = replace(req, subgroup=False)  # a partial subgroup: shuffles would read idle lanes
    check_matmul(req, profile)
    return replace(req, grid=fold_grid(req.workgroups, profile.max_grid))


def check_matmul(r: MatMulRequest, profile: DeviceProfile) -> None:
    """What the generator relies on; a forced field that breaks it fails here, typed."""
    def p2(x: int) -> bool:
        return x >= 1 and x & (x - 1) == 0

    if r.kind is MatMulKind.GEMM:
        if r.tile_m % 4 or r.tile_n % 4 or r.local_size > profile.max_invocations:
            raise ShapeError(f"GEMM tile {r.tile_m}x{r.tile_n}: multiples of 4, "
                             f"<= {profile.max_invocations} invocations")
        return
    axis = r.n if r.kind is MatMulKind.GEMV_N else r.k
    if axis % r.vec or not p2(r.vec) or r.vec > (8 if r.b_dtype in (F16, BF16) else 4):
        raise ShapeError(f"{r.kind.value}: vec={r.vec} does not divide {axis}")
    if not (p2(r.lanes) and p2(r.groups) and r.outs >= 1 and r.unroll >= 1):
        raise ShapeError(f"{r.kind.value}: lanes={r.lanes}, groups={r.groups} must be powers "
                         "of two; outs, unroll >= 1")
    if r.local_size > profile.max_invocations:
        raise ShapeError(f"{r.kind.value}: {r.local_size} invocations > "
                         f"{profile.max_invocations}")
    if r.subgroup and not p2(r.subgroup_size):
        raise ShapeError(f"subgroup size {r.subgroup_size} is not a power of two")
