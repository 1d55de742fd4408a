"""The grouped split-KV decode schedule: requests and the pure rule that chooses them.

One workgroup per (batch row, KV head, row block, split) serves the query rows of its group
(the ``n_rep`` query heads of one KV head times the ``lq`` query rows, or a block of them), so
each K/V byte is read once per row block (once in total when the whole group fits one block).
``lanes_per_key`` adjacent lanes share one key: its head dimension is split across them with
16-byte loads (8 for 16-bit K/V whose widths are not multiples of 8), and their partial dot
products are summed with subgroup shuffles or, without them, through workgroup memory.

With ``splits > 1`` the keys are cut into chunks (Flash-Decoding): each workgroup writes its
unnormalised ``(o[dv], m, l)`` to a scratch buffer at ``[(row * splits + split) * (dv + 2)]``
and a combine kernel (one invocation per output element) weights them by ``exp(m_i - M)``.
With one split the partial kernel normalises and writes the output itself.

A paged key (``pool_slots`` S > 0) changes only the K/V address: k and v are pools
[S, Hkv, D] and key t of row b, KV head g is pool row ``read[b, t] * Hkv + g`` (an i32 map
[B, Lk] bound after ``len``); the schedule is the one of the logical [B, Hkv, Lk, D] shapes.

Selected keys (SelectedAttention, ``select_block`` = bs > 0) are a live-length attention over
a logical key range: a row's valid selected blocks then its own block, read through a block
table in workgroup memory (``DecodeRequest.select_block``). The split count and chunks are
chosen for the logical length ``(K + 1) * bs`` (``keys``), not Lk; with Lq > 1 each
workgroup serves one query row (its own table). A split key's shared part is read at the
same physical key. No mask, live length or paged key; the matrix kernel at Lq == 1 only.

Nothing here knows GLSL or Vulkan: the chooser reads shapes and a ``DeviceProfile`` and
returns a frozen, hashable request (the pipeline-cache key); ``pootvk.shaders.
attention_decode`` turns a request into sources.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from ..errors import AttentionLds, DtypeLowering, ScratchBytes, ShapeError
from ..ir import F32, I32, U32, DType
from .bindings import Access, Binding
from .profile import DeviceProfile
from .requests import check_selected_keys, fold_grid

KV_DTYPES = ("f32", "f16", "bf16")

def kv_itemsize(kv_dtype: str) -> int:
    """Bytes per stored K/V element (the dtype's own device size)."""
    return DType(kv_dtype).device_itemsize


#: Seed rules (DESIGN.md "Split-KV decode"); see choose_decode_schedule for the measured ones.
MAX_SPLITS = 16
MIN_CHUNK = 128
#: A cache of at most this many K/V bytes per (batch row, KV head) keeps MAX_SPLITS even
#: when few KV heads would take up to MAX_SPLITS_FEW: past MAX_SPLITS the combine is a second
#: launch, a dependent link that costs more than the extra splits save on a short cache
#: (H200, SmolLM2's attention (1,9,3,4160) D=64 F32 live: 16 fused splits 13.4 us at 128
#: keys and 15.7 at 4096, against 16.3 and 18.7 for 22 splits and a combine launch).
FEW_SPLITS_BYTES = 4 << 20
#: Workgroups per compute unit the split count aims for (llama.cpp and FA2 use 2).
WAVES_PER_CU = 2
#: Workgroups per compute unit up to which a split of at most MAX_SPLITS combines fused
#: (the last split of a row block folds the partials) rather than in a second launch.
#: H200, one run each (bench/decode_probe.py --calls 10, one-round combine): (8,32,8,8192)
#: 6 splits, 384 workgroups (2.9 per SM): F16 77.7-78.0 us fused against 79.6-80.5 in
#: two launches, F32 129.7-129.8 against 131.4-132.3; (8,32,8,16384) F16 175.2 against
#: 174.7, F32 249.1 against 250.9; (16,32,8,4096) F32 4 splits, 512 workgroups (3.9 per
#: SM) 151.4 against 151.6-151.9. (With the two-round combine the grids past 2 per SM
#: measured faster in two launches, hence the old bound of WAVES_PER_CU.)
FUSED_WAVES_PER_CU = 4
#: K/V bytes per workgroup from which the split count is moved to fill the last wave of
#: workgroups (_fill_waves): shorter chunks are dominated by a launch's fixed costs.
WAVE_FILL_BYTES = 256 << 10
#: Floats of query + accumulator state one lane keeps in registers (named scalars):
#: rows * (dk + dv) / lanes_per_key. Past this the lanes per key double.
REG_FLOATS = 128
#: Query rows one workgroup serves at most; a larger group is cut into row blocks.
MAX_ROWS = 8
MAX_ROWS_CPU = 4
#: ... and on lavapipe from Mesa 23 on, whose LLVM path compiles the unrolled multi-row
#: kernel far slower: first call at D=128 (Hq 8, Hkv 2) on Mesa 25.0.7 with cold caches
#: 5.5-5.9 s at 4 rows, 2.5 s at 2, 1.6 s at 1 (Mesa 22.3 at 4 rows: the 5 s goal met); at
#: run time 4 rows are 1.4-1.7x faster than 2 on lavapipe, so Mesa 22.3 keeps them.
MAX_ROWS_SLOW_COMPILE = 2
SLOW_COMPILE_MESA = 23


def _max_rows(profile: DeviceProfile) -> int:
    """Query rows one workgroup may serve on this device (see the constants above)."""
    if profile.device_type != "cpu":
        return MAX_ROWS
    m = re.search(r"Mesa (\d+)\.", str(profile.extra.get("driver_info", "")))
    if m and int(m.group(1)) >= SLOW_COMPILE_MESA:
        return MAX_ROWS_SLOW_COMPILE
    return MAX_ROWS_CPU
COMBINE_LOCAL = 64
KEYS_PER_ITER = 4
LOCAL_SIZE = 256
#: K/V bytes per (batch row, KV head) up to which a workgroup serves one query row
#: (choose_decode_schedule: the register-bound fixed cost of a multi-row kernel dominates)
SHORT_CACHE_BYTES = 3 << 20
#: keys a workgroup streams from which split 16-bit K/V keep the query in workgroup memory
#: and 4 keys a step (``_long_16bit_chunks``)
LONG_CHUNK_KEYS = 8192
#: 16-bit K/V up to this many keys keep 16 lanes per key when split (choose_decode_schedule)
SHORT_16BIT_LK = 8192
#: Split cap when even MAX_SPLITS splits fill at most half the compute units (B*Hkv tiny).
MAX_SPLITS_FEW = 64


class _GroupShape:
    """What a decode problem and its request derive from their shape fields alike."""

    hq: int
    hkv: int
    lq: int
    b: int
    lk: int
    dk: int
    dv: int
    kv_dtype: str
    dk_shared: int
    select_block: int
    select_k: int

    @property
    def n_rep(self) -> int:
        return self.hq // self.hkv

    @property
    def selected(self) -> bool:
        """SelectedAttention (``select_block`` > 0): the keys are a row's selected blocks."""
        return self.select_block > 0

    @property
    def keys(self) -> int:
        """Keys a row visits at most: Lk, or a selected row's ``(K + 1) * bs`` (its K
        blocks and its own): the length the split count and chunks are chosen for."""
        return (self.select_k + 1) * self.select_block if self.select_block else self.lk

    @property
    def key_widths(self) -> tuple[int, ...]:
        """The key's stored row widths: (dk,), or (dk - s, s) for a split key (k's own part,
        then the part k_shared holds once for every head)."""
        return (self.dk - self.dk_shared, self.dk_shared) if self.dk_shared else (self.dk,)

    @property
    def group_rows(self) -> int:
        """Query rows sharing one KV head: n_rep heads times lq rows."""
        return self.n_rep * self.lq

    @property
    def kv_bytes(self) -> int:
        """Bytes of K/V the kernel reads: k and v per KV head, a split key's shared part once
        per batch row (never broadcast over the heads)."""
        per_head = self.dk - self.dk_shared + self.dv
        return (self.b * self.hkv * per_head + self.b * self.dk_shared) * self.keys * \
            kv_itemsize(self.kv_dtype)


@dataclass(frozen=True)
class DecodeProblem(_GroupShape):
    """What the caller computes: shapes, score transform, mask extents, K/V storage dtype."""

    b: int
    hq: int
    hkv: int
    lq: int
    lk: int  # keys (the K/V row stride; with live_len the capacity)
    dk: int
    dv: int
    scale: float
    softcap: float | None = None
    mask: tuple[int, int, int] | None = None  # the mask's (B, H, Lq) extents (1 = broadcast)
    kv_dtype: str = "f32"
    live_len: bool = False  # read row b's live key count len[b] from an i32 [B] buffer
    #: split key: the last dk_shared query channels read k_shared [B, 1, Lk, dk_shared]
    #: (one row per key for every head); k holds the first dk - dk_shared. 0: dense key
    dk_shared: int = 0
    #: paged key: k and v are pools of this many slots [S, Hkv, D] read through an i32
    #: read map [B, Lk] (key t of row b, KV head g: pool row read[b, t] * Hkv + g). 0: dense
    pool_slots: int = 0
    #: SelectedAttention: the block size bs (0: off), the selected blocks per row K and the
    #: selection's heads Hs (1 or Hkv); binds ids [B, Hs, Lq, K] and qpos [B, Lq] (i32)
    select_block: int = 0
    select_k: int = 0
    select_heads: int = 0

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPES:
            raise DtypeLowering("AttentionDecode", self.kv_dtype)
        if self.pool_slots < 0 or (self.pool_slots and self.dk_shared):
            raise ShapeError(f"decode attention: pool_slots={self.pool_slots} with "
                             f"dk_shared={self.dk_shared} (a key is dense, split or paged)")
        if not 0 <= self.dk_shared < self.dk:
            raise ShapeError(f"decode attention: shared key width {self.dk_shared} not in "
                             f"[0, Dk={self.dk})")
        if min(self.b, self.hq, self.hkv, self.lq, self.lk, self.dk, self.dv) < 1:
            raise ShapeError(f"decode attention: every extent must be >= 1: {self}")
        if self.hq % self.hkv:
            raise ShapeError(f"decode attention: Hq={self.hq} not a multiple of Hkv={self.hkv}")
        if self.select_block:
            check_selected_mode(self, "decode attention")
        if self.mask is not None:
            mb, mh, mq = self.mask
            if mb not in (1, self.b) or mh not in (1, self.hq) or mq not in (1, self.lq):
                raise ShapeError(f"decode attention: mask extents {self.mask} do not broadcast "
                                 f"to (B={self.b}, Hq={self.hq}, Lq={self.lq})")



@dataclass(frozen=True)
class DecodeRequest(_GroupShape):
    """One grouped split-KV decode launch pair (partial [+ combine]): the plan key."""

    b: int
    hq: int
    hkv: int
    lq: int
    lk: int
    dk: int
    dv: int
    scale: float
    softcap: float | None
    mask: tuple[int, int, int] | None
    kv_dtype: str
    live_len: bool
    # --- schedule ---
    splits: int  # key chunks per (row, KV head); 1 = no combine kernel
    rows_per_wg: int  # query rows one workgroup serves (divides n_rep * lq)
    lanes_per_key: int  # adjacent lanes sharing one key (power of two)
    local_size: int  # invocations per workgroup (multiple of lanes_per_key)
    keys_per_iter: int  # keys a lane group has in flight per loop step
    load_elems: int  # K/V elements per load: 4 (f32 vec4, f16/bf16 uvec2), 8 (uvec4), 1
    subgroup: bool  # reduce dots with subgroupShuffleXor (else through workgroup memory)
    grid: tuple[int, int]  # the partial kernel's (folded) grid
    combine_grid: tuple[int, int]
    prefetch: bool = True  # load the next step's K/V while this step computes
    fused_combine: bool = True  # the last split of a row block combines (no second launch)
    #: fused combine: 1 = each lane loads its row's maxima and sums with its words, all in
    #: one round of loads, where they fit (``attention_decode.combine_in_one_round``);
    #: 2 = maxima and sums through workgroup memory first, then the words
    combine_rounds: int = 1
    #: scalar kernel: the fold's workgroup memory ``s_o`` holds this many times
    #: ``local_size / lanes_per_key`` accumulator rows of Dv, so that many times more query
    #: rows fold per round (one round of two barriers each); 1 = as many entries as lane
    #: groups (``attention_decode``)
    fold_units: int = 1
    f16_convert: str = "unpack"  # F16 K/V: "unpack" (unpackHalf2x16) | "fp16" (FConvert)
    #: subgroup dot reduction: "butterfly" (every lane all-reduces every dot) | "scatter"
    #: (reduce-scatter the rows * keys_per_iter dots across the lanes of a key group, then
    #: all-gather the sums: 2 (n - n / lanes) shuffles instead of n log2(lanes))
    dot_reduce: str = "butterfly"
    lazy_rescale: bool = False  # rescale a row's accumulators only when its running max moves
    #: scalar kernel: the rows' pre-scaled query slices live in workgroup memory and are read
    #: at each use instead of held in registers (rows * dk / lanes_per_key floats a lane),
    #: leaving those registers to more keys in flight (``LONG_CHUNK_KEYS``)
    q_workgroup: bool = False
    dk_shared: int = 0  # split key: width of k_shared [B, 1, Lk, s] (0: dense key)
    #: fused split only: each split's chunk is at least this many keys (rounded up to the
    #: tile), so a short (live) length runs on the splits it needs: those past it return
    #: before reading anything, and when one split holds every key it writes the output
    #: itself (no arrival counter, no combine). 0: chunks of ceil(Lk / splits) keys.
    min_chunk: int = 0
    #: paged key: the pools' slot count S (0: dense key). Only the K/V address differs: key
    #: t of row b, KV head g is pool row clamp(read[b, t], 0, S - 1) * Hkv + g; S is a push
    #: constant, so one kernel serves every pool size.
    pool_slots: int = 0
    #: tensor-core kernel (``pootvk.shaders.attention_decode_staged``): 16 = subgroup-scope
    #: 16x16x16 cooperative matrices (f16 operands, f32 accumulators; K, V, the query rows
    #: and the softmax weights P as f16), K/V tiles staged through workgroup memory. The
    #: lanes are whole 32-lane subgroups (``lanes_per_key`` = 32) and ``keys_per_iter`` is
    #: the step's keys per subgroup (the tile is local_size / 32 * keys_per_iter); the query
    #: rows of a block, padded to 16, are one matrix dimension. 0: the scalar lane-group kernel.
    matrix: int = 0
    #: matrix kernel: how K/V reach the matrices. "staged": tiles copied through workgroup
    #: memory (``attention_decode_staged``); "registers": each lane's 16-byte words written
    #: into the matrix elements it owns (``attention_decode_regfed``: one 16-key block per
    #: subgroup a step, no barrier in the key loop; needs the device's element layout to be
    #: REGFED_LAYOUT, rows <= 16, Dk a multiple of 32, Dv of 64, dense keys)
    matrix_feed: str = "staged"
    #: matrix kernel: the scaled query is held as two f16 parts (hi + lo, two products per
    #: key block), so rounding it to f16 costs no accuracy (needs a tile of >= 32 keys)
    q_split: bool = False
    #: split kernels: the active splits take a (batch row, KV head, row block)'s key tiles in
    #: turn (split s: tiles s, s + n, s + 2n ... of [0, LK), n the active splits) instead of
    #: one chunk of consecutive tiles each; the launch's workgroups then read one window of
    #: each head together (``interleave_planned``)
    interleave: bool = False
    #: matrix kernel with ``prefetch``: the steps whose 16-byte words are in flight while a
    #: step computes (a register set each; the loop is unrolled this many times). One step
    #: of the MLA shape (16 keys) computes in well under a memory latency, so with one set
    #: in flight every step waited on its own words.
    prefetch_steps: int = 1
    #: matrix kernel: independent accumulators a subgroup's score products alternate
    #: between (summed before the scores are stored)
    score_accumulators: int = 1
    #: SelectedAttention (``select_block`` = bs > 0; the scalar kernel, dense K/V, no mask):
    #: a row's keys are the logical range [0, n * bs + p - own * bs + 1) of its n valid
    #: selected blocks (ids [B, Hs, Lq, K] in [0, own)) then its own block own = p // bs
    #: (p = qpos[b, l] clamped into [0, Lk - 1]); logical key i is physical key
    #: blk[i / bs] * bs + i % bs through a block table the prologue builds in workgroup
    #: memory. The split chunks are cut from that logical length.
    select_block: int = 0
    select_k: int = 0  # selected blocks per row K
    select_heads: int = 0  # the selection's heads Hs: 1 (shared by all) or Hkv

    # --- derived ---------------------------------------------------------------------------
    @property
    def row_blocks(self) -> int:
        return self.group_rows // self.rows_per_wg

    @property
    def key_groups(self) -> int:
        """Lane groups per workgroup: keys processed side by side."""
        return self.local_size // self.lanes_per_key

    @property
    def tile(self) -> int:
        """Keys one workgroup consumes per loop step."""
        return self.key_groups * self.keys_per_iter

    @property
    def vec(self) -> int:
        """Width of the float vectors the kernel computes in (4, or 1 for odd widths)."""
        return 1 if self.load_elems == 1 else 4

    @property
    def workgroups(self) -> int:
        return self.b * self.hkv * self.row_blocks * self.splits

    @property
    def out_rows(self) -> int:
        return self.b * self.hq * self.lq

    @property
    def partial_floats(self) -> int:
        """Scratch the split partials need (0 without splits)."""
        return 0 if self.splits == 1 else self.out_rows * self.splits * (self.dv + 2)

    @property
    def counters(self) -> int:
        """Arrival counters of the fused combine: one per (batch, KV head, row block)."""
        return self.b * self.hkv * self.row_blocks

    @property
    def launches(self) -> int:
        return 2 if self.splits > 1 and not self.fused_combine else 1

    @property
    def combine_threads(self) -> int:
        return self.out_rows * self.dv

    @property
    def chunk(self) -> int:
        """Keys per split at the full length (``keys``: lk, or a selected row's (K + 1) *
        bs) (a multiple of the tile)."""
        return chunk_for(self.keys, self.splits, self.tile)

    @property
    def shared_bytes(self) -> int:
        fused = self.splits if self.splits > 1 and self.fused_combine else 0
        table = select_table_bytes(self.select_k if self.select_block else -1)
        if self.matrix and self.matrix_feed == "registers":
            return regfed_shared_bytes(self.local_size // 32, self.rows_per_wg, self.dv, fused)
        if self.matrix:
            return staged_shared_bytes(self.local_size // 32, self.tile, self.dk, self.dv,
                                       self.rows_per_wg, fused) + table
        return decode_shared_bytes(self.local_size, self.lanes_per_key, self.keys_per_iter,
                                   self.rows_per_wg, self.dv, self.subgroup, fused,
                                   self.rows_per_wg * self.dk if self.q_workgroup else 0,
                                   self.fold_units) + table

    @property
    def paged(self) -> bool:
        return self.pool_slots > 0

    def push_constants(self) -> tuple[int, ...]:
        """The key count Lk (the K/V row stride; a paged key's read-map row stride) and a
        paged key's pool slots S: push constants, so one compiled kernel serves every
        length and pool size with the same schedule."""
        return (self.lk, self.pool_slots) if self.paged else (self.lk,)

    def bindings(self) -> tuple[Binding, ...]:
        """The partial kernel's bindings in binding order (names are the operand roles)."""
        kv = DType(self.kv_dtype)
        r, w, rw = Access.READ, Access.WRITE, Access.READ_WRITE
        out = [Binding("q", r, F32), Binding("k", r, kv)]
        if self.dk_shared:
            out.append(Binding("k_shared", r, kv))
        out.append(Binding("v", r, kv))
        if self.select_block:
            out += [Binding("ids", r, I32), Binding("qpos", r, I32)]
        if self.mask is not None:
            out.append(Binding("mask", r, F32))
        if self.live_len:
            out.append(Binding("len", r, I32))
        if self.paged:
            out.append(Binding("read", r, I32))
        if self.splits > 1 and self.fused_combine:
            # the last workgroup to arrive reads every split's partial back; the counters
            # start at zero and are reset to zero by that workgroup (one recording, any
            # number of replays)
            out.append(Binding("partial", rw, F32))
            out.append(Binding("counter", rw, U32))
            out.append(Binding("out", w, F32))
        elif self.splits > 1:
            out.append(Binding("partial", w, F32))
        else:
            out.append(Binding("out", w, F32))
        return tuple(out)

    def combine_bindings(self) -> tuple[Binding, ...]:
        return (Binding("partial", Access.READ, F32), Binding("out", Access.WRITE, F32))

    def describe(self) -> str:
        m = "none" if self.mask is None else (
            "additive[" + ",".join("1" if n == 1 else "n" for n in self.mask) + "]"
        )
        cap = "" if self.softcap is None else f" softcap={self.softcap:g}"
        return (
            f"attention_decode B={self.b} Hq={self.hq} Hkv={self.hkv} Lq={self.lq} "
            f"Lk={self.lk}{' (live)' if self.live_len else ''}"
            f"{f' paged[S={self.pool_slots}]' if self.paged else ''}"
            f"{select_tag(self)} Dk={self.dk}"
            f"{f' (shared {self.dk_shared})' if self.dk_shared else ''} Dv={self.dv} "
            f"kv={self.kv_dtype} scale={self.scale:.6g}{cap} mask={m} splits={self.splits} "
            f"rows/wg={self.rows_per_wg} "
            f"lanes/key={self.lanes_per_key} wg={self.local_size} keys/iter={self.keys_per_iter} "
            f"load={self.load_elems} {'subgroup' if self.subgroup else 'shared'} "
            f"{'prefetch ' if self.prefetch else ''}"
            f"{'fused ' if self.fused_combine and self.splits > 1 else ''}"
            f"{'combine2 ' if self.combine_rounds == 2 else ''}"
            f"{f'fold_units={self.fold_units} ' if self.fold_units > 1 else ''}"
            f"{'fp16cvt ' if self.f16_convert == 'fp16' else ''}"
            f"{'' if self.dot_reduce == _DEFAULT_DOT_REDUCE else self.dot_reduce + ' '}"
            f"{'' if self.lazy_rescale == _DEFAULT_LAZY else _LAZY_TAG[self.lazy_rescale]}"
            f"{'qwg ' if self.q_workgroup else ''}"
            f"{f'min_chunk={self.min_chunk} ' if self.min_chunk else ''}"
            f"{f'coopmat{self.matrix} ' if self.matrix else ''}"
            f"{'regfed ' if self.matrix and self.matrix_feed == 'registers' else ''}"
            f"{'qsplit ' if self.q_split else ''}"
            f"{'interleave ' if self.interleave else ''}"
            f"{f'prefetch_steps={self.prefetch_steps} ' if self.prefetch_steps > 1 else ''}"
            f"{f'score_acc={self.score_accumulators} ' if self.score_accumulators > 1 else ''}"
            f"grid={self.grid[0]}x{self.grid[1]}"
        )


_DEFAULT_DOT_REDUCE = DecodeRequest.dot_reduce
_DEFAULT_LAZY = DecodeRequest.lazy_rescale
_LAZY_TAG = {True: "lazy ", False: "eager "}


@dataclass(frozen=True)
class DecodeCombineRequest:
    """The second launch of a split decode without the fused combine: one invocation per
    output element folds the splits' partials."""

    partial: DecodeRequest

    @property
    def grid(self) -> tuple[int, int]:
        return self.partial.combine_grid

    def push_constants(self) -> tuple[int, ...]:
        return ()

    def bindings(self) -> tuple[Binding, ...]:
        return self.partial.combine_bindings()

    def describe(self) -> str:
        p = self.partial
        return (f"attention_combine rows={p.out_rows} Dv={p.dv} splits={p.splits} "
                f"grid={self.grid[0]}x{self.grid[1]}")


def check_selected_mode(x: DecodeProblem | DecodeRequest, who: str) -> None:
    """A selected (SelectedAttention) problem or request: dense or split K/V (not paged) of
    a length that is whole blocks, no mask and no live length (the selected blocks and the
    query positions take their place), K >= 1 and Hs in {1, Hkv}."""
    check_selected_keys(who, block=x.select_block, k=x.select_k, heads=x.select_heads,
                        hkv=x.hkv, lk=x.lk,
                        other=x.mask is not None or x.live_len or bool(x.pool_slots))


def select_table_bytes(select_k: int) -> int:
    """Workgroup memory of a selected row's block table: K + 2 block ids (the valid ones,
    then the own block repeated, so a clamped logical index one block past the end still
    names a block of the row) and the logical length; 0 for ``select_k`` < 0 (off)."""
    return 0 if select_k < 0 else 4 * (select_k + 3)


def select_tag(r: DecodeProblem | DecodeRequest) -> str:
    """`` selected[bs=.., K=.., Hs=..]`` for a selected request, else nothing."""
    if not r.select_block:
        return ""
    return f" selected[bs={r.select_block},K={r.select_k},Hs={r.select_heads}]"


def chunk_for(lk: int, splits: int, tile: int) -> int:
    """Keys per split: ceil(lk / splits) rounded up to the tile (the kernel computes the same
    from the live length, so a short live length leaves trailing splits empty)."""
    if splits <= 1:
        return lk
    per = -(-lk // splits)
    return -(-per // tile) * tile


def _fold_units(profile: DeviceProfile, local: int, lanes: int, kpi: int, rows: int, dv: int,
                subgroup: bool, fused_splits: int, q_floats: int, table: int) -> int:
    """``DecodeRequest.fold_units`` of a GPU's scalar kernel: 2 where the fold would take
    more than one round (with subgroups ``s_o`` holds ``subgroup / lanes`` rows a round:
    2 of 4 at 16 lanes a key) and twice its accumulators fit the workgroup memory, so
    twice the rows fold a round (one round fewer, two barriers). H200, (1,32,8,32768)
    F32, 16 lanes a key, 4 rows, 16 splits, one call, alternated: 71.6 us against 71.9
    (scratch A/B of this session, BENCHMARKS.md session 25). 1 on a CPU (not measured)."""
    if not subgroup or profile.device_type == "cpu" or rows < 2:
        return 1
    sub = max(1, profile.subgroup_size)
    per_round = max(1, (local // lanes) // max(1, local // sub))
    if per_round >= rows:
        return 1
    fits = decode_shared_bytes(local, lanes, kpi, rows, dv, subgroup, fused_splits, q_floats,
                               2) + table <= profile.max_workgroup_memory
    return 2 if fits else 1


def decode_shared_bytes(local_size: int, lanes_per_key: int, keys_per_iter: int, rows: int,
                        dv: int, subgroup: bool, fused_splits: int = 0,
                        q_floats: int = 0, fold_units: int = 1) -> int:
    """Workgroup memory of the partial kernel: the final fold (m, l per row and lane group,
    ``fold_units`` rows' accumulators per lane group), the fused combine's one-word arrival flag
    (``s_last``, counted always: the H200 lost the device on a kernel 4 bytes over its
    49152-byte limit when it was not) and, with ``fused_splits``, its per-(row, split)
    weights and sums and per-row denominators; plus, without subgroups, the dot reduction
    buffer (at most ``REDUCE_ROWS`` rows at a time), and ``q_floats`` of query rows
    (``DecodeRequest.q_workgroup``)."""
    groups = local_size // lanes_per_key
    fold = 2 * rows * groups * 4 + fold_units * groups * dv * 4
    red = 0 if subgroup else reduce_rows(rows, keys_per_iter, local_size) * keys_per_iter \
        * local_size * 4
    combine = 4 * (2 * rows * fused_splits + rows) if fused_splits else 0
    return fold + red + combine + LAST_FLAG_BYTES + 4 * q_floats


def staged_shared_bytes(subgroups: int, tile: int, dk: int, dv: int, rows: int,
                        fused_splits: int = 0) -> int:
    """Workgroup memory of the staged matrix kernel: the step's K and V tiles (f16 rows
    padded by 16 bytes), its scores (16 rows x 20 floats per key block or per subgroup,
    whichever is more), the weights P (16 rows x the tile, padded), the rows' rescale
    factors and (m, l), the arrival flag and the fused combine's weights (every variable a
    multiple of 16 bytes, as the generator lays them out)."""
    rt = -(-rows // 16)  # 16-row tiles
    kv = tile * (2 * dk + 16) + tile * (2 * dv + 16)
    scores = 16 * max(rt * tile // 16, subgroups) * 80 + 16 * rt * (2 * tile + 16)
    combine = 16 * (2 * -(-rows * fused_splits // 4) + -(-rows // 4)) if fused_splits else 0
    return kv + scores + 3 * 64 * rt + 16 + combine


#: The register-fed kernel folds its subgroups' accumulators in one round (every subgroup's
#: rows in workgroup memory at once, one barrier) while they take at most this many bytes,
#: else in log2(subgroups) rounds through half as many slots.
REGFED_FLAT_FOLD_BYTES = 32768


def regfed_fold_stride(dv: int) -> int:
    """Floats a row takes in a register-fed fold slot: ``dv``, one pad word per 16
    channels, and 4 more where that leaves the row an even number of 4-word groups. The
    lanes of a store hold one channel each, 16 channels apart (``16 lc`` + a constant: the
    V operand's channel permutation, ``attention_decode_regfed``), in up to 8 rows; a
    channel's word is ``c + (c >> 4)``, so lane ``lc`` lands ``17 lc`` words on, and rows
    start ``4 x odd`` banks apart: the 32 lanes of a store hit 32 banks. Unpadded rows of
    128 floats put 16 lanes of a store in one bank (H200, (1,32,8,32768) F16: the fold's
    first store round took 2.2 us of a 42.5 us launch, its second pass too, so not the
    cold code)."""
    s = dv + dv // 16
    return s + 4 if (s // 4) % 2 == 0 else s


def regfed_fold_slots(subgroups: int, rows: int, dv: int) -> int:
    """Accumulator slots (rows x ``regfed_fold_stride`` floats each) of the register-fed
    kernel's fold: every subgroup's where they fit REGFED_FLAT_FOLD_BYTES, else half of
    them (0: one subgroup)."""
    if subgroups == 1:
        return 0
    flat = subgroups * rows * regfed_fold_stride(dv) * 4 <= REGFED_FLAT_FOLD_BYTES
    return subgroups if flat else subgroups // 2


def regfed_shared_bytes(subgroups: int, rows: int, dv: int, fused_splits: int = 0) -> int:
    """Workgroup memory of the register-fed matrix kernel: each subgroup's (m, l) per row,
    the fold of the subgroups' accumulators (``regfed_fold_slots``), the arrival flag and
    the fused combine's weights (as ``attention_decode_regfed`` lays them out)."""
    ml = 2 * 16 * -(-subgroups * rows // 4)
    fold = regfed_fold_slots(subgroups, rows, dv) * rows * regfed_fold_stride(dv) * 4
    combine = 16 * (2 * -(-rows * fused_splits // 4) + -(-rows // 4)) if fused_splits else 0
    return ml + fold + 16 + combine


LAST_FLAG_BYTES = 4  # shared uint s_last of the fused combine
REDUCE_FLOATS = 2048  # floats of the shared-memory dot reduction buffer (8 KiB), at most


def reduce_rows(rows: int, keys_per_iter: int, local_size: int) -> int:
    """Rows whose partial dots go through workgroup memory together (shared variant)."""
    return max(1, min(rows, REDUCE_FLOATS // (keys_per_iter * local_size)))


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (max(1, x) - 1).bit_length())


def _largest_pow2_dividing(n: int) -> int:
    return n & -n


def _rows_per_wg(rows: int, cap: int) -> int:
    """The largest divisor of ``rows`` that is <= cap (row blocks are then all full)."""
    for d in range(min(rows, cap), 0, -1):
        if rows % d == 0:
            return d
    return 1


def default_splits(p: DecodeProblem, profile: DeviceProfile, blocks: int, tile: int,
                   max_splits: int = MAX_SPLITS) -> int:
    """Flash-Decoding split count: aim at WAVES_PER_CU workgroups per compute unit.

    No split when Lq > 1 (seed rule), when the (batch, KV head, row block) workgroups already
    fill the compute units (one each), or when a chunk would fall under MIN_CHUNK keys. At
    most ``max_splits`` (16), raised to MAX_SPLITS_FEW (64) when 16 splits would still
    fill at most half of the compute units (a single KV head, B=1) and the cache holds more
    than FEW_SPLITS_BYTES per KV head (a short one keeps the fused combine). A device without a
    compute-unit count (lavapipe, recorded profiles without it) is not split.

    Measured on the H200 (132 SMs, D=128, 256-lane workgroups; bench/decode_probe.py):
    B*Hkv=8: 16 splits 268 us at Lk=131072 F32 against 275 (32) and 292 (64), and 80 vs 90
    (32) at Lk=32768; B*Hkv=1: 64 splits 102 us against 128 (32) and 219 (16); B*Hkv=64:
    5 splits 159 us, 10: 155, 20: 169.
    """
    cu = profile.compute_units
    if p.lq > 1 or not cu or profile.device_type == "cpu":
        return 1
    base = p.b * p.hkv * blocks
    target = WAVES_PER_CU * cu
    if base >= cu:
        return 1
    if base * max_splits * 2 <= cu and p.kv_bytes > FEW_SPLITS_BYTES * p.b * p.hkv:
        max_splits = max(max_splits, MAX_SPLITS_FEW)
    splits = min(max_splits, -(-target // base))
    # chunks of at least MIN_CHUNK keys, rounded to the tile
    min_chunk = -(-MIN_CHUNK // tile) * tile
    most = max(1, min(max_splits, p.keys // min_chunk))
    splits = min(splits, most)
    if splits > 1 and p.kv_bytes // (p.b * p.hkv * splits) >= WAVE_FILL_BYTES:
        splits = _fill_waves(base, splits, cu, most)
    if splits <= 1:
        return 1
    return -(-p.keys // chunk_for(p.keys, splits, tile))  # no split left empty at full length


def _fill_waves(base: int, splits: int, cu: int, most: int) -> int:
    """The split count near ``splits`` (two fewer to one more, at most ``most``) whose
    ``base * splits`` workgroups fill their last wave of ``cu`` best (a tie: more
    workgroups). Each workgroup streams its own chunk and an SM that holds one more of
    them than the others finishes last, so a launch of 2.4 workgroups per SM runs at the
    pace of 3. H200 (132 SMs), D=128, one run (bench/decode_probe.py --calls 10):
    (8,32,8,8192) F16 6 splits (384 workgroups, 2.91 per SM) 79.1 us against 90.3 for 5
    (2.42) and 109.8 for 7 (3.39), F32 131.0 against 133.7; (1,32,32,32768) 8 splits (256,
    1.94 per SM) F16 126.5 us against 133.3 for 9 (2.18) and 130.7 for 10, F32 244.4
    against 252.2."""
    def fill(s: int) -> tuple[float, int]:
        waves = base * s / cu
        return waves / math.ceil(waves), s

    return max(fill(s) for s in range(max(2, splits - 2), min(most, splits + 1) + 1))[1]


def _split_count(p: DecodeProblem, profile: DeviceProfile, blocks: int, tile: int,
                 force_splits: int | None, max_splits: int, prefer: int | None = None) -> int:
    """The forced split count, else ``prefer`` where its partials fit the binding range, else
    ``default_splits``; unsplit when the partials would pass the binding range (a forced
    count that does raises ScratchBytes)."""

    def need(splits: int) -> int:
        return p.b * p.hq * p.lq * splits * (p.dv + 2) * 4

    if force_splits is None and prefer is not None and \
            need(prefer) <= profile.max_storage_buffer_range:
        return prefer
    splits = max(1, int(force_splits)) if force_splits is not None else \
        default_splits(p, profile, blocks, tile, max_splits)
    if splits > 1 and need(splits) > profile.max_storage_buffer_range:
        if force_splits is not None:
            raise ScratchBytes(need(splits), profile.max_storage_buffer_range)
        return 1  # keep unsplit when the partials pass the binding range
    return splits


def _fused_combine(profile: DeviceProfile, groups: int, splits: int,
                   force_splits: int | None, fused_override: object,
                   min_chunk_override: object) -> tuple[bool, int]:
    """(fused combine, min_chunk) for ``groups`` workgroups of ``splits`` splits.

    Fused combine (the last split to finish combines): saves the second launch (~4 us on
    the H200) for at most 16 splits over up to FUSED_WAVES_PER_CU workgroups per compute
    unit; with 64 splits the last workgroup's combine is a serial tail: two launches
    measured faster there ((1,8,1,65536) F32 63.6 us vs 88.3).

    A fused split's chunk is at least MIN_CHUNK keys at run time too: a live length far
    under the capacity runs on the splits it needs and, under MIN_CHUNK keys, on one that
    writes the output itself (H200, SmolLM2's (1,9,3,4160) D=64 F32: one split 8.0 us at
    1 key and 8.4 at 128 against 10.2-10.4 for 13 fused splits). A forced split count
    keeps its exact chunking (tests run partial and empty chunks through it).
    """
    cu = profile.compute_units
    fused = (groups <= FUSED_WAVES_PER_CU * cu and splits <= MAX_SPLITS) if cu else True
    if fused_override is not None:
        fused = bool(fused_override)
    min_chunk = MIN_CHUNK if fused and splits > 1 and force_splits is None else 0
    if min_chunk_override is not None:
        min_chunk = int(min_chunk_override)
    return fused, min_chunk


def choose_decode_schedule(
    p: DecodeProblem,
    profile: DeviceProfile,
    *,
    has_subgroup_shuffle: bool,
    force_splits: int | None = None,
    max_splits: int = MAX_SPLITS,
    overrides: dict[str, int | bool] | None = None,
) -> DecodeRequest:
    """The schedule for problem ``p`` on ``profile`` (pure: no device, no GLSL).

    ``has_subgroup_shuffle``: the device has subgroup basic + shuffle operations in compute
    shaders (the profile does not record it yet). ``force_splits`` is the test hook that
    forces a split count (chunks may then be partial or empty). ``overrides`` replaces
    schedule fields (lanes_per_key, local_size, keys_per_iter, rows_per_wg, load_elems,
    subgroup, interleave) for measurements; ``matrix`` (0 or 16) and ``matrix_feed``
    ("staged" or "registers") pick a kernel. The result is checked like any other request.
    """
    ov = dict(overrides or {})
    inter = ov.pop("interleave", None)
    lazy_named = "lazy_rescale" in ov
    r = _choose_schedule(p, profile, has_subgroup_shuffle, force_splits, max_splits, ov)
    want = interleave_planned(r, profile) if inter is None else bool(inter)
    interleave = want and r.splits > 1
    lazy = r.lazy_rescale or (not lazy_named and lazy_planned(r, profile))
    if (r.interleave, r.lazy_rescale) != (interleave, lazy):
        r = replace(r, interleave=interleave, lazy_rescale=lazy)
        check_request(r)
    return r


def lazy_planned(r: DecodeRequest, profile: DeviceProfile) -> bool:
    """Whether the scalar kernel ``r`` with F32 K/V rescales a row's accumulators only when
    its running max moves (``lazy_rescale``; the short 16-bit rule sets it on its own): on
    a GPU whose compute units each hold at most one of the launch's workgroups. The skipped
    multiplies save issue slots and power, but the branch costs registers: H200 (NVIDIA's
    statistics), (8,32,8,8192) F32 168 -> 211 registers a lane, 3 -> 2 of its 128-lane
    workgroups a compute unit, so its 384 no longer run in one wave. H200, one call each,
    alternated, eager -> lazy: (1,32,8,32768) 70.58 / 70.65 -> 69.93 us (another call
    72.43 / 71.86 -> 70.93 at 1875 MHz), (1,32,8,131072) 249.9 / 244.8 -> 242.8 (1905 MHz),
    (1,8,1,65536) 39.00 / 39.01 -> 38.04 / 38.09, (1,32,8,4096) 14.83 -> 14.84; with more
    workgroups than compute units: (8,32,8,8192) 127.1 -> 142.1, (32,32,8,2048) 125.1 ->
    124.7, (1,32,32,32768) 236.9 -> 237.2. 16-bit K/V in the same kernel lose:
    (1,32,8,32768) bf16 46.17 -> 48.18, f16 45.45 -> 47.51. Measured on the H200 only;
    the other GPU profiles take the same rule, unmeasured there."""
    return (r.kv_dtype == "f32" and not r.matrix and profile.device_type != "cpu"
            and bool(profile.compute_units) and r.grid[0] * r.grid[1] <= profile.compute_units)


#: Fewest keys a split (Lk / splits) for which a GPU's split kernel takes its tiles in turn.
INTERLEAVE_MIN_CHUNK = 2048


def interleave_planned(r: DecodeRequest, profile: DeviceProfile) -> bool:
    """Whether the split kernel ``r`` takes its tiles in turn (``DecodeRequest.interleave``):
    on a GPU, for the scalar and register-fed kernels, where each split holds at least
    INTERLEAVE_MIN_CHUNK keys. There the launch's workgroups read one window of each head
    together instead of 16 streams 2048 keys apart. H200, D=128, one call, alternated,
    consecutive tiles against in turn: (1,32,8,32768) F16 41.96 -> 41.65 us (another call
    41.90 -> 41.61), F32 70.53 -> 70.36; (1,32,8,131072) F16 129.63 -> 129.06, F32
    246.5 -> 244.5; (1,32,32,32768) F16 123.89 -> 123.45, F32 239.0 -> 237.3;
    (8,32,8,8192) F16 (4096 keys a split) 70.34 -> 70.35. Shorter splits lose or are even:
    (1,32,8,4096) F32 (256 keys) 14.73 -> 15.30, F16 13.78 -> 13.88; (1,8,1,65536) (1024,
    two launches) F32 39.21 -> 39.53, F16 29.31 -> 27.87; (8,32,8,8192) F32 (1366)
    127.46 -> 127.38. The staged matrix kernel keeps its chunks (not measured). A CPU's
    workgroups are few and each core streams its own chunk: consecutive tiles."""
    return (r.splits > 1 and profile.device_type != "cpu"
            and not (r.matrix and r.matrix_feed == "staged")
            and r.lk >= INTERLEAVE_MIN_CHUNK * r.splits)


def _choose_schedule(p: DecodeProblem, profile: DeviceProfile, has_subgroup_shuffle: bool,
                     force_splits: int | None, max_splits: int, ov: dict) -> DecodeRequest:
    """The schedule before the interleave and lazy-rescale rules (``choose_decode_schedule``
    applies them to what this returns). ``ov``: a copy of the overrides without
    ``interleave``, consumed here; the row-block retry passes them on with ``rows_per_wg``."""
    overrides = dict(ov)
    matrix = ov.pop("matrix", None)
    feed = ov.pop("matrix_feed", None)
    if feed is not None and matrix is None:
        matrix = MATRIX
    if matrix is None and ov.keys() & SCALAR_ONLY:
        matrix = 0  # overrides only the scalar kernel has: measure the scalar kernel
    if feed is not None and not int(matrix):
        raise ShapeError(f"decode schedule: matrix_feed={feed!r} names a matrix kernel, "
                         "but matrix is 0")
    if matrix is None and ov.keys() <= REGFED_OVERRIDES and \
            regfed_planned(p, profile, has_subgroup_shuffle) and \
            _choose_regfed(p, profile, None, max_splits, dict(ov)).chunk >= REGFED_MIN_CHUNK:
        matrix, feed = MATRIX, "registers"  # (the chunk of the unforced split count)
    if matrix is None:
        matrix = MATRIX if (matrix_supported(p, profile, has_subgroup_shuffle)
                            and p.group_rows * (p.dk + p.dv) > MATRIX_MIN_STATE) else 0
    elif int(matrix) and not matrix_supported(p, profile, has_subgroup_shuffle):
        raise ShapeError(f"decode schedule: the matrix kernel cannot serve {p} on "
                         f"{profile.name} (see matrix_supported)")
    if int(matrix) and feed == "registers":
        if not regfed_supported(p, profile, has_subgroup_shuffle):
            raise ShapeError(f"decode schedule: the register-fed matrix kernel cannot serve "
                             f"{p} on {profile.name} (see regfed_supported)")
        return _choose_regfed(p, profile, force_splits, max_splits, ov)
    if int(matrix):
        if feed not in (None, "staged"):
            raise ShapeError(f"decode schedule: matrix_feed must be 'staged' or 'registers', "
                             f"not {feed!r}")
        return _choose_matrix(p, profile, force_splits, max_splits, ov)
    ov_keys = frozenset(ov)
    bytes_ = kv_itemsize(p.kv_dtype)
    widths = (*p.key_widths, p.dv)  # every stored row width (a load never straddles two)
    if bytes_ == 2:
        if not profile.supports_16bit and not profile.extra.get("storage_buffer_16bit"):
            raise DtypeLowering("AttentionDecode", p.kv_dtype)
        if any(w % 4 for w in widths):
            raise DtypeLowering("AttentionDecode", f"{p.kv_dtype} with head widths "
                                f"{'/'.join(map(str, widths))} (16-bit K/V need multiples "
                                "of 4)")
        load_elems = 8 if all(w % 8 == 0 for w in widths) else 4
    else:
        load_elems = 4 if all(w % 4 == 0 for w in widths) else 1
    load_elems = int(ov.pop("load_elems", load_elems))

    # lavapipe: at most 4 rows (its LLVM compile of an 8-row unrolled kernel takes ~30 s),
    # 2 on Mesa >= 23 (_max_rows)
    max_rows = _max_rows(profile)
    rows = _rows_per_wg(p.group_rows, int(ov.pop("max_rows", max_rows)))
    # Short caches: one query row per workgroup. A kernel serving several rows keeps all
    # their query + accumulator slices in registers (the D=128 F16 kernel at 4 rows, 8 lanes
    # per key: 250 registers a lane, NVIDIA's pipeline statistics), and with few keys per
    # workgroup that fixed cost, not the K/V bytes, sets the time. H200, one session
    # (bench/decode_probe.py --tune --variants), B=1 Hq=32 Hkv=8 D=128, 1 row (16 lanes)
    # against the 4-row kernel: F16 Lk 1024 10.2 us vs 15.1, 2048 12.3 vs 17.0, 4096 15.6 vs
    # 19.3 (llama.cpp 17.5), 8192 28.4 vs 23.6; F32 1024 10.7 vs 15.1, 2048 14.8 vs 17.6,
    # 4096 21.6 vs 20.7. So: at most SHORT_CACHE_BYTES of K/V per (batch row, KV head),
    # while those heads leave compute units idle. SmolLM2's (1,9,3,4160) D=64 F32 (2.03 MiB a
    # head: 3 rows a group, live): 1 row 6.8 us at 128 live keys and 11.8 at 4096 against
    # 8.7 and 13.7 for 3 rows (the 4 MiB (1,32,8,4096) F32 above keeps its rows): 3 MiB.
    if (p.lq == 1 and profile.compute_units and profile.device_type != "cpu"
            and p.b * p.hkv < profile.compute_units
            and p.keys * (p.dk + p.dv) * bytes_ <= SHORT_CACHE_BYTES
            and "max_rows" not in ov_keys):
        rows = 1
    if p.select_block and p.lq > 1:
        rows = 1  # each query row has its own block table: a workgroup serves one row
    rows = int(ov.pop("rows_per_wg", rows))
    subgroup = bool(ov.pop("subgroup", has_subgroup_shuffle)) and has_subgroup_shuffle
    sub = max(1, profile.subgroup_size)

    # Lanes per key (measured on the H200, BENCHMARKS-style notes in bench/decode_probe.py):
    # one lane reads at most 32 bytes of a f32 key row and 16 bytes of a 16-bit one (D=128:
    # 16 lanes); 16-bit K/V serving several rows take half as many when the rows' query +
    # accumulator state, rows * (dk + dv) / lanes floats, still fits REG_FLOATS; lanes double
    # while it does not. A power of two dividing both widths in loads, at most 32 (and the
    # subgroup when shuffles reduce the dot).
    def lane_cap(elems: int) -> int:
        units = min(_largest_pow2_dividing(w // elems) for w in widths)
        return min(32, units, sub if subgroup else 32)

    cap = lane_cap(load_elems)
    lanes = _pow2_ceil(max(1, p.dk * bytes_ // (32 if bytes_ == 4 else 16)))
    # Short 16-bit caches that will be split (Lk <= SHORT_16BIT_LK, the (batch, KV head,
    # row block) workgroups below one per compute unit) keep 16 lanes per key, 4 keys per
    # step, with the reduce-scatter dot reduction and the lazy rescale: H200, D=128, one run
    # (bench/decode_probe.py --tune --exp): (1,32,8,4096) F16 19.3 us vs 22.2 (8 lanes,
    # butterfly, eager; llama.cpp 17.5); (8,32,8,8192) F16 95.9 us vs 116.2. Longer caches
    # keep 8 lanes, butterfly, eager: (1,32,8,32768) 65.5 us vs 65.8 (16 lanes, scatter,
    # lazy), (1,32,8,131072) 165.6 vs 192.4, and (32,32,8,2048) (unsplit) 83.3 vs 91.4.
    # Measured on their own (8 lanes) the scatter reduction was neutral (+0.2..+2%) and the
    # lazy rescale slower (+5..+16%, a divergent branch), so both stay off elsewhere;
    # 16 lanes without them is not measured yet.
    short16 = (bytes_ == 2 and rows > 1 and p.lq == 1 and p.keys <= SHORT_16BIT_LK
               and bool(profile.compute_units) and profile.device_type != "cpu"
               and p.b * p.hkv * (p.group_rows // rows) < profile.compute_units)
    if bytes_ == 2 and rows > 1 and rows * (p.dk + p.dv) <= REG_FLOATS * (lanes // 2) and \
            not short16:
        lanes //= 2
    while rows * (p.dk + p.dv) > REG_FLOATS * lanes and lanes < 32:
        lanes *= 2
    # Wide heads (the MLA decode shape: Dk=576 split 512 + 64, Dv=512): 16-byte loads cap the
    # lanes per key (64 / 8 halves: 8); 8-byte loads allow twice as many when the state needs
    # them. Not measured yet (bench/mla_decode.py sweeps the alternatives).
    if bytes_ == 2 and load_elems == 8 and lanes > cap and "load_elems" not in ov_keys \
            and lane_cap(4) > cap:
        load_elems, cap = 4, lane_cap(4)
    lanes = max(1, min(cap, lanes))
    lanes = int(ov.pop("lanes_per_key", lanes))
    # ... and when even the widest split leaves a lane more than 2 * REG_FLOATS floats of
    # query + accumulator state, fewer rows share a workgroup (the registers would spill;
    # each row block then reads the K/V again, mostly from L2)
    if "rows_per_wg" not in ov_keys:
        while rows > 1 and rows * (p.dk + p.dv) > 2 * REG_FLOATS * lanes:
            rows = _rows_per_wg(p.group_rows, rows - 1)
    if subgroup and lanes > sub:
        raise ShapeError(f"decode schedule: {lanes} lanes per key exceed the subgroup ({sub}) "
                         "that their shuffles assume")

    local = 64 if profile.device_type == "cpu" else LOCAL_SIZE
    local = int(ov.pop("local_size", local))
    local = max(local, lanes, sub if subgroup else 1)
    local = min(local, profile.max_invocations, profile.max_workgroup_size[0])
    # Keys per lane group per step: 4 where a lane's slice of a key is small (>= 16 lanes per
    # key), else 2 (registers); lavapipe's 8-wide SIMD is best at 2.
    kpi = 2 if profile.device_type == "cpu" or lanes < 16 else KEYS_PER_ITER
    kpi = int(ov.pop("keys_per_iter", kpi))
    prefetch = bool(ov.pop("prefetch", True))
    fused_override = ov.pop("fused_combine", None)
    min_chunk_override = ov.pop("min_chunk", None)
    combine_rounds = int(ov.pop("combine_rounds", DecodeRequest.combine_rounds))
    fold_override = ov.pop("fold_units", None)
    fold_units = DecodeRequest.fold_units if fold_override is None else int(fold_override)
    f16_convert = str(ov.pop("f16_convert", "unpack"))
    dot_reduce = str(ov.pop("dot_reduce", "scatter" if short16 else DecodeRequest.dot_reduce))
    lazy_rescale = bool(ov.pop("lazy_rescale", short16 or DecodeRequest.lazy_rescale))
    qwg_override = ov.pop("q_workgroup", None)
    q_floats = rows * p.dk if qwg_override else 0
    if f16_convert == "fp16" and not profile.extra.get("shader_float16"):
        raise DtypeLowering("AttentionDecode", "f16 conversion through shaderFloat16")
    if ov:
        raise TypeError(f"unknown schedule overrides: {sorted(ov)}")
    # Fit the workgroup memory: halve the workgroup, then the keys per step.
    table = select_table_bytes(p.select_k if p.select_block else -1)
    while decode_shared_bytes(local, lanes, kpi, rows, p.dv, subgroup, 0, q_floats,
                              fold_units) + table > profile.max_workgroup_memory:
        if local > max(lanes, sub if subgroup else 1):
            local //= 2
        elif kpi > 1:
            kpi //= 2
        else:
            need = decode_shared_bytes(local, lanes, kpi, rows, p.dv, subgroup, 0, q_floats,
                                       fold_units) + table
            raise AttentionLds(p.dv, need, profile.max_workgroup_memory)

    blocks = p.group_rows // rows
    splits = _split_count(p, profile, blocks, (local // lanes) * kpi, force_splits, max_splits)
    out_rows = p.b * p.hq * p.lq
    groups = p.b * p.hkv * blocks * splits
    cu = profile.compute_units
    # Once the launch has a workgroup per compute unit, 128-lane workgroups pack the SMs
    # better (H200: (32,32,8,2048) F32 130.6 us vs 138.6, F16 80.6 vs 94.0; (8,32,8,8192)
    # F32 138.3 vs 153.8; (1,32,32,32768) F32 254.1 vs 268.4), except 16-bit K/V with one
    # row per workgroup (141.9 vs 135.4). Below one per CU each workgroup must keep more
    # keys in flight: (1,32,8,131072) F32 297 us at 128 lanes vs 254 at 256.
    if cu and "local_size" not in ov_keys and groups >= cu and local > 128 and \
            not (bytes_ == 2 and rows == 1) and profile.device_type != "cpu":
        local = max(128, lanes, sub if subgroup else 1)
        # ... and there unsplit 16-bit K/V at fewer than 16 lanes per key take 4 keys a
        # step: H200 (32,32,8,2048) F16 (8 lanes, 128-lane workgroups) 71.7 us against 75.9
        # at 2 (one run, bench/decode_probe.py --calls 10)
        if bytes_ == 2 and lanes < 16 and splits == 1 and "keys_per_iter" not in ov_keys and \
                decode_shared_bytes(local, lanes, KEYS_PER_ITER, rows, p.dv, subgroup) <= \
                profile.max_workgroup_memory:
            kpi = KEYS_PER_ITER
    q_workgroup = bool(qwg_override)
    if qwg_override is None and _long_16bit_chunks(p, profile, rows, lanes, splits, subgroup) \
            and "keys_per_iter" not in ov_keys and decode_shared_bytes(
                local, lanes, KEYS_PER_ITER, rows, p.dv, subgroup, 0, rows * p.dk) + table \
            <= profile.max_workgroup_memory:
        q_workgroup, kpi = True, KEYS_PER_ITER
        splits = _split_count(p, profile, blocks, (local // lanes) * kpi, force_splits,
                              max_splits)
        groups = p.b * p.hkv * blocks * splits
    fused, min_chunk = _fused_combine(profile, groups, splits, force_splits, fused_override,
                                      min_chunk_override)
    if fold_override is None:
        fold_units = _fold_units(profile, local, lanes, kpi, rows, p.dv, subgroup,
                                 splits if fused and splits > 1 else 0, q_floats=(
                                     rows * p.dk if q_workgroup else 0), table=table)
    combine_groups = -(-out_rows * p.dv // COMBINE_LOCAL)
    r = DecodeRequest(
        b=p.b, hq=p.hq, hkv=p.hkv, lq=p.lq, lk=p.lk, dk=p.dk, dv=p.dv, scale=float(p.scale),
        softcap=None if p.softcap is None else float(p.softcap), mask=p.mask,
        kv_dtype=p.kv_dtype, live_len=p.live_len, splits=splits, rows_per_wg=rows,
        lanes_per_key=lanes, local_size=local, keys_per_iter=kpi, load_elems=load_elems,
        subgroup=subgroup, grid=fold_grid(groups, profile.max_grid),
        combine_grid=fold_grid(combine_groups, profile.max_grid), prefetch=prefetch,
        fused_combine=fused, combine_rounds=combine_rounds, fold_units=fold_units,
        f16_convert=f16_convert,
        dot_reduce=dot_reduce, lazy_rescale=lazy_rescale, q_workgroup=q_workgroup,
        dk_shared=p.dk_shared, min_chunk=min_chunk,
        pool_slots=p.pool_slots, select_block=p.select_block, select_k=p.select_k,
        select_heads=p.select_heads,
    )
    if r.fused_combine and r.splits > 1 and r.shared_bytes > profile.max_workgroup_memory:
        # the fused combine's per-split weights do not fit: a second launch combines
        r = replace(r, fused_combine=False, min_chunk=0)
    check_request(r)
    # Few KV heads whose split count is capped leave compute units idle: half the rows a
    # workgroup doubles the workgroups (each row block reads the K/V again, mostly from
    # L2). H200, (1,8,1,65536) (one KV head, 64 splits, 64 workgroups of 8 rows): 4 rows
    # (128 workgroups) F16 28.9 us against 44.7, F32 41.4 against 51.0 (one run,
    # bench/decode_probe.py --calls 10); 2 rows (256) 37.4 / 44.4.
    half = r.rows_per_wg // 2
    if (cu and profile.device_type != "cpu" and p.lq == 1 and half >= 1
            and "rows_per_wg" not in ov_keys and "max_rows" not in ov_keys
            and r.workgroups * 2 <= cu and p.group_rows % half == 0):
        return _choose_schedule(p, profile, has_subgroup_shuffle, force_splits, max_splits,
                                {**overrides, "rows_per_wg": half})
    return r


def _long_16bit_chunks(p: DecodeProblem, profile: DeviceProfile, rows: int, lanes: int,
                       splits: int, subgroup: bool) -> bool:
    """Split 16-bit K/V whose workgroups each stream at least LONG_CHUNK_KEYS keys, several
    rows at fewer than 16 lanes per key: there the query rows go to workgroup memory
    (``DecodeRequest.q_workgroup``) and the registers they held carry 4 keys a step.

    H200, D=128, (1,32,8,131072) F16 (16 splits, 8192 keys a workgroup, 8 lanes per key),
    three runs of one session (bench/decode_probe.py --calls 10): 140.7-140.9 us against
    144.9-145.9 as before (2 keys a step, the query in registers: 251 registers a lane,
    NVIDIA's pipeline statistics; 172 with the query in workgroup memory, 254 with it
    there and 4 keys a step; 4 keys a step with the query in registers, 255, ran
    146.8-147.3; the query read from its buffer at each use with 4 keys a step, 158-160).
    Shorter chunks lose: (1,32,8,65536) (4096 keys a workgroup) 80.2 us against 78.7,
    (1,32,8,32768) 50.1 against 46.2; and the query in workgroup memory at the keys a step
    planned now is slower: (1,32,8,32768) 55.5 us against 46.2, (8,32,8,8192) 82.9 against
    77.6, (32,32,8,2048) 72.7 against 71.8."""
    return (kv_itemsize(p.kv_dtype) == 2 and rows > 1 and lanes < 16 and splits > 1
            and subgroup and bool(profile.compute_units) and profile.device_type != "cpu"
            and p.keys // splits >= LONG_CHUNK_KEYS)


def check_request(r: DecodeRequest) -> None:
    """Raise ShapeError if a (hand-made or overridden) request cannot be generated."""
    def bad(why: str) -> ShapeError:
        return ShapeError(f"decode schedule: {why}: {r.describe()}")

    if r.combine_rounds not in (1, 2):
        raise bad("combine_rounds must be 1 or 2")
    if r.interleave and r.splits == 1:
        raise bad("interleave takes a split's tiles in turn: it needs splits > 1")
    if r.fold_units < 1 or (r.fold_units > 1 and r.matrix):
        raise bad("fold_units is the scalar kernel's, at least 1")
    if r.select_block:
        check_selected_mode(r, "decode schedule")
        if r.lq > 1 and r.rows_per_wg != 1:
            raise bad("selected keys with Lq > 1 take one query row a workgroup (each row "
                      "has its own block table)")
    if r.matrix:
        _check_matrix(r, bad)
        return
    lk = r.lanes_per_key
    if lk < 1 or lk & (lk - 1):
        raise bad("lanes_per_key must be a power of two")
    if r.local_size % lk:
        raise bad("local_size must be a multiple of lanes_per_key")
    if r.load_elems not in (1, 4, 8) or (r.kv_dtype != "f32" and r.load_elems == 1) or \
            (r.kv_dtype == "f32" and r.load_elems == 8):
        raise bad("load_elems must be 4 or 1 (f32), 4 or 8 (16-bit)")
    for d in (*r.key_widths, r.dv):
        if d % (r.load_elems * lk):
            raise bad(f"width {d} is not a multiple of load_elems * lanes_per_key")
    if r.group_rows % r.rows_per_wg:
        raise bad("rows_per_wg must divide n_rep * lq")
    if r.f16_convert not in ("unpack", "fp16"):
        raise bad("f16_convert must be 'unpack' or 'fp16'")
    if r.dot_reduce not in ("butterfly", "scatter"):
        raise bad("dot_reduce must be 'butterfly' or 'scatter'")
    if r.keys_per_iter < 1 or r.splits < 1:
        raise bad("keys_per_iter and splits must be >= 1")
    if r.min_chunk < 0 or (r.min_chunk and not (r.splits > 1 and r.fused_combine)):
        raise bad("min_chunk needs a fused split (and is >= 0)")
    if r.pool_slots < 0 or (r.pool_slots and r.dk_shared):
        raise bad("a key is dense, split or paged (pool_slots with dk_shared)")
    if r.prefetch_steps != 1 or r.score_accumulators != 1:
        raise bad("prefetch_steps and score_accumulators are the matrix kernel's")


def _check_matrix(r: DecodeRequest, bad) -> None:
    """The matrix kernel's own constraints (see DecodeRequest.matrix)."""
    if r.matrix != 16:
        raise bad("matrix must be 0 or 16")
    if r.matrix_feed not in ("staged", "registers"):
        raise bad("matrix_feed must be 'staged' or 'registers'")
    if r.matrix_feed == "registers":
        if r.dk % 32 or r.dv % 64 or r.dk_shared or r.select_block:
            raise bad("the register-fed matrix kernel reads dense keys with Dk a multiple of "
                      "32 and Dv of 64")
        if r.rows_per_wg > 16 or r.keys_per_iter != 16 or r.prefetch_steps != 1 \
                or r.score_accumulators != 1:
            raise bad("the register-fed matrix kernel serves <= 16 rows, one 16-key block a "
                      "subgroup a step, one step in flight, one score accumulator")
        nsg = r.local_size // 32
        if nsg & (nsg - 1):
            raise bad("the register-fed matrix kernel folds a power-of-two count of subgroups")
    if r.q_workgroup:
        raise bad("q_workgroup is the scalar kernel's (the matrix kernel stages its query)")
    if r.kv_dtype != "f16" or r.paged:
        raise bad("the matrix kernel reads dense f16 K/V")
    if any(w % 16 for w in (*r.key_widths, r.dv)):
        raise bad("the matrix kernel needs head widths that are multiples of 16")
    if not 1 <= r.rows_per_wg <= 32 or r.group_rows % r.rows_per_wg:
        raise bad("the matrix kernel serves 1..32 query rows per workgroup, dividing the group")
    if (r.local_size // 32) % -(-r.rows_per_wg // 16):
        raise bad("the subgroups split evenly over the 16-row tiles")
    if r.local_size % 32 or r.lanes_per_key != 32 or not r.subgroup:
        raise bad("the matrix kernel's lanes are whole 32-lane subgroups")
    nsg, nkb = r.local_size // 32, r.tile // 16
    if r.tile % 16 or not nkb or (nkb % nsg and nsg % nkb):
        raise bad("the tile is whole 16-key blocks that divide or are divided by the subgroups")
    if r.q_split and r.tile < 32 and r.matrix_feed == "staged":
        raise bad("the matrix kernel keeps the query's lo part in tile rows 16..31")
    if r.splits < 1 or (r.min_chunk and not (r.splits > 1 and r.fused_combine)):
        raise bad("splits >= 1; min_chunk needs a fused split")
    if not 1 <= r.prefetch_steps <= 4 or (r.prefetch_steps > 1 and not r.prefetch):
        raise bad("prefetch_steps is 1..4 (more than 1 with prefetch)")
    if not 1 <= r.score_accumulators <= 4:
        raise bad("score_accumulators is 1..4")


#: The cooperative-matrix shape the matrix kernel is written for (VK_KHR_cooperative_matrix
#: properties as ``pootvk.vk.physical.cooperative_matrix_shapes`` lists them).
COOPMAT_SHAPE = "16x16x16 f16 f16 f32 f32"
MATRIX = 16
#: Schedule overrides that only the scalar kernel reads.
SCALAR_ONLY = frozenset({"lanes_per_key", "keys_per_iter", "load_elems", "subgroup",
                         "max_rows", "f16_convert", "dot_reduce", "lazy_rescale",
                         "q_workgroup"})
#: The element layout the register-fed matrix kernel is written for
#: (``pootvk.vk.coopmat_layout``, read back from the device into its profile).
REGFED_LAYOUT = "nv_mma"
#: Widest Dk and Dv the register-fed kernel takes (its registers, see regfed_supported).
REGFED_MAX_WIDTH = 128
#: Fewest query rows per KV head for which the planner takes the register-fed kernel.
REGFED_MIN_ROWS = 2
#: ... and the fewest keys a workgroup streams (its chunk): its fixed costs (the query
#: staged into matrices, the fold of the subgroups, a longer combine) are paid per
#: workgroup. H200, F16 D=128, one call (bench/decode_probe.py --calls 10), register-fed
#: against the scalar kernel: (1,32,8,131072) chunk 8192 137.6-139.5 us vs 141.0;
#: (8,32,8,8192) 4096 74.0-74.7 vs 77.9-80.4; (32,32,8,2048) 2048 72.3-73.0 vs 71.8;
#: (1,32,8,32768) 2048 48.2-48.7 vs 46.2; (1,32,8,4096) 256 17.1-18.2 vs 14.4;
#: (1,8,1,65536) 1024 30.5 vs 29.3. With the fold's slots padded against bank conflicts
#: (``regfed_fold_stride``: the fold 2.9 -> 1.3 us), session 24, one call: (1,32,8,32768)
#: 2048 45.6 vs 46.1; (32,32,8,2048) 2048 70.1 vs 72.1-73.3; (1,32,8,16384) 1024 30.6 vs
#: 29.7.
REGFED_MIN_CHUNK = 2048
#: Subgroups per register-fed workgroup: where the row blocks fill the compute units
#: (two 128-lane workgroups an SM), and where splits fill them (one 256-lane workgroup).
REGFED_SUBGROUPS = 4
REGFED_SUBGROUPS_FEW = 8
#: Schedule overrides the register-fed kernel reads (``_choose_regfed``); others (the
#: staged kernel's tile, prefetch_steps ...) keep the planner off it unless it is named.
REGFED_OVERRIDES = frozenset({"rows_per_wg", "local_size", "prefetch", "q_split",
                              "fused_combine", "min_chunk", "combine_rounds"})
#: The matrix kernel is planned (where the device has it) when a KV head's query rows hold
#: more than this many query + accumulator floats, group_rows * (dk + dv): there the scalar
#: kernel is bound by its per-lane registers and FMAs. H200, one session
#: (bench/decode_probe.py, bench/mla_decode.py, F16): the MLA decode shape (128 rows x 1088)
#: 467-473 us against 843-1125 for the scalar kernel; D=128 GQA (4 rows x 256) the scalar
#: kernel wins everywhere (32k keys 54 us against 84 at best; 2k x 32 rows 80 against 135),
#: 8 rows x 256 about even (45.5 against 48.9 us). Why the matrix kernel is not faster
#: there: on this driver a cooperative-matrix load straight from a storage buffer costs about
#: one memory latency, loads of one step barely overlap (bench/coopmat_load_probe.py).
MATRIX_MIN_STATE = 4096
#: Subgroups per matrix workgroup; wide values (dv >= 256) take MATRIX_SUBGROUPS_WIDE (the
#: MLA shape, H200: 303-329 us at 8 against 404 at 4; the first, direct-load version 473
#: against 837).
MATRIX_SUBGROUPS = 4
MATRIX_SUBGROUPS_WIDE = 8
#: The matrix kernel prefetches the next tile's 16-byte words while they take at most this
#: many registers a lane (D=128, 64 keys, 128 lanes: 64; the MLA shape, 16 keys, 256: 40).
MATRIX_PREFETCH_WORD_REGS = 64


def lists_coopmat(profile: DeviceProfile) -> bool:
    """Whether the device lists the cooperative matrix the matrix kernel is written for
    (``COOPMAT_SHAPE``)."""
    return COOPMAT_SHAPE in (profile.extra.get("coopmat") or ())


def matrix_supported(p: DecodeProblem, profile: DeviceProfile, has_subgroup_shuffle: bool) -> bool:
    """Whether the tensor-core kernel can serve ``p`` on ``profile``: the device lists the
    16x16x16 f16 -> f32 cooperative matrix (VK_KHR_cooperative_matrix), 32-lane subgroups
    with shuffles, f16 arithmetic and 16-bit storage; dense f16 K/V whose widths are
    multiples of 16."""
    ex = profile.extra
    return (lists_coopmat(profile) and profile.subgroup_size == 32
            and has_subgroup_shuffle and bool(ex.get("shader_float16"))
            and bool(ex.get("storage_buffer_16bit")) and p.kv_dtype == "f16"
            and not p.pool_slots and not (p.select_block and p.lq > 1)
            and all(w % 16 == 0 for w in (*p.key_widths, p.dv)))


def regfed_supported(p: DecodeProblem, profile: DeviceProfile,
                     has_subgroup_shuffle: bool) -> bool:
    """Whether the register-fed matrix kernel can serve ``p`` on ``profile``: the matrix
    kernel's needs (``matrix_supported``), the element layout it is written for read back
    from the device (``extra["coopmat_layout"]`` = REGFED_LAYOUT), dense keys with Dk a
    multiple of 32 and Dv of 64, both at most REGFED_MAX_WIDTH (a lane holds Dv / 2
    accumulator floats, Dk / 2 query halves and two steps of K/V words: 255 registers at
    128, none spilled)."""
    return (matrix_supported(p, profile, has_subgroup_shuffle)
            and profile.extra.get("coopmat_layout") == REGFED_LAYOUT
            and not p.dk_shared and not p.select_block
            and p.dk % 32 == 0 and p.dv % 64 == 0
            and p.dk <= REGFED_MAX_WIDTH and p.dv <= REGFED_MAX_WIDTH)


def regfed_planned(p: DecodeProblem, profile: DeviceProfile, has_subgroup_shuffle: bool) -> bool:
    """Whether the planner may take the register-fed matrix kernel for ``p``: where it is
    supported and a KV head serves at least REGFED_MIN_ROWS query rows (with one row the
    matrices are 1/16 used and the scalar kernel's per-byte work is small). It then takes
    it when its workgroups stream at least REGFED_MIN_CHUNK keys each."""
    return p.group_rows >= REGFED_MIN_ROWS and regfed_supported(p, profile, has_subgroup_shuffle)


def _choose_regfed(p: DecodeProblem, profile: DeviceProfile, force_splits: int | None,
                   max_splits: int, ov: dict) -> DecodeRequest:
    """The register-fed matrix kernel's schedule: up to 16 rows a workgroup (the largest
    divisor of the group); when the (batch row, KV head, row block) workgroups do not fill
    the compute units, REGFED_SUBGROUPS_FEW subgroups a workgroup and splits for one
    workgroup per compute unit (at most MAX_SPLITS, MAX_SPLITS_FEW where even that leaves
    half of them idle), else REGFED_SUBGROUPS and the scalar kernel's split rule; the next
    step's words in flight and the query as hi + lo f16 parts. H200 (255 registers a lane:
    one 256-lane or two 128-lane workgroups an SM), F16 D=128, partial kernel of a
    hand-written prototype (BENCHMARKS.md, session 23): (1,32,8,131072) 16 splits x 256
    lanes 128.2 us, 32 x 128 127.7; (8,32,8,8192) 2 x 256 69.2, 4 x 128 68.5;
    (32,32,8,2048) unsplit 128 lanes 68.4, 64 lanes 78.5."""
    rows = int(ov.pop("rows_per_wg", _rows_per_wg(p.group_rows, 16)))
    blocks = p.group_rows // rows
    base = p.b * p.hkv * blocks
    cu = profile.compute_units
    few = bool(cu) and base < cu and p.lq == 1 and profile.device_type != "cpu"
    nsg = int(ov.pop("local_size", 32 * (REGFED_SUBGROUPS_FEW if few else REGFED_SUBGROUPS)))
    nsg //= 32
    tile = 16 * nsg
    prefer = None
    if few:
        cap = max_splits
        if base * max_splits * 2 <= cu and p.kv_bytes > FEW_SPLITS_BYTES * p.b * p.hkv:
            cap = max(cap, MAX_SPLITS_FEW)
        most = max(1, p.keys // (-(-MIN_CHUNK // tile) * tile))
        prefer = max(1, min(cap, cu // base, most))
    splits = _split_count(p, profile, blocks, tile, force_splits, max_splits, prefer)
    prefetch = bool(ov.pop("prefetch", True))
    q_split = bool(ov.pop("q_split", True))
    fused_override = ov.pop("fused_combine", None)
    min_chunk_override = ov.pop("min_chunk", None)
    combine_rounds = int(ov.pop("combine_rounds", DecodeRequest.combine_rounds))
    if ov:
        raise TypeError(f"unknown register-fed matrix schedule overrides: {sorted(ov)}")
    return _matrix_request(p, profile, rows=rows, nsg=nsg, splits=splits,
                           force_splits=force_splits, fused_override=fused_override,
                           min_chunk_override=min_chunk_override, keys_per_iter=16,
                           prefetch=prefetch, combine_rounds=combine_rounds,
                           matrix_feed="registers", q_split=q_split)


def _matrix_request(p: DecodeProblem, profile: DeviceProfile, *, rows: int, nsg: int,
                    splits: int, force_splits: int | None, fused_override: object,
                    min_chunk_override: object, **fields: object) -> DecodeRequest:
    """A matrix kernel's request (staged or register-fed) from its rows a workgroup,
    subgroups and splits: the fused combine by ``_fused_combine`` (dropped where its
    weights would not fit the workgroup memory), ``AttentionLds`` where the kernel itself
    does not fit, then checked. ``fields`` are the kernel's own DecodeRequest fields."""
    groups = p.b * p.hkv * (p.group_rows // rows) * splits
    fused, min_chunk = _fused_combine(profile, groups, splits, force_splits, fused_override,
                                      min_chunk_override)
    r = DecodeRequest(
        b=p.b, hq=p.hq, hkv=p.hkv, lq=p.lq, lk=p.lk, dk=p.dk, dv=p.dv, scale=float(p.scale),
        softcap=None if p.softcap is None else float(p.softcap), mask=p.mask,
        kv_dtype=p.kv_dtype, live_len=p.live_len, splits=splits, rows_per_wg=rows,
        lanes_per_key=32, local_size=32 * nsg, load_elems=8, subgroup=True,
        grid=fold_grid(groups, profile.max_grid),
        combine_grid=fold_grid(-(-p.b * p.hq * p.lq * p.dv // COMBINE_LOCAL),
                               profile.max_grid),
        fused_combine=fused, min_chunk=min_chunk, matrix=MATRIX,
        **fields,  # type: ignore[arg-type]
    )
    if r.fused_combine and r.splits > 1 and r.shared_bytes > profile.max_workgroup_memory:
        r = replace(r, fused_combine=False, min_chunk=0)
    if r.shared_bytes > profile.max_workgroup_memory:
        raise AttentionLds(p.dv, r.shared_bytes, profile.max_workgroup_memory)
    check_request(r)
    return r


def _one_wave_splits(p: DecodeProblem, profile: DeviceProfile, blocks: int,
                     tile: int) -> int | None:
    """Splits for a wide-head matrix launch: one workgroup per compute unit (its registers
    and workgroup memory leave one resident per SM), chunks of at least MIN_CHUNK keys, at
    most MAX_SPLITS_FEW; None (no split) where default_splits would not split either.
    H200, the MLA shape at 32 rows a workgroup (4 row blocks): 33 splits (132 workgroups)
    217.0 us against 238.7 at 64 (two waves) and 410.5 at 16 (64 workgroups)."""
    cu = profile.compute_units
    base = p.b * p.hkv * blocks
    if p.lq > 1 or not cu or profile.device_type == "cpu" or base >= cu:
        return None
    splits = min(MAX_SPLITS_FEW, -(-cu // base), max(1, p.keys // MIN_CHUNK))
    return splits if splits > 1 else None


def _choose_matrix(p: DecodeProblem, profile: DeviceProfile, force_splits: int | None,
                   max_splits: int, ov: dict) -> DecodeRequest:
    """The matrix kernel's schedule (see DecodeRequest.matrix): rows per workgroup the
    largest divisor of the group up to 16 (one 16-row tile), up to 32 for wide heads (dv >=
    256: two tiles); MATRIX_SUBGROUPS subgroups (MATRIX_SUBGROUPS_WIDE for wide heads) and
    a tile of 16 keys per subgroup (16 for wide heads), halved until the workgroup memory
    fits; the next tile prefetched and the query held as hi + lo f16 parts where registers
    allow; splits and the fused combine by the scalar kernel's rules (``_split_count``,
    ``_fused_combine``), wide heads one workgroup per compute unit (``_one_wave_splits``)."""
    wide = p.dv >= 256
    # Wide heads take two 16-row tiles a workgroup (each staged K/V tile serves 32 rows: the
    # 8 row blocks of the MLA shape re-read K/V half as often, twice the products per barrier)
    rows = int(ov.pop("rows_per_wg", _rows_per_wg(p.group_rows, 32 if wide else 16)))
    nsg = MATRIX_SUBGROUPS_WIDE if wide else MATRIX_SUBGROUPS
    nsg = int(ov.pop("local_size", 32 * nsg)) // 32
    # a step's tile: 16 keys for wide heads (K and V rows of 1-2 KiB: a tile of 16 is ~35 KB
    # of workgroup memory), else 16 keys per subgroup; shrunk to fit
    tile = int(ov.pop("tile", 16 if wide else 16 * nsg))
    while tile > 16 and staged_shared_bytes(nsg, tile, p.dk, p.dv, rows, MAX_SPLITS) > \
            profile.max_workgroup_memory:
        tile //= 2
    words = -(-tile * (p.dk + p.dv) // 8 // (32 * nsg))  # 16-byte words a lane holds
    prefetch = bool(ov.pop("prefetch", 4 * words <= MATRIX_PREFETCH_WORD_REGS))
    steps = int(ov.pop("prefetch_steps", 1))
    nacc = int(ov.pop("score_accumulators", 1))
    q_split = ov.pop("q_split", None)
    fused_override = ov.pop("fused_combine", None)
    min_chunk_override = ov.pop("min_chunk", None)
    combine_rounds = int(ov.pop("combine_rounds", DecodeRequest.combine_rounds))
    if ov:
        raise TypeError(f"unknown matrix schedule overrides: {sorted(ov)}")
    if q_split is None:  # two query parts in registers: the chunks a subgroup uses, twice
        q_split = tile >= 32 and 2 * -(-(p.dk // 16) // max(1, nsg // (tile // 16))) <= 16
    blocks = p.group_rows // rows
    splits = _split_count(p, profile, blocks, tile, force_splits, max_splits,
                          _one_wave_splits(p, profile, blocks, tile) if wide else None)
    return _matrix_request(p, profile, rows=rows, nsg=nsg, splits=splits,
                           force_splits=force_splits, fused_override=fused_override,
                           min_chunk_override=min_chunk_override, keys_per_iter=tile // nsg,
                           prefetch=prefetch, combine_rounds=combine_rounds,
                           dk_shared=p.dk_shared, q_split=bool(q_split),
                           prefetch_steps=steps if prefetch else 1, score_accumulators=nacc,
                           select_block=p.select_block, select_k=p.select_k,
                           select_heads=p.select_heads)
