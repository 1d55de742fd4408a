"""Matmul schedules: the request one MatMul/Linear eqn runs as, chosen by shape.

Three kernels (``pootvk.shaders.matmul`` generates them):

- ``GEMV_N`` (few rows, ``B[K, N]`` row-major, N contiguous): a workgroup owns ``lanes``
  16-byte words of N (``lanes * vec`` outputs) and all of K; its ``groups`` lane groups split
  K (group ``g`` takes rows ``g, g + groups, ...``). Lane ``i`` is ``(word i % lanes, group
  i / lanes)``, so a warp reads whole row segments; each lane issues ``unroll`` row loads per
  step (all in flight). The groups' partial sums fold with subgroup shuffles, then through
  workgroup memory. With ``splits > 1`` the workgroups also split K into contiguous slices
  (one per (tile, slice)) and write F32 partials to declared scratch; a second launch
  (``MatMulCombineRequest``) sums them: wide row segments (long DRAM runs) with a full grid.
- ``GEMV_T`` (few rows, ``B`` stored ``[N, K]``, K contiguous per output: the Linear layout):
  ``lanes`` adjacent lanes split one output's K row with 16-byte loads, ``groups`` groups per
  workgroup, each owning ``outs`` outputs; ``unroll`` words per output per step in flight;
  the dot products fold over the ``lanes`` with subgroup shuffles (workgroup memory past the
  subgroup or without shuffles).
- ``GEMM`` (many rows): a SIMT GEMM. A workgroup owns a ``tile_m x tile_n`` output tile and
  walks K in ``tile_k``-deep steps; each step's A and B tiles go global -> registers
  (vector loads: ``a_vec`` floats of A along K, ``vec`` elements of B along its contiguous
  axis, 16-bit words widened to F32 at the shared store) -> shared memory, both stored
  K-major (A transposed) with a vec4 of padding per row, double-buffered (the next step's
  loads are in flight while the current step computes; one barrier per step). Every
  invocation keeps a ``thread_m x thread_n`` register block (named vec4s) and reads vec4s of
  A and B from shared memory per k. Edge tiles load zeros (predicated, clamped addresses).
  ``splits > 1`` cuts K into ``tile_k``-aligned slices like GEMV_N's split-K.

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
from ..ir import BF16, F16, F32, DType, LinearPrologue
from ..ir.fused import FusedBody
from ..ir.linear_form import GEMV_MAX_ROWS as _GEMV_MAX_ROWS
from .bindings import Access, Binding
from .profile import DeviceProfile
from .requests import fold_grid


class MatMulKind(Enum):
    GEMV_N = "gemv_n"
    GEMV_T = "gemv_t"
    GEMM = "gemm"


#: Rows (after batch folding) up to which the GEMV kernels run; past it the tiled GEMM (the
#: IR's contract: passes.linear_fuse gives only these a prologue)
GEMV_MAX_ROWS = _GEMV_MAX_ROWS
#: GEMM defaults: K-step depth (8 where two buffers of 16-deep tiles overflow workgroup
#: memory), and the (tile_m, tile_n, thread_m, thread_n) shapes the GPU rule walks from the
#: largest down until the grid fills ``GEMM_FILL`` of the compute units (the H200 tune run,
#: ``bench/gemv.py --gemm --tune``, has not yet confirmed these).
TILE_K = 16
GEMM_TILES = ((128, 128, 8, 8), (128, 64, 8, 4), (64, 64, 4, 4), (64, 32, 4, 4), (32, 32, 4, 4))
GEMM_FILL = 0.75
#: split K when even the smallest tile leaves the grid under GEMM_FILL and each slice keeps
#: at least this many K steps
GEMM_SPLIT_MIN_STEPS = 16
#: floats of padding per shared row (one vec4 keeps rows 16-byte aligned, shifts banks)
GEMM_PAD = 4
#: Floats of workgroup memory one reduction round may use (16 KiB fits every profile).
RED_FLOATS = 4096
#: GEMV launch shapes. The CPU (lavapipe) keeps the seed shapes: a small workgroup, 2 loads
#: in flight. The GPU rule (``_gemv_n_gpu``, ``_gemv_t_gpu``) is fitted to one H200 run of
#: ``bench/gemv.py --tune`` (gemv_h200.json, 2026-11-29: 16 cases, (K, N) in (576, 1536),
#: (4096, 4096), (4096, 14336), (8192, 28672), F16 and F32, both layouts, 16-24 variants
#: each, read ceiling 4514 GB/s); the comments there cite the timings that decide each field.
GEMV_WAVES = 2
GEMV_LOCAL = 256
GEMV_LOCAL_FEW = 1024
GEMV_LOCAL_CPU = 64
GEMV_T_LANES = 32
#: GEMV_N on a GPU: outputs per workgroup before widening (32 elements: 128 B of F32 or 64 B
#: of F16 per row segment), the widest row segment (one 128-byte cache line), the workgroups
#: per unit that widening must leave, rows each lane at least sums, loads in flight per lane.
GEMV_N_OUTPUTS = 32
GEMV_N_SEGMENT_BYTES = 128
GEMV_N_WIDE_WAVES = 3
GEMV_N_MIN_ROWS = 4
GEMV_N_UNROLL = 8
#: 16-bit GEMV_N whose 128-byte-line tiles give 1 to GEMV_N_WIDE_WAVES workgroups per unit
#: split K until about this many workgroups per unit (see _gemv_n_gpu)
GEMV_N_SPLIT_WAVES = 4
#: GEMV_T on a GPU: output groups (of ``lanes``) per workgroup; loads in flight per lane
#: for 16-bit and for F32 words.
GEMV_T_GROUPS = 4
#: GEMV_T on a GPU: vector words each lane reads of an output row at least; rows of fewer
#: than ``GEMV_T_LANES * GEMV_T_MIN_WORDS`` words get narrower lane groups (more rows per
#: workgroup, the same ``GEMV_T_GROUPS * GEMV_T_LANES`` invocations)
GEMV_T_MIN_WORDS = 8
GEMV_T_UNROLL_16 = 4
GEMV_T_UNROLL_32 = 2


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
    tile_m: int = 64  # GEMM: output tile rows / columns per workgroup, K-step depth
    tile_n: int = 64
    tile_k: int = TILE_K
    thread_m: int = 4  # GEMM: register block per invocation (multiples of 4)
    thread_n: int = 4
    a_vec: int = 1  # GEMM: A floats per load along K
    grid: tuple[int, int] = (1, 1)
    #: a plain MatMul of 16-bit values reads a and writes y in 16 bits too (F32 arithmetic,
    #: the output rounded at its store); a Linear's are F32
    a_dtype: DType = F32
    out_dtype: DType = F32
    #: GEMV_N split-K: the K rows cut into ``splits`` contiguous slices, one workgroup per
    #: (tile, slice); > 1 writes F32 partials ``part[batch, split, m, n]`` (declared scratch)
    #: that a ``MatMulCombineRequest`` sums, so wide row segments still fill the device
    splits: int = 1
    #: a Linear's prologue (``ir.linear_form``): A computed on load from operands ``pa{j}``
    #: of dtypes ``pro_dtypes`` (GEMV kinds only: a row form reduces whole rows of K)
    prologue: LinearPrologue | None = None
    pro_dtypes: tuple[DType, ...] = ()
    #: a Linear's epilogue: each output from the F32 sum and operands ``ye{j}`` of dtypes
    #: ``epi_dtypes``, run where the final value is stored (the combine, with splits)
    epilogue: FusedBody | None = None
    epi_dtypes: tuple[DType, ...] = ()

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def a_bindings(self) -> tuple[Binding, ...]:
        if self.prologue is None:
            return (Binding("a", Access.READ, self.a_dtype),)
        return tuple(Binding(f"pa{j}", Access.READ, d) for j, d in enumerate(self.pro_dtypes))

    def epi_bindings(self) -> tuple[Binding, ...]:
        return tuple(Binding(f"ye{j}", Access.READ, d) for j, d in enumerate(self.epi_dtypes))

    def bindings(self) -> tuple[Binding, ...]:
        """A side (``a`` or the prologue's operands), ``b``, then the epilogue's operands and
        ``y`` (a split launch: only ``part``; its combine reads the epilogue's)."""
        if self.splits > 1:
            return (*self.a_bindings(), Binding("b", Access.READ, self.b_dtype),
                    Binding("part", Access.WRITE, F32))
        return (*self.a_bindings(), Binding("b", Access.READ, self.b_dtype),
                *self.epi_bindings(), Binding("y", Access.WRITE, self.out_dtype))

    @property
    def k_chunk(self) -> int:
        """Rows of K one split sums (the last split may sum fewer; a GEMM slice is a whole
        number of ``tile_k`` steps, so vector loads never straddle slices)."""
        c = -(-self.k // self.splits)
        if self.kind is MatMulKind.GEMM:
            c = -(-c // self.tile_k) * self.tile_k
        return c

    @property
    def gemm_shared_floats(self) -> int:
        """Floats of workgroup memory the GEMM uses: two buffers of the padded K-major A
        and B tiles."""
        return 2 * self.tile_k * (self.tile_m + self.tile_n + 2 * GEMM_PAD)

    @property
    def partial_floats(self) -> int:
        """F32 partials a split launch writes (0 without splits)."""
        return 0 if self.splits == 1 else self.batch_size * self.splits * self.m * self.n

    @property
    def batch_size(self) -> int:
        out = 1
        for d in self.batch:
            out *= d
        return out

    @property
    def local_size(self) -> int:
        if self.kind is MatMulKind.GEMM:
            return (self.tile_m // self.thread_m) * (self.tile_n // self.thread_n)
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
        return max(1, self.batch_size * self.tiles * self.splits)

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
            tune = (f"tile={self.tile_m}x{self.tile_n}x{self.tile_k} "
                    f"thread={self.thread_m}x{self.thread_n} vec={self.vec} a_vec={self.a_vec}")
            if self.splits > 1:
                tune += f" splits={self.splits}"
        else:
            tune = (f"vec={self.vec} lanes={self.lanes} groups={self.groups} outs={self.outs} "
                    f"unroll={self.unroll} reduce={'subgroup' if self.subgroup else 'shared'}")
            if self.splits > 1:
                tune += f" splits={self.splits}"
        out = f"{head} {tune} wg={self.local_size} grid={self.grid[0]}x{self.grid[1]}"
        if self.prologue is not None:
            out += f" a={self.prologue.describe()}"
        if self.epilogue is not None and self.splits == 1:
            out += f" y={self.epilogue}"
        return out


#: Invocations per workgroup of the split-K combine.
COMBINE_LOCAL = 64


@dataclass(frozen=True)
class MatMulCombineRequest:
    """The second launch of a split-K GEMV_N: one invocation per output element sums the
    ``splits`` F32 partials in split order and stores ``out_dtype``."""

    partial: MatMulRequest
    grid: tuple[int, int] = (1, 1)

    @property
    def outputs(self) -> int:
        p = self.partial
        return p.batch_size * p.m * p.n

    @property
    def workgroups(self) -> int:
        return -(-self.outputs // COMBINE_LOCAL)

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        return (Binding("part", Access.READ, F32), *self.partial.epi_bindings(),
                Binding("y", Access.WRITE, self.partial.out_dtype))

    def describe(self) -> str:
        p = self.partial
        epi = f" y={p.epilogue}" if p.epilogue is not None else ""
        return (f"matmul_combine outputs={self.outputs} splits={p.splits} "
                f"y:{p.out_dtype.value} grid={self.grid[0]}x{self.grid[1]}{epi}")


def combine_request(r: MatMulRequest, profile: DeviceProfile) -> MatMulCombineRequest:
    """The combine launch of split request ``r``."""
    c = MatMulCombineRequest(r)
    return replace(c, grid=fold_grid(c.workgroups, profile.max_grid))


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


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (max(1, x) - 1).bit_length())


def _gemv_n_gpu(base: MatMulRequest, nb: int, units: int,
                profile: DeviceProfile) -> MatMulRequest:
    """GEMV_N launch shape on a GPU, fitted to the H200 tune run (module constants).

    Times are the H200's, relative to the best variant of the case (lanes/groups/unroll):

    - *lanes*: 32 outputs per workgroup (F32: 8 words = a 128-byte line per row; F16: 4
      words = 64 B); F16 widens to the 128-byte line when that still leaves >= 3 workgroups
      per unit: 8192x28672 F16 (448 tiles) 8/128 = 1.00 against 4/x >= 1.20, while at
      4096x14336 F16 (224 tiles) 8/128 is 1.06 and 4/256 the best. Past one line nothing
      measured faster (the old default 16 lanes: 8192x28672 F32 at 83% against 98%). Halved
      while fewer than half the units get a tile (576x1536 F32: 48 tiles at 8 lanes 1.07, 96
      at 4 lanes 1.00).
    - *workgroup size*: 1024 invocations (k groups keep loads in flight when tiles are few,
      and hide the F16 unpacking: 8192x28672 F16 wg 256 is 1.09), except F32 words with >= 3
      tiles per unit: 256 (4096x14336 and 8192x28672 F32: 8/32 = 1.00, 8/128 = 1.04, 1.07).
    - *groups* <= K / 4: a lane sums at least 4 rows, else the fold outweighs the loads
      (576x1536: groups 256 at 1.07-1.18, 128 the best).
    - *unroll* 8: the best or within 3.4% everywhere (4 is 1.05-1.07 on the large F32).

    Against the run, the rule's pick is within 1.01 of the best at the six large cases and
    1.034 / 1.039 at 576x1536 F32 / F16 (where the F16 variants ran at a throttled 540 MHz).

    - *split-K* for 16-bit weights whose 128-byte-line tiles give between one and
      GEMV_N_WIDE_WAVES workgroups per unit: keep the wide line and cut K into slices until
      about GEMV_N_SPLIT_WAVES workgroups per unit (F32 partials, a combine launch). H200,
      one run (bench/gemv.py --tune): 4096x14336 F16, 224 tiles: 8 lanes, 32 groups, 4 splits
      34.6 us (75% of the read ceiling) against 41.1 us (63%) for the best unsplit launch
      (4 lanes, 256 groups) and 36.5 us at 8 splits. Fewer tiles than units (4096x4096 F16:
      64) keep the narrow unsplit launch (71%), more than GEMV_N_WIDE_WAVES per unit
      (8192x28672 F16: 448) the wide unsplit one (79%): neither has a measured split yet.
    """
    b_dtype = base.b_dtype
    vec = _vec(base.n, b_dtype)
    words = base.n // vec
    wbytes = vec * b_dtype.device_itemsize

    def tiles(lanes: int) -> int:
        return nb * -(-words // lanes)

    lanes = max(1, GEMV_N_OUTPUTS // vec)
    wide = max(lanes, GEMV_N_SEGMENT_BYTES // wbytes)
    if tiles(wide) >= GEMV_N_WIDE_WAVES * units:
        lanes = wide
    while lanes > 1 and 2 * tiles(lanes) < units:
        lanes //= 2
    lanes = min(lanes, _pow2_floor(words))
    wg = GEMV_LOCAL_FEW
    if b_dtype is F32 and tiles(lanes) >= GEMV_N_WIDE_WAVES * units:
        wg = GEMV_LOCAL
    wg = min(wg, profile.max_invocations)
    groups = max(1, min(wg // lanes, _pow2_floor(base.k // GEMV_N_MIN_ROWS)))
    splits = 1
    if b_dtype is not F32 and units <= tiles(wide) < GEMV_N_WIDE_WAVES * units:
        lanes, wg = wide, min(GEMV_LOCAL, profile.max_invocations)
        splits = _pow2_ceil(-(-GEMV_N_SPLIT_WAVES * units // tiles(wide)))
        groups = max(1, min(wg // lanes, _pow2_floor(base.k // (splits * GEMV_N_MIN_ROWS))))
        splits = max(1, min(splits, base.k // (groups * GEMV_N_MIN_ROWS)))
    return replace(base, vec=vec, lanes=lanes, groups=groups, unroll=GEMV_N_UNROLL,
                   splits=splits)


def _gemv_t_gpu(base: MatMulRequest, nb: int, units: int,
                profile: DeviceProfile) -> MatMulRequest:
    """GEMV_T launch shape on a GPU, fitted to the H200 tune run (module constants).

    Times relative to each case's best (lanes/groups/outs/unroll):

    - *outs* 1: two outputs per group were slower in every case (1.02-1.60; 4096x14336 F16
      32/4/2/4 = 1.20 against 32/4/1/4 = 1.00): one output's row per lane group keeps its
      loads contiguous and the grid twice as wide.
    - *lanes* 32 (a subgroup per output row: 512 contiguous bytes per load round): 16 lanes
      are within 1% only at the two largest F32 cases and lose 1.04-1.14 elsewhere, but
      4096x4096 F16, whose 33.6 MB stay in the 60 MB L2
      between the benchmark's back-to-back replays (16/8/1/4 = 1.00, 32/4/1/4 = 1.10). In a
      decode step the other layers' weights evict it, so the rule keeps the DRAM choice.
    - *groups* 4 (128 invocations): 8 groups are within 1.5% except 4096x4096 F32 (1.05).
    - *unroll* 4 for 16-bit words (2 is 1.045 and 1.03 at 4096x14336 and 8192x28672 F16),
      2 for F32 (4 is 1.03 at 4096x4096 F32), capped at the words one lane reads.
    - *short rows*: at K=576 F16 (72 16-byte words a row) 32 lanes read 2.25 words each and
      wait on latency (one H200 run of ``bench/prologue_gemv.py``, RMSNorm prologue, lanes x
      groups): the LM head (N=49152, 56.6 MB) 68.9 us at 32 x 4, 38.8 at 16 x 8, **24.8 at
      8 x 16**; but with few rows the workgroups get too few: N=3072 9.7 / **7.0** / 7.4 us,
      N=960 **6.05** (32 x 4, 240 workgroups) / 6.08 / 7.1 and 6.5 at the old 32 x 2; N=576
      **6.05** / 6.05 / 7.1; K=1536 N=576 8.6 at 32 x 2, 8.9 at 32 x 4. So a lane group starts
      at ``GEMV_T_MIN_WORDS`` words a lane, the workgroup keeping its 128 invocations in more
      rows, and widens back (fewer rows a workgroup) until there are ``GEMV_WAVES`` per unit;
      then, where it started narrower, workgroups halve only below one per unit.
    """
    b_dtype = base.b_dtype
    vec = _vec(base.k, b_dtype)
    kw = base.k // vec
    lanes = min(_pow2_floor(max(1, kw // GEMV_T_MIN_WORDS)), GEMV_T_LANES)
    invocations = min(GEMV_T_GROUPS * GEMV_T_LANES, profile.max_invocations)
    groups = max(1, invocations // lanes)
    short = lanes < GEMV_T_LANES

    def workgroups(g: int) -> int:
        return nb * -(-base.n // g)

    while lanes < GEMV_T_LANES and groups > 1 and workgroups(groups) < GEMV_WAVES * units:
        lanes, groups = lanes * 2, groups // 2
    # fewer outputs per workgroup until every unit has work
    floor = units if short else GEMV_WAVES * units
    while groups > 1 and workgroups(groups) < floor:
        groups //= 2
    unroll = GEMV_T_UNROLL_32 if b_dtype is F32 else GEMV_T_UNROLL_16
    unroll = max(1, min(unroll, _pow2_floor(max(1, kw // lanes))))
    return replace(base, vec=vec, lanes=lanes, groups=groups, outs=1, unroll=unroll)


def _fit_tile_k(r: MatMulRequest, profile: DeviceProfile) -> MatMulRequest:
    """Halve the K step (not below 8) until both buffers fit workgroup memory."""
    while r.tile_k > 8 and 4 * r.gemm_shared_floats > profile.max_workgroup_memory:
        r = replace(r, tile_k=r.tile_k // 2)
    return r


def _gemm(base: MatMulRequest, nb: int, units: int, cpu: bool,
          profile: DeviceProfile) -> MatMulRequest:
    """GEMM tile shape: on a GPU the largest ``GEMM_TILES`` shape whose grid fills
    ``GEMM_FILL`` of the units (512x576x1536: 64x64, 192 workgroups; 512x4096x4096:
    128x128, 128), split-K when even 32x32 does not and K is deep; on the CPU 32x32 tiles
    of 64 invocations (lavapipe runs a workgroup per core; small tiles waste less on edges).
    Vector widths: the widest 16-byte-or-less load dividing the contiguous axis."""
    k, n, m = base.k, base.n, base.m
    a_vec = _vec(k, F32) if base.a_dtype is F32 else 1
    vec = min(_vec(k if base.transpose_b else n, base.b_dtype), 8)
    req = replace(base, a_vec=a_vec, vec=vec)

    def wgs(t: tuple[int, int, int, int]) -> int:
        return nb * -(-m // t[0]) * -(-n // t[1])

    if cpu:
        shape = (32, 32, 4, 4)
    else:
        fits = [t for t in GEMM_TILES
                if (t[0] // t[2]) * (t[1] // t[3]) <= profile.max_invocations
                and 4 * 2 * 8 * (t[0] + t[1] + 2 * GEMM_PAD) <= profile.max_workgroup_memory]
        shape = next((t for t in fits if wgs(t) >= GEMM_FILL * units), fits[-1])
    req = replace(req, tile_m=shape[0], tile_n=shape[1], thread_m=shape[2],
                  thread_n=shape[3], tile_k=TILE_K if not cpu else 8)
    req = _fit_tile_k(req, profile)
    if not cpu and wgs(shape) < GEMM_FILL * units:
        splits = 1
        while (wgs(shape) * splits * 2 <= units
               and k // (splits * 2) >= GEMM_SPLIT_MIN_STEPS * req.tile_k):
            splits *= 2
        req = replace(req, splits=splits)
    return req


def choose_matmul(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], out_shape: tuple[int, ...],
    *, transpose_b: bool, b_dtype: DType, profile: DeviceProfile,
    a_dtype: DType = F32, out_dtype: DType = F32,
    prologue: LinearPrologue | None = None, pro_dtypes: tuple[DType, ...] = (),
    epilogue: FusedBody | None = None, epi_dtypes: tuple[DType, ...] = (),
) -> MatMulRequest:
    """The request for ``a @ op(b)`` on ``profile`` (b's shape as stored; a Linear's
    prologue and epilogue ride along: they do not change the schedule)."""
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
                         prologue=prologue, pro_dtypes=pro_dtypes, epilogue=epilogue,
                         epi_dtypes=epi_dtypes,
                         subgroup=profile.subgroup_shuffle,
                         subgroup_size=max(1, profile.subgroup_size))
    nb = max(1, base.batch_size)
    units = profile.compute_units or 8
    cpu = profile.device_type == "cpu"
    wg = min(GEMV_LOCAL_CPU if cpu else GEMV_LOCAL, profile.max_invocations)
    if kind is MatMulKind.GEMV_N and not cpu:
        req = _gemv_n_gpu(base, nb, units, profile)
    elif kind is MatMulKind.GEMV_N:
        vec = _vec(n, b_dtype)
        words = n // vec
        # the widest row segment per workgroup that still gives every unit work
        lanes = 32
        while lanes > 2 and nb * -(-words // lanes) < GEMV_WAVES * units:
            lanes //= 2
        lanes = min(lanes, _pow2_floor(words))
        groups_max = max(1, min(_pow2_floor(k), wg))
        req = replace(base, vec=vec, lanes=lanes, groups=max(1, min(groups_max, wg // lanes)),
                      unroll=2)
    elif kind is MatMulKind.GEMV_T and not cpu:
        req = _gemv_t_gpu(base, nb, units, profile)
    elif kind is MatMulKind.GEMV_T:
        vec = _vec(k, b_dtype)
        lanes = min(_pow2_floor(k // vec), 8)
        groups = max(1, wg // lanes)
        # fewer outputs per workgroup until every unit has work (N = 576: 8 -> 2 groups)
        while groups > 1 and nb * -(-n // groups) < GEMV_WAVES * units:
            groups //= 2
        outs = 2 if nb * -(-n // (groups * 2)) >= GEMV_WAVES * units else 1
        req = replace(base, vec=vec, lanes=lanes, groups=groups, outs=outs, unroll=2)
    else:
        req = _gemm(base, nb, units, cpu, profile)
    if prologue is not None and req.splits > 1:  # a prologue's row reduction needs all of K
        req = replace(req, splits=1)
    if f.overrides:
        req = replace(req, **dict(f.overrides))
        if req.kind is MatMulKind.GEMM and "tile_k" not in dict(f.overrides):
            req = _fit_tile_k(req, profile)
    if req.subgroup and req.local_size % req.subgroup_size:
        req = replace(req, subgroup=False)  # a partial subgroup: shuffles would read idle lanes
    check_matmul(req, profile)
    return replace(req, grid=fold_grid(req.workgroups, profile.max_grid))


def check_matmul(r: MatMulRequest, profile: DeviceProfile) -> None:
    """What the generator relies on; a forced field that breaks it fails here, typed."""
    def p2(x: int) -> bool:
        return x >= 1 and x & (x - 1) == 0

    if r.prologue is not None and (r.kind is MatMulKind.GEMM or r.splits > 1):
        raise ShapeError(f"{r.kind.value} (splits={r.splits}): a Linear prologue runs in an "
                         "unsplit GEMV (it recomputes A's whole rows per workgroup)")

    if r.kind is MatMulKind.GEMM:
        wa = 4 if r.a_dtype is F32 else 1
        wb = 4 if r.b_dtype is F32 else 8
        cont = r.k if r.transpose_b else r.n
        if (r.thread_m % 4 or r.thread_n % 4 or r.tile_m % r.thread_m
                or r.tile_n % r.thread_n or r.local_size > profile.max_invocations):
            raise ShapeError(f"GEMM tile {r.tile_m}x{r.tile_n}, thread {r.thread_m}x"
                             f"{r.thread_n}: thread blocks multiples of 4 dividing the tile, "
                             f"<= {profile.max_invocations} invocations")
        if not (p2(r.a_vec) and r.a_vec <= wa and r.k % r.a_vec == 0
                and p2(r.vec) and r.vec <= wb and cont % r.vec == 0
                and r.tile_k % max(r.a_vec, r.vec, 4) == 0
                and (r.transpose_b or r.tile_n % r.vec == 0)):
            raise ShapeError(f"GEMM: a_vec={r.a_vec} must divide K={r.k}, vec={r.vec} the "
                             f"contiguous B axis ({cont}), both tile_k={r.tile_k}")
        if 4 * r.gemm_shared_floats > profile.max_workgroup_memory:
            raise ShapeError(f"GEMM: {4 * r.gemm_shared_floats} B of tiles > "
                             f"{profile.max_workgroup_memory} B of workgroup memory")
        if r.splits < 1 or r.splits > -(-r.k // r.tile_k):
            raise ShapeError(f"GEMM: splits={r.splits} outside 1..{-(-r.k // r.tile_k)} "
                             "K steps")
        return
    axis = r.n if r.kind is MatMulKind.GEMV_N else r.k
    if axis % r.vec or not p2(r.vec) or r.vec > (8 if r.b_dtype in (F16, BF16) else 4):
        raise ShapeError(f"{r.kind.value}: vec={r.vec} does not divide {axis}")
    if r.splits < 1 or r.splits > r.k or (r.splits > 1 and r.kind is not MatMulKind.GEMV_N):
        raise ShapeError(f"{r.kind.value}: splits={r.splits}: split-K is a GEMV_N schedule "
                         f"of 1..K={r.k} slices")
    if not (p2(r.lanes) and p2(r.groups) and r.outs >= 1 and r.unroll >= 1):
        raise ShapeError(f"{r.kind.value}: lanes={r.lanes}, groups={r.groups} must be powers "
                         "of two; outs, unroll >= 1")
    if r.local_size > profile.max_invocations:
        raise ShapeError(f"{r.kind.value}: {r.local_size} invocations > "
                         f"{profile.max_invocations}")
    if r.subgroup and not p2(r.subgroup_size):
        raise ShapeError(f"subgroup size {r.subgroup_size} is not a power of two")
