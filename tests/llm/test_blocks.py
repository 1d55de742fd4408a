"""The block pool, block tables and slot maps of the paged KV cache, against hand-computed
numbers (slot = block * 16 + offset)."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.errors import PoolExhausted, SlotMapError, WriteMapError
from pootvk.llm.blocks import (
    BLOCK_SIZE,
    BlockPool,
    BlockTable,
    check_write_map,
    copy_slots,
    read_map,
    write_map,
)


def state(pool: BlockPool) -> tuple:
    return ([pool.ref_count(b) for b in range(pool.num_blocks)], sorted(pool.free_blocks()),
            pool.evictable_blocks())


def test_block_size_is_the_seeds():
    assert BLOCK_SIZE == 16


def test_allocate_all_or_nothing_with_the_numbers():
    pool = BlockPool(4)
    assert pool.allocate(3) == [0, 1, 2]
    assert (pool.num_free, pool.num_used, pool.pool_slots) == (1, 3, 64)
    before = state(pool)
    with pytest.raises(PoolExhausted) as e:
        pool.allocate(2)
    assert (e.value.wanted, e.value.free, e.value.total) == (2, 1, 4)
    assert "2 block(s)" in str(e.value) and "1 free" in str(e.value)
    assert state(pool) == before
    pool.decref(1)  # a released block goes to the back of the free list
    assert pool.allocate(2) == [3, 1]


def test_reference_counts_free_at_zero():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.incref(b)
    pool.decref(b)
    assert pool.ref_count(b) == 1 and b not in pool.free_blocks()
    pool.decref(b)
    assert pool.ref_count(b) == 0 and b in pool.free_blocks()
    with pytest.raises(ValueError):
        pool.decref(b)
    with pytest.raises(ValueError):
        pool.incref(b)  # a free block is allocated, never shared
    (c,) = pool.allocate(1)
    with pytest.raises(ValueError):
        BlockTable.sharing(pool, [c, b], 20)  # b is free: nothing is shared
    assert pool.ref_count(c) == 1


def test_table_slots_and_growth():
    pool = BlockPool(8)
    a, b = BlockTable(pool), BlockTable(pool)
    assert a.append(5) == [] and a.blocks == [0]
    assert b.append(20) == [] and b.blocks == [1, 2]
    np.testing.assert_array_equal(a.slots(), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(b.slots(), list(range(16, 32)) + [32, 33, 34, 35])
    a.append(12)  # positions 5..16: block 0 fills, position 16 opens block 3
    assert a.blocks == [0, 3] and a.length == 17
    assert a.slot(15) == 15 and a.slot(16) == 48
    with pytest.raises(SlotMapError) as e:
        a.slot(17)
    assert e.value.value == 17


def test_read_map_hand_computed():
    pool = BlockPool(8)
    a, b = BlockTable(pool), BlockTable(pool)
    b.append(3)  # block 0
    a.append(18)  # blocks 1, 2
    b.append(1)
    m = read_map([a, None, b], cap=20)
    want = np.zeros((3, 20), np.int32)
    want[0, :18] = list(range(16, 32)) + [32, 33]
    want[2, :4] = [0, 1, 2, 3]
    assert m.dtype == np.int32
    np.testing.assert_array_equal(m, want)
    with pytest.raises(SlotMapError) as e:
        read_map([b, a], cap=17)
    assert (e.value.index, e.value.value) == (1, 18)


def test_write_map_decode_and_prefill():
    pool = BlockPool(8)
    a, b = BlockTable(pool), BlockTable(pool)
    a.append(16)  # block 0, full
    b.append(19)  # blocks 1, 2
    a.append(1)  # decode: position 16 in a new block 3
    b.append(1)  # decode: position 19 -> block 2, offset 3
    w = write_map([a, None, b], [[16], [-1], [19]])
    np.testing.assert_array_equal(w, [48, -1, 35])
    assert w.dtype == np.int32
    # a prefill bucket of 4 tokens: row a writes 2, b 4, padding tokens -1
    a.append(2)
    b.append(4)
    w = write_map([a, b], [[17, 18, -1, -1], [20, 21, 22, 23]])
    np.testing.assert_array_equal(w, [49, 50, -1, -1, 36, 37, 38, 39])
    with pytest.raises(SlotMapError) as e:
        write_map([a, b], [[19, -1], [20, -1]])  # a maps [0, 19)
    assert (e.value.index, e.value.value) == (0, 19)
    with pytest.raises(SlotMapError) as e:
        write_map([a, None], [[5, -1], [-1, 3]])
    assert (e.value.index, e.value.value) == (3, 3)


def test_check_write_map_refusals():
    np.testing.assert_array_equal(check_write_map(np.array([3, -1, 127, -1]), 128),
                                  [3, -1, 127, -1])
    for bad, index, value in (([3, 128, -1], 1, 128), ([-2, 5], 0, -2), ([4, 9, 4, 9], 2, 4),
                              ([-1, 7, -1, 6, 7], 4, 7)):
        with pytest.raises(WriteMapError) as e:
            check_write_map(np.array(bad, np.int32), 128)
        assert (e.value.index, e.value.value) == (index, value), bad
    with pytest.raises(WriteMapError) as e:
        check_write_map(np.array([0, 5, 2, 5]), 16)
    assert (e.value.index, e.value.value, e.value.first) == (3, 5, 1)


def test_fork_and_copy_on_write():
    pool = BlockPool(4)
    a = BlockTable(pool)
    a.append(20)  # blocks 0 (full), 1 (4 of 16)
    b = a.fork()
    assert [pool.ref_count(x) for x in (0, 1)] == [2, 2]
    assert b.append(1) == [(1, 2)]  # b's write lands in the shared partial block 1
    assert b.blocks == [0, 2] and b.slot(20) == 36 and b.slot(3) == 3
    assert [pool.ref_count(x) for x in range(4)] == [2, 1, 1, 0]
    assert a.append(1) == []  # block 1 is a's alone now: written in place
    assert a.slot(20) == 20
    before = state(pool), b.blocks[:], b.length
    with pytest.raises(PoolExhausted) as e:
        b.append(30)  # 51 positions need 4 blocks: 2 more, 1 free
    assert (e.value.wanted, e.value.free) == (2, 1)
    assert (state(pool), b.blocks, b.length) == before
    a.free()
    assert a.blocks == [] and a.length == 0
    assert [pool.ref_count(x) for x in range(4)] == [1, 0, 1, 0]
    b.free()
    assert pool.num_free == 4


def test_full_shared_block_is_not_copied():
    pool = BlockPool(4)
    a = BlockTable(pool)
    a.append(32)
    b = a.fork()
    assert b.append(1) == [] and b.blocks == [0, 1, 2]
    assert pool.ref_count(0) == pool.ref_count(1) == 2


def test_cow_needs_its_block_atomically():
    pool = BlockPool(2)
    a = BlockTable(pool)
    a.append(17)  # both blocks
    b = a.fork()
    before = state(pool)
    with pytest.raises(PoolExhausted) as e:
        b.append(1)  # the copy of block 1 needs a block
    assert (e.value.wanted, e.value.free, e.value.total) == (1, 0, 2)
    assert state(pool) == before and b.blocks == [0, 1] and b.length == 17


def test_copy_slots():
    src, dst = copy_slots([(1, 2), (5, 0)])
    np.testing.assert_array_equal(src, list(range(16, 32)) + list(range(80, 96)))
    np.testing.assert_array_equal(dst, list(range(32, 48)) + list(range(0, 16)))
    assert src.dtype == dst.dtype == np.int32
    assert copy_slots([])[0].shape == (0,)


def test_maps_over_scattered_tables_match_per_position_slots():
    """Interleaved growth scatters every table's blocks over the pool; empty and padding
    rows sit between real ones. Each word against blocks[t // 16] * 16 + t % 16."""
    rng = np.random.default_rng(0)
    pool = BlockPool(64)
    tables = [BlockTable(pool) for _ in range(5)]
    for _ in range(40):
        t = tables[int(rng.integers(0, 4))]  # table 4 stays empty
        t.append(int(rng.integers(1, 20)))
    rows = [tables[0], tables[4], None, tables[1], tables[2], None, tables[3]]
    cap = max(t.length for t in tables) + 5
    m = read_map(rows, cap)
    for r, t in enumerate(rows):
        for p in range(cap):
            want = t.blocks[p // 16] * 16 + p % 16 if t is not None and p < t.length else 0
            assert m[r, p] == want, (r, p)
    pos = np.full((len(rows), 3), -1)
    for r, t in enumerate(rows):
        if t is not None and t.length:
            pos[r, : min(3, t.length)] = range(t.length - min(3, t.length), t.length)
    w = write_map(rows, pos).reshape(len(rows), 3)
    for r, t in enumerate(rows):
        for j in range(3):
            p = pos[r, j]
            assert w[r, j] == (-1 if p == -1 else t.blocks[p // 16] * 16 + p % 16), (r, j)
    assert all(np.any(np.diff(t.blocks) != 1) for t in tables[:4])  # really scattered
