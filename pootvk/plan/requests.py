"""Kernel requests: hashable descriptions of one generated kernel, the pipeline-cache key.

A request names everything its generated source depends on (shapes, score transform, mask
kind, schedule) and nothing that changes per step, so equal requests share SPIR-V and
pipelines, and one recording stays valid for every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..errors import GridLimit, ShapeError
from ..ir import F32, I32, DType, Params, Prim, ReduceOp
from ..ir.fused import FusedBody
from ..ir.prims import IN_PLACE, INDEX_GUARD
from .bindings import Access, Binding

Aval = tuple[tuple[int, ...], DType]


@dataclass(frozen=True)
class LiteralOperand:
    value: float | int | bool
    dtype: DType


def check_selected_keys(who: str, *, block: int, k: int, heads: int, hkv: int, lk: int,
                        other: bool) -> None:
    """A selected (SelectedAttention) kernel's keys: blocks of ``block`` >= 1 tiling Lk,
    ``k`` >= 1 of them, the selection's heads 1 or Hkv, and none of the forms the selected
    blocks and query positions replace (``other``: a mask, a live length, a paged key)."""
    if block < 1 or k < 1 or heads not in (1, hkv):
        raise ShapeError(f"{who}: selected block size {block}, K={k}, Hs={heads} (need "
                         f"bs >= 1, K >= 1, Hs in {{1, {hkv}}})")
    if lk % block:
        raise ShapeError(f"{who}: key length {lk} is not a multiple of the block size "
                         f"{block}")
    if other:
        raise ShapeError(f"{who}: selected keys take no mask, live length or paged key")


@dataclass(frozen=True)
class AttentionRequest:
    """The streaming attention kernel: one workgroup of ``lanes`` per (batch, head, row).

    ``pool_slots`` S > 0: a paged key (``KeyLayout.PAGED``): k and v are pools
    [S, Hkv, Dk] / [S, Hkv, Dv] and ``read`` (i32 [B, Lk]) names each key's slot, so key t
    of row b and KV head g is pool row ``clamp(read[b, t], 0, S - 1) * Hkv + g``. Only
    that address differs from the dense kernel; S is a push constant (one kernel serves
    every pool size).

    ``select_block`` bs > 0: SelectedAttention (dense F32 K/V, no mask, no live length):
    ``ids`` [B, Hs, Lq, K] and ``qpos`` [B, Lq] (i32) are bound after v; the workgroup's row
    visits the logical keys [0, n * bs + p - own * bs + 1) of its n valid selected blocks
    then its own block (own = p // bs, p = qpos clamped into [0, Lk - 1]), logical key i
    being physical key blk[i / bs] * bs + i % bs through a block table in workgroup memory
    (``shaders.attention_decode.select_table``)."""

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
    keys_per_step: int = 2  # keys a lane takes per loop step (its loads all in flight)
    live: bool = False  # read len[b] (i32 [B]): the loop visits keys t < clamp(len[b], 0, Lk)
    dk_shared: int = 0  # split key: width s of k_shared [B, 1, Lk, s] (0: dense key)
    pool_slots: int = 0  # paged key: the pools' slot count S (0: dense key)
    select_block: int = 0  # selected keys: the block size bs (0: off)
    select_k: int = 0  # selected blocks per row K
    select_heads: int = 0  # the selection's heads Hs: 1 (shared by all) or Hkv

    def __post_init__(self) -> None:
        if self.pool_slots < 0 or (self.pool_slots and self.dk_shared):
            raise ShapeError(f"attention: pool_slots={self.pool_slots} with "
                             f"dk_shared={self.dk_shared} (a key is dense, split or paged)")
        if self.select_block:
            check_selected_keys("attention", block=self.select_block, k=self.select_k,
                                heads=self.select_heads, hkv=self.hkv, lk=self.lk,
                                other=self.mask is not None or self.live or self.paged)

    @property
    def paged(self) -> bool:
        return self.pool_slots > 0

    def push_constants(self) -> tuple[int, ...]:
        """Push-constant words: the key length Lk (and a paged key's pool slots S), so
        neither the generated source nor the driver's pipeline depends on them and one
        compiled kernel serves every length and pool size."""
        return (self.lk, self.pool_slots) if self.paged else (self.lk,)

    def bindings(self) -> tuple[Binding, ...]:
        r = Access.READ
        names = ("q", "k", *(("k_shared",) if self.dk_shared else ()), "v",
                 *(("mask",) if self.mask is not None else ()))
        live = (Binding("len", r, I32),) if self.live else ()
        read = (Binding("read", r, I32),) if self.paged else ()
        sel = (Binding("ids", r, I32), Binding("qpos", r, I32)) if self.select_block else ()
        return (*(Binding(n, r, F32) for n in names), *sel, *live, *read,
                Binding("o", Access.WRITE, F32))

    @property
    def n_rep(self) -> int:
        return self.hq // self.hkv

    @property
    def workgroups(self) -> int:
        return self.b * self.hq * self.lq

    def _select_tag(self) -> str:
        if not self.select_block:
            return ""
        return f"selected[bs={self.select_block},K={self.select_k},Hs={self.select_heads}] "

    @property
    def local_size(self) -> int:
        return self.lanes

    @property
    def shared_bytes(self) -> int:
        """Workgroup memory: the lanes' running state, lanes * (dv + 2) floats (and a
        selected row's block table: K + 2 ids and its length)."""
        table = 4 * (self.select_k + 3) if self.select_block else 0
        return self.lanes * (self.dv + 2) * 4 + table

    def describe(self) -> str:
        m = "none" if self.mask is None else (
            "additive[" + ",".join("1" if n == 1 else "n" for n in self.mask) + "]"
        )
        cap = "" if self.softcap is None else f" softcap={self.softcap:g}"
        return (
            f"attention B={self.b} Hq={self.hq} Hkv={self.hkv} Lq={self.lq} Lk={self.lk} "
            f"Dk={self.dk}{f' (shared {self.dk_shared})' if self.dk_shared else ''} "
            f"Dv={self.dv} scale={self.scale:.6g}{cap} mask={m} "
            f"{'live ' if self.live else ''}"
            f"{f'paged[S={self.pool_slots}] ' if self.paged else ''}"
            f"{self._select_tag()}"
            f"lanes={self.lanes} vec={self.vec} keys/step={self.keys_per_step} "
            f"grid={self.grid[0]}x{self.grid[1]}"
        )


@dataclass(frozen=True)
class PrimRequest:
    """A primitive kernel: one invocation per output element (per update element for DUS)."""

    prim: Prim
    params: Params
    inputs: tuple[Aval | LiteralOperand, ...]
    output: Aval
    threads: int
    local_size: int
    grid: tuple[int, int]

    @property
    def bound_inputs(self) -> tuple[int, ...]:
        """Indices of the inputs that are buffers. DynamicUpdateSlice runs in place on its
        output, so its operand (input 0) is not bound."""
        skip = 0 if self.prim in IN_PLACE else -1
        return tuple(
            j for j, op in enumerate(self.inputs)
            if not isinstance(op, LiteralOperand) and j != skip
        )

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        ins = tuple(
            Binding(f"x{j}", Access.READ, self.inputs[j][1])  # type: ignore[index]
            for j in self.bound_inputs
        )
        out = (Binding("y", Access.WRITE, self.output[1]),)
        if self.prim is INDEX_GUARD:  # its witness: counted with atomics, cleared per step
            out += (Binding("w", Access.READ_WRITE, I32),)
        return (*ins, *out)

    def describe(self) -> str:
        ps = " ".join(
            f"{k}={v.value if isinstance(v, Enum) else v}" for k, v in self.params.items()
        )
        shape = ",".join(map(str, self.output[0]))
        return (
            f"{self.prim}{'[' + ps + ']' if ps else ''} -> {self.output[1].value}[{shape}] "
            f"threads={self.threads} wg={self.local_size} grid={self.grid[0]}x{self.grid[1]}"
        )


@dataclass(frozen=True)
class ReduceRequest:
    """A parallel reduction of ``x`` viewed as [outer, n, inner] over its middle axis (the
    output, with or without keepdim, is [outer, inner] in memory).

    A workgroup of ``cols * lanes`` invocations takes ``cols`` consecutive outputs; the
    ``lanes`` lanes of one output stride its n elements (consecutive invocations take
    consecutive outputs, so an inner axis > 1 is read coalesced), then combine: through
    subgroup shuffles where ``subgroup`` (the device has them), the rest through a tree in
    workgroup memory. 16-bit values accumulate in F32 and are rounded once at the store.

    ``vec`` = 4 when a row is contiguous and a multiple of 4 long: a lane loads 4
    consecutive elements at once (16 bytes of F32/I32/U32, 8 of F16/BF16). ``out_dtype``
    (default ``dtype``) is what ``y`` stores: a split reduction's first pass keeps its
    partials in the compute type (F32 for 16-bit input) and its second pass rounds them."""

    op: ReduceOp
    dtype: DType
    outer: int
    n: int
    inner: int
    cols: int
    lanes: int
    subgroup: bool
    grid: tuple[int, int]
    vec: int = 1
    out_dtype: DType | None = None

    @property
    def stored(self) -> DType:
        """The dtype ``y`` holds."""
        return self.out_dtype or self.dtype

    @property
    def outputs(self) -> int:
        return self.outer * self.inner

    @property
    def local_size(self) -> int:
        return self.cols * self.lanes

    @property
    def workgroups(self) -> int:
        return -(-self.outputs // self.cols)

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        return (Binding("x", Access.READ, self.dtype), Binding("y", Access.WRITE, self.stored))

    def describe(self) -> str:
        return (
            f"Reduce[{self.op.value}] {self.dtype.value}[{self.outer},{self.n},{self.inner}] "
            f"-> {self.stored.value}[{self.outer},{self.inner}] cols={self.cols} "
            f"lanes={self.lanes} vec={self.vec} "
            f"{'subgroup' if self.subgroup else 'shared'} "
            f"grid={self.grid[0]}x{self.grid[1]}"
        )


@dataclass(frozen=True)
class ScatterRequest:
    """ScatterUpdate in place: a workgroup of ``lanes`` per update row n writes
    ``updates[n]`` (``row`` elements) to row ``indices[n]`` of the output, unless that index
    is outside [0, rows) or a later update names the same row (the lanes scan the later
    indices first: the last update of a row wins, as the oracle's loop does, and no two
    workgroups write one row)."""

    dtype: DType
    rows: int
    row: int
    n: int
    lanes: int
    grid: tuple[int, int]

    @property
    def local_size(self) -> int:
        return self.lanes

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        return (
            Binding("indices", Access.READ, I32),
            Binding("updates", Access.READ, self.dtype),
            Binding("y", Access.WRITE, self.dtype),
        )

    def describe(self) -> str:
        return (
            f"ScatterUpdate {self.n} row(s) of {self.dtype.value}[{self.row}] into "
            f"{self.rows} rows lanes={self.lanes} grid={self.grid[0]}x{self.grid[1]}"
        )


class _LeavesToOutput:
    """A fused kernel's bindings: one read buffer per operand leaf (``x0, x1, ...``), then
    its output ``y``; no push constants."""

    inputs: tuple[Aval, ...]
    output: Aval

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        ins = tuple(Binding(f"x{j}", Access.READ, dt) for j, (_s, dt) in enumerate(self.inputs))
        return (*ins, Binding("y", Access.WRITE, self.output[1]))


@dataclass(frozen=True)
class FusedRequest(_LeavesToOutput):
    """A fused elementwise kernel: one invocation per output element computes the whole
    body in registers (named scalars) and stores only the result."""

    body: FusedBody
    inputs: tuple[Aval, ...]  # one bound buffer per operand leaf, in order
    output: Aval
    threads: int
    local_size: int
    grid: tuple[int, int]

    def describe(self) -> str:
        shape = ",".join(map(str, self.output[0]))
        return (
            f"Fused[{self.body}] -> {self.output[1].value}[{shape}] threads={self.threads} "
            f"wg={self.local_size} grid={self.grid[0]}x{self.grid[1]}"
        )


@dataclass(frozen=True)
class FusedReduceRequest(_LeavesToOutput):
    """A reduction whose input is a fused body computed on load: one workgroup of ``lanes``
    per reduced row; lane ``l`` folds elements ``l, l + lanes, ...`` of the row into a
    register, then the workgroup combines the lanes' partials: subgroup shuffles first where
    ``subgroup``, then a tree in shared memory. The body's value is never stored.

    With an ``epilogue`` (``FusedRow``) the workgroup then walks its row again, computing
    the epilogue per element from the row's reduction (held in a register), and stores that
    instead: the reduction is never stored either."""

    body: FusedBody
    op: ReduceOp
    axis: int
    keepdim: bool
    inputs: tuple[Aval, ...]
    output: Aval
    lanes: int  # a power of two
    grid: tuple[int, int]
    epilogue: FusedBody | None = None
    subgroup: bool = False  # combine through subgroup shuffles first (the device has them)

    @property
    def rows(self) -> int:
        """Reduced rows: one workgroup each."""
        shape = self.body.out.shape
        n = 1
        for d, size in enumerate(shape):
            n *= 1 if d == self.axis else size
        return n

    @property
    def local_size(self) -> int:
        return self.lanes

    def describe(self) -> str:
        shape = ",".join(map(str, self.output[0]))
        epi = "" if self.epilogue is None else f" then {self.epilogue}"
        return (
            f"FusedReduce[{self.op.value} axis={self.axis} of {self.body}{epi}] -> "
            f"{self.output[1].value}[{shape}] rows={self.rows} lanes={self.lanes} "
            f"{'subgroup' if self.subgroup else 'shared'} grid={self.grid[0]}x{self.grid[1]}"
        )


@dataclass(frozen=True)
class FusedUpdateRequest:
    """DynamicUpdateSlice of a fused body's value into ``state``, in place: one invocation
    per update element computes the body in registers and stores it at its index plus the
    run-time starts (clamped so the update fits, as DynamicUpdateSlice clamps them); gate
    witnesses, when any failed, leave the state unwritten. Bindings: ``x0..`` the body's
    operands, ``s{d}`` each start that is not a literal, ``g{k}`` the gates, then ``y``
    (the state)."""

    body: FusedBody
    inputs: tuple[Aval, ...]  # the body's operands, in order
    state: Aval
    starts: tuple[LiteralOperand | Aval, ...]  # one per state axis
    gates: int
    threads: int
    local_size: int
    grid: tuple[int, int]

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        ins = tuple(Binding(f"x{j}", Access.READ, dt) for j, (_s, dt) in enumerate(self.inputs))
        starts = tuple(Binding(f"s{d}", Access.READ, I32) for d, st in enumerate(self.starts)
                       if not isinstance(st, LiteralOperand))
        gates = tuple(Binding(f"g{k}", Access.READ, I32) for k in range(self.gates))
        return (*ins, *starts, *gates, Binding("y", Access.WRITE, self.state[1]))

    def describe(self) -> str:
        shape = ",".join(map(str, self.state[0]))
        return (
            f"FusedUpdate[{self.body}] into {self.state[1].value}[{shape}] "
            f"threads={self.threads} wg={self.local_size} grid={self.grid[0]}x{self.grid[1]}"
        )


@dataclass(frozen=True)
class GroupRequest:
    """Independent elementwise kernels (``parts``: Prim, Fused and FusedUpdate launches with
    no hazard between them, ``plan.group``) as one launch: the workgroups are dealt out part
    by part, each part's ``threads`` over ``local_size`` lanes, and each workgroup runs its
    part's code. Why: on a GPU a launch costs a few microseconds whatever it computes, and
    independent launches barely overlap (H200, one SmolLM2 layer: q's rotation and the two
    cache writes took 3.2-3.5 us each, side by side). Bindings: each part's, in order,
    prefixed ``p{i}_``; no push constants."""

    parts: tuple[FusedRequest | FusedUpdateRequest | PrimRequest, ...]
    local_size: int
    grid: tuple[int, int]

    @property
    def part_groups(self) -> tuple[int, ...]:
        """Workgroups per part, in order."""
        return tuple(-(-max(p.threads, 1) // self.local_size) for p in self.parts)

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        return tuple(Binding(f"p{i}_{b.name}", b.access, b.dtype)
                     for i, p in enumerate(self.parts) for b in p.bindings())

    def describe(self) -> str:
        inner = "; ".join(p.describe() for p in self.parts)
        return (f"Group[{inner}] wg={self.local_size} groups={'+'.join(map(str, self.part_groups))}"
                f" grid={self.grid[0]}x{self.grid[1]}")


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
