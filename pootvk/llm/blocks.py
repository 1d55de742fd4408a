"""The host side of a paged KV cache: the block pool, per-sequence block tables, and the
slot maps one batched step binds.

Why: a fixed-capacity cache reserves ``cap`` positions for every row whatever its length,
and two requests with the same prompt cannot share its K/V. A paged cache cuts each layer's
K and V pools ``[pool_slots, Hkv, D]`` into blocks of ``BLOCK_SIZE`` slots, gives a sequence
blocks as it grows (a :class:`BlockTable`) and lets sequences share blocks by reference
count (vLLM's block manager is the model). The device never sees a table: each step binds
two int32 maps built here (seed, "Paged KV"):

- ``read`` ``[rows, cap]``: row ``r``'s logical position ``t`` -> its flat pool slot
  (:func:`read_map`); the attention reads key ``t`` of row ``r``, KV head ``g`` at pool row
  ``read[r, t] * Hkv + g``.
- ``write`` ``[rows * tokens]``: each new token -> the slot its K/V row is scattered to, or
  ``-1`` (a padding token writes nothing) (:func:`write_map`, checked by
  :func:`check_write_map`: no slot outside the pool, none named twice).

A copy-on-write (:meth:`BlockTable.append`) returns ``(src_block, dst_block)`` copies the
caller runs on every layer's pools before the step (:func:`copy_slots` gives their slots).

Slot arithmetic: position ``t`` of a table lives in block ``blocks[t // BLOCK_SIZE]`` at
offset ``t % BLOCK_SIZE``, flat slot ``block * BLOCK_SIZE + offset``.

The pool also keeps the blocks a prefix cache (``prefix_cache.py``) holds: a cached block no
table references is *evictable*, kept with its K/V until an allocation needs the space,
then evicted least recently released first. Pure host code: no Vulkan here.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import PoolExhausted, SlotMapError

#: Tokens (pool slots) per block: the seed's poot_llm::driver::block_table::BLOCK_SIZE.
BLOCK_SIZE = 16

#: Pool-wide copies a caller performs on every layer's K and V pools before a step:
#: ``(src_block, dst_block)`` copies slots ``[src*16, src*16+16)`` to ``[dst*16, ...)``.
BlockCopy = tuple[int, int]


def blocks_for(tokens: int) -> int:
    """Blocks that hold ``tokens`` positions."""
    return -(-tokens // BLOCK_SIZE)


class BlockPool:
    """``num_blocks`` blocks of ``BLOCK_SIZE`` slots, reference-counted.

    Every block is in exactly one of three states:

    - **free**: reference count 0, holds nothing anyone wants;
    - **used**: reference count > 0 (the number of block tables that hold it);
    - **evictable**: reference count 0 but registered as cached by the prefix cache
      (:meth:`mark_cached`), so its K/V may be reused by a later request. Kept in LRU order
      (least recently released first).

    :meth:`allocate` takes free blocks first and evicts the least recently released
    evictable blocks only for the rest, calling ``on_evict(block)`` for each so the prefix
    cache forgets it. It is all-or-nothing: when ``free + evictable < n`` it raises
    :class:`PoolExhausted` and changes nothing.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: set[int] = set()
        self._evictable: OrderedDict[int, None] = OrderedDict()
        #: Called with each evicted block (set by the prefix cache that owns the hashes).
        self.on_evict: Callable[[int], None] | None = None

    # --- counts -----------------------------------------------------------------------

    @property
    def pool_slots(self) -> int:
        """Rows of each layer's K/V pool: the bound of every slot a map may name."""
        return self.num_blocks * BLOCK_SIZE

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (free plus evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def is_cached(self, block: int) -> bool:
        return block in self._cached

    def free_blocks(self) -> frozenset[int]:
        """Blocks in the free state (for checks; evictable ones are not included)."""
        return frozenset(self._free)

    def evictable_blocks(self) -> list[int]:
        """Evictable blocks, least recently released first (the eviction order)."""
        return list(self._evictable)

    # --- allocation -------------------------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks, each with reference count 1; all or nothing."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > self.num_free:
            raise PoolExhausted(n, self.num_free, self.num_blocks)
        out: list[int] = []
        while len(out) < n and self._free:
            out.append(self._free.popleft())
        while len(out) < n:
            block, _ = self._evictable.popitem(last=False)
            self._cached.discard(block)
            if self.on_evict is not None:
                self.on_evict(block)
            out.append(block)
        for b in out:
            self._ref[b] = 1
        return out

    def incref(self, block: int) -> None:
        """One more holder of a used or evictable block (pinning a cached block takes it out
        of the eviction order). A free block cannot gain a holder: allocate it."""
        if self._ref[block] == 0:
            if block not in self._evictable:
                raise ValueError(f"block {block} is free; allocate it instead of sharing it")
            del self._evictable[block]
        self._ref[block] += 1

    def decref(self, block: int) -> None:
        """One holder fewer; at zero a cached block becomes evictable (most recent), any
        other block free."""
        if self._ref[block] <= 0:
            raise ValueError(f"block {block} has no holder to release")
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if block in self._cached:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def mark_cached(self, block: int) -> None:
        """The prefix cache holds this (used) block's K/V: keep it when its last holder
        releases it, until an allocation evicts it."""
        if self._ref[block] == 0:
            raise ValueError(f"block {block} is not in use; only a written block is cached")
        self._cached.add(block)


class BlockTable:
    """One sequence's blocks: logical position ``t`` -> slot
    ``blocks[t // BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE``.

    The table holds one reference to each of its blocks. ``length`` counts the positions it
    maps: the tokens already written plus those the next step writes (call :meth:`append`
    before building the step's maps).
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.blocks: list[int] = []
        self.length = 0

    @classmethod
    def sharing(cls, pool: BlockPool, blocks: Sequence[int], length: int) -> BlockTable:
        """A table that holds ``blocks`` (one more reference each) for ``length`` positions:
        a fork, or a request pointed at cached prefix blocks."""
        if blocks_for(length) != len(blocks):
            raise ValueError(f"{length} positions need {blocks_for(length)} blocks, "
                             f"got {len(blocks)}")
        for b in blocks:
            pool.incref(b)
        t = cls(pool)
        t.blocks, t.length = list(blocks), length
        return t

    def fork(self) -> BlockTable:
        """A second table over the same blocks (parallel sampling, beam search): the shared
        partial last block is copied on the first write (:meth:`append`)."""
        return BlockTable.sharing(self.pool, self.blocks, self.length)

    def append(self, n_tokens: int) -> list[BlockCopy]:
        """Map ``n_tokens`` more positions; return the block copies to run before the step.

        Allocates the blocks the new positions need. When the first new position falls in a
        partial last block that another table also holds (reference count > 1), that block
        is copied on write: the table gets a fresh block and the returned ``(src, dst)``
        copy must run on every layer's K and V pools before the step writes. All or nothing:
        :class:`PoolExhausted` leaves the table and the pool unchanged.
        """
        if n_tokens < 0:
            raise ValueError(f"cannot append {n_tokens} tokens")
        if n_tokens == 0:
            return []
        partial = self.length % BLOCK_SIZE != 0
        cow = partial and self.pool.ref_count(self.blocks[-1]) > 1
        new = blocks_for(self.length + n_tokens) - len(self.blocks)
        fresh = self.pool.allocate(new + int(cow))
        copies: list[BlockCopy] = []
        if cow:
            src, dst = self.blocks[-1], fresh.pop(0)
            self.pool.decref(src)  # still held by another table: count stays > 0
            self.blocks[-1] = dst
            copies.append((src, dst))
        self.blocks.extend(fresh)
        self.length += n_tokens
        return copies

    def slot(self, position: int) -> int:
        if not 0 <= position < self.length:
            raise SlotMapError("block table", position, position,
                               f"the table maps positions [0, {self.length})")
        return self.blocks[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE

    def slots(self) -> np.ndarray:
        """int32 [length]: the slot of every mapped position."""
        t = np.arange(self.length)
        return (np.asarray(self.blocks, np.int64)[t // BLOCK_SIZE] * BLOCK_SIZE
                + t % BLOCK_SIZE).astype(np.int32)

    def free(self) -> None:
        """Release every block (last block first, so a cached tail is evicted before the
        prefix it extends); the table is empty afterwards."""
        for b in reversed(self.blocks):
            self.pool.decref(b)
        self.blocks, self.length = [], 0


# --- slot maps for one step of a batch -------------------------------------------------------


def read_map(tables: Sequence[BlockTable | None], cap: int) -> np.ndarray:
    """int32 ``[rows, cap]``: ``out[r, t]`` is row ``r``'s slot of position ``t``.

    Positions at or past a row's length, and every position of a padding row (``None``),
    read slot 0: they are masked out by the row's live length, and 0 is a pool slot, so the
    map stays inside the range the bind checks. A row longer than ``cap`` is refused.
    """
    out = np.zeros((len(tables), cap), np.int32)
    for r, t in enumerate(tables):
        if t is None:
            continue
        if t.length > cap:
            raise SlotMapError("read", r, t.length,
                               f"row {r} holds {t.length} positions; the map has {cap} columns")
        out[r, : t.length] = t.slots()
    return out


def write_map(tables: Sequence[BlockTable | None], new_positions: object) -> np.ndarray:
    """int32 ``[rows * tokens]``: the slot each new token's K/V row is written to.

    ``new_positions`` is ``[rows, tokens]`` logical positions (``-1``: a padding token);
    a padding row (``None``) must have only ``-1``. Each position must already be mapped by
    its row's table (:meth:`BlockTable.append` first). Padding tokens map to ``-1``, which
    the scatter skips.
    """
    pos = np.asarray(new_positions, np.int64)
    if pos.ndim != 2 or pos.shape[0] != len(tables):
        raise ValueError(f"new_positions must be [rows={len(tables)}, tokens], got {pos.shape}")
    out = np.full(pos.shape, -1, np.int64)
    for r, t in enumerate(tables):
        p = pos[r]
        real = p != -1
        length = 0 if t is None else t.length
        bad = np.nonzero(real & ((p < 0) | (p >= length)))[0]
        if bad.size:
            j = int(bad[0])
            why = (f"row {r} is a padding row; its tokens must be -1" if t is None
                   else f"row {r}'s table maps positions [0, {length})")
            raise SlotMapError("write", r * pos.shape[1] + j, int(p[j]), why)
        if t is not None and real.any():
            q = p[real]
            out[r, real] = np.asarray(t.blocks, np.int64)[q // BLOCK_SIZE] * BLOCK_SIZE \
                + q % BLOCK_SIZE
    return check_write_map(out.reshape(-1), _pool_slots(tables))


def _pool_slots(tables: Sequence[BlockTable | None]) -> int:
    """The slots of the tables' one pool (rows of different pools cannot share a step); 0
    when every row is padding (then every word is -1)."""
    pools = {id(t.pool): t.pool for t in tables if t is not None}
    if len(pools) > 1:
        raise ValueError("the rows of one step must share one BlockPool")
    return next(iter(pools.values())).pool_slots if pools else 0


def check_write_map(write: object, pool_slots: int) -> np.ndarray:
    """The seed's ForwardSlotMap rule: return ``write`` as int32 ``[n]``, or refuse it.

    Every word is ``-1`` (writes nothing) or a slot in ``[0, pool_slots)``, and no slot is
    named twice (two writers of one row would make the result depend on scheduling). The
    error names the first offending index (for a duplicate, its second occurrence) and
    value. The device bind calls this before anything dispatches.
    """
    m = np.asarray(write)
    if m.ndim != 1 or not np.issubdtype(m.dtype, np.integer):
        raise ValueError(f"a write map is a 1-D integer array, got {m.dtype} {m.shape}")
    m = m.astype(np.int64)
    bad = np.nonzero((m < -1) | (m >= pool_slots))[0]
    if bad.size:
        i = int(bad[0])
        raise SlotMapError("write", i, int(m[i]), f"outside the pool [0, {pool_slots}) and not -1")
    idx = np.nonzero(m >= 0)[0]
    order = np.argsort(m[idx], kind="stable")
    sorted_vals = m[idx][order]
    dup = np.nonzero(sorted_vals[1:] == sorted_vals[:-1])[0]
    if dup.size:
        second = idx[order][dup + 1]  # stable sort: the later occurrence of each pair
        i = int(second.min())
        first = int(np.nonzero(m[:i] == m[i])[0][0])
        raise SlotMapError("write", i, int(m[i]), f"slot already written by entry {first}")
    return m.astype(np.int32)


def copy_slots(copies: Sequence[BlockCopy]) -> tuple[np.ndarray, np.ndarray]:
    """int32 ``(src, dst)`` slots of block copies, ``BLOCK_SIZE`` per copy, in order.

    The caller runs ``pool[dst] = pool[src]`` on every layer's K and V pools before the
    step: a gather and a ScatterUpdate through ``dst`` (fresh blocks, each named once, so
    ``dst`` passes :func:`check_write_map`).
    """
    offsets = np.arange(BLOCK_SIZE, dtype=np.int64)
    src = [s * BLOCK_SIZE + offsets for s, _ in copies]
    dst = [d * BLOCK_SIZE + offsets for _, d in copies]
    empty = np.zeros(0, np.int64)
    return (np.concatenate([empty, *src]).astype(np.int32),
            np.concatenate([empty, *dst]).astype(np.int32))
