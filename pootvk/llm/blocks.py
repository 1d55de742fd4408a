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
  :func:`check_write_map`, ``ir.slotmap.ForwardSlotMap``'s rule: no slot outside the
  pool, none named twice).

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
from ..ir.slotmap import ForwardSlotMap

#: Tokens (pool slots) per block: the seed's poot_llm::driver::block_table::BLOCK_SIZE.
BLOCK_SIZE = 16

#: Pool-wide copies a caller performs on every layer's K and V pools before a step:
#: ``(src_block, dst_block)`` copies slots ``[src*16, src*16+16)`` to ``[dst*16, ...)``.
BlockCopy = tuple[int, int]

_OFFSETS = np.arange(BLOCK_SIZE, dtype=np.int32)


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

    def can_share(self, block: int) -> bool:
        """Whether :meth:`incref` accepts ``block``: used, or evictable (cached)."""
        return self._ref[block] > 0 or block in self._evictable

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
        if not self.can_share(block):
            raise ValueError(f"block {block} is free; allocate it instead of sharing it")
        if self._ref[block] == 0:
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
    before building the step's maps). ``blocks`` is read-only outside this class (the maps
    read a cached array of it).
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.blocks: list[int] = []
        self.length = 0
        self._array: np.ndarray | None = None

    @classmethod
    def sharing(cls, pool: BlockPool, blocks: Sequence[int], length: int) -> BlockTable:
        """A table that holds ``blocks`` (one more reference each) for ``length`` positions:
        a fork, or a request pointed at cached prefix blocks."""
        if blocks_for(length) != len(blocks):
            raise ValueError(f"{length} positions need {blocks_for(length)} blocks, "
                             f"got {len(blocks)}")
        free = [b for b in blocks if not pool.can_share(b)]
        if free:  # checked first, so a refusal leaves every count as it was
            raise ValueError(f"blocks {free} are free; allocate them instead of sharing them")
        for b in blocks:
            pool.incref(b)
        t = cls(pool)
        t.blocks, t.length = list(blocks), length
        t._array = None
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
        if new or cow:
            self._array = None
        return copies

    def block_array(self) -> np.ndarray:
        """int32 [len(blocks)]: the blocks as an array, rebuilt only when they change (a
        new block every ``BLOCK_SIZE`` tokens, a copy on write), so a decode step's maps do
        not convert the list."""
        if self._array is None:
            self._array = np.asarray(self.blocks, np.int32)
        return self._array

    def slot(self, position: int) -> int:
        if not 0 <= position < self.length:
            raise SlotMapError("block table", position, position,
                               f"the table maps positions [0, {self.length})")
        return self.blocks[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE

    def slots(self) -> np.ndarray:
        """int32 [length]: the slot of every mapped position."""
        return (self.block_array()[:, None] * BLOCK_SIZE + _OFFSETS).reshape(-1)[: self.length]

    def free(self) -> None:
        """Release every block (last block first, so a cached tail is evicted before the
        prefix it extends); the table is empty afterwards."""
        for b in reversed(self.blocks):
            self.pool.decref(b)
        self.blocks, self.length, self._array = [], 0, None


# --- slot maps for one step of a batch -------------------------------------------------------


def read_map(tables: Sequence[BlockTable | None], cap: int) -> np.ndarray:
    """int32 ``[rows, cap]``: ``out[r, t]`` is row ``r``'s slot of position ``t``.

    Positions at or past a row's length, and every position of a padding row (``None``),
    read slot 0: they are masked out by the row's live length, and 0 is a pool slot, so the
    map stays inside the range the bind checks. A row longer than ``cap`` is refused.
    """
    blocks, _, lengths, _ = _step_blocks(tables)
    over = np.nonzero(lengths > cap)[0]
    if over.size:
        r = int(over[0])
        raise SlotMapError("read", r, int(lengths[r]),
                           f"row {r} holds {lengths[r]} positions; the map has {cap} columns")
    # every block of every row expanded to its slots once, then one row copy each
    slots = (blocks[:, None] * BLOCK_SIZE + _OFFSETS).reshape(-1)
    out = np.zeros((len(tables), cap), np.int32)
    start = 0
    for r, t in enumerate(tables):
        if t is not None:
            out[r, : t.length] = slots[start:start + t.length]
            start += len(t.blocks) * BLOCK_SIZE
    return out


def write_map(tables: Sequence[BlockTable | None], new_positions: object) -> np.ndarray:
    """int32 ``[rows * tokens]``: the slot each new token's K/V row is written to.

    ``new_positions`` is ``[rows, tokens]`` logical positions (``-1``: a padding token);
    a padding row (``None``) must have only ``-1``. Each position must already be mapped by
    its row's table (:meth:`BlockTable.append` first). Padding tokens map to ``-1``, which
    the scatter skips. The result has passed :func:`check_write_map`.
    """
    pos = np.asarray(new_positions, np.int64)
    if pos.ndim != 2 or pos.shape[0] != len(tables):
        raise ValueError(f"new_positions must be [rows={len(tables)}, tokens], got {pos.shape}")
    blocks, base, lengths, pool_slots = _step_blocks(tables)
    real = pos != -1
    bad = np.argwhere(real & ((pos < 0) | (pos >= lengths[:, None])))
    if bad.size:
        r, j = (int(x) for x in bad[0])
        why = (f"row {r} is a padding row; its tokens must be -1" if tables[r] is None
               else f"row {r}'s table maps positions [0, {lengths[r]})")
        raise SlotMapError("write", r * pos.shape[1] + j, int(pos[r, j]), why)
    if not pool_slots:  # every row is padding: nothing is written
        return np.full(pos.size, -1, np.int32)
    q = np.where(real, pos, 0)
    slots = blocks[base[:, None] + q // BLOCK_SIZE] * BLOCK_SIZE + q % BLOCK_SIZE
    return check_write_map(np.where(real, slots, -1).reshape(-1), pool_slots)


def _step_blocks(tables: Sequence[BlockTable | None]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The rows' blocks in one array, each row's first index in it, each row's length (0
    for a padding row) and the pool's slot count (0 when every row is padding), so a map is
    a few array operations whatever the row count. A trailing 0 keeps the index of a
    masked position in bounds. The rows of one step must share one pool."""
    pools = {id(t.pool): t.pool for t in tables if t is not None}
    if len(pools) > 1:
        raise ValueError("the rows of one step must share one BlockPool")
    counts = np.array([0 if t is None else len(t.blocks) for t in tables], np.int64)
    base = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    blocks = np.concatenate([*(t.block_array() for t in tables if t is not None),
                             np.zeros(1, np.int32)])
    lengths = np.array([0 if t is None else t.length for t in tables], np.int64)
    pool_slots = next(iter(pools.values())).pool_slots if pools else 0
    return blocks, base, lengths, pool_slots


def check_write_map(write: object, pool_slots: int) -> np.ndarray:
    """The checked words of ``write`` as a ``[pool_slots]``-pool write map, int32 ``[n]``
    (read-only).

    The rule is ``ir.slotmap.ForwardSlotMap``'s, the one every binder applies to a WRITEMAP
    slot (one definition): each word is ``-1`` (writes nothing) or a slot in
    ``[0, pool_slots)``, and no slot is named twice, else ``WriteMapError`` naming the word's
    index and value (for a repeat, ``first``: the earlier word). Checking here refuses a bad
    map when it is built, before the step is even assembled.
    """
    return np.asarray(ForwardSlotMap(write, pool_slots))


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
