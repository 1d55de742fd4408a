"""The prefix cache over the block pool: hashing, matching, pinning, LRU eviction,
copy-on-write, identities kept apart; and a stateful model of the whole block manager that
simulates the device pool's contents."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from pootvk.errors import PoolExhausted
from pootvk.llm.blocks import (
    BLOCK_SIZE,
    BlockPool,
    check_write_map,
    copy_slots,
    read_map,
    write_map,
)
from pootvk.llm.prefix_cache import PrefixCache, WeightsIdentity, block_hash

BASE = WeightsIdentity("d" * 64)
ADAPTER = BASE.with_adapter("lora-a")


def test_identity_equality_and_reload(tmp_path):
    assert WeightsIdentity("x") == WeightsIdentity("x", None, 0)
    assert ADAPTER != BASE and ADAPTER.adapter == "lora-a"
    r1, r2 = ADAPTER.reloaded(), ADAPTER.reloaded()
    assert len({ADAPTER, r1, r2}) == 3 and r1.adapter == r2.adapter == "lora-a"
    (tmp_path / "m1").write_bytes(b"weights" * 1000)
    (tmp_path / "m2").write_bytes(b"weights" * 1000)
    (tmp_path / "m3").write_bytes(b"weights" * 999 + b"weightz")
    i1, i2, i3 = (WeightsIdentity.of_file(tmp_path / n) for n in ("m1", "m2", "m3"))
    assert i1 == i2 != i3
    assert i1.model_digest == hashlib.sha256(b"weights" * 1000).hexdigest()


def test_block_hash_depends_on_each_part():
    toks = list(range(16))
    h = block_hash(None, toks, BASE)
    assert h == block_hash(None, list(toks), BASE)
    others = [block_hash(h, toks, BASE), block_hash(None, toks[:15] + [99], BASE),
              block_hash(None, toks, ADAPTER), block_hash(None, toks, ADAPTER.reloaded())]
    assert len({h, *others}) == 5
    with pytest.raises(ValueError):
        block_hash(None, toks[:15], BASE)


def test_second_request_reuses_the_prefix():
    pool = BlockPool(8)
    cache = PrefixCache(pool)
    prompt = list(range(100, 140))  # 40 tokens: blocks of 16, 16, 8
    a = cache.open(prompt, BASE)
    assert a.cached_tokens == 0 and a.table.blocks == [0, 1, 2] and a.table.length == 40
    assert cache.commit(a) == 2 and len(cache) == 2  # the two full blocks
    b = cache.open(prompt[:35] + [7, 7, 7], BASE)
    assert b.cached_tokens == 32 and b.table.blocks == [0, 1, 3]
    assert [pool.ref_count(x) for x in range(4)] == [2, 2, 1, 1]
    # a prompt of exactly two cached blocks reuses one: its last token is always computed
    c = cache.open(prompt[:32], BASE)
    assert c.cached_tokens == 16 and c.table.blocks == [0, 4]
    # equal tokens under the adapter share nothing
    d = cache.open(prompt, ADAPTER)
    assert d.cached_tokens == 0 and set(d.table.blocks).isdisjoint({0, 1, 2, 3, 4})


def test_256_token_prefix_skips_its_prefill():
    pool = BlockPool(40)
    cache = PrefixCache(pool)
    shared = [(i * 7) % 50 for i in range(256)]
    a = cache.open(shared + [1, 2, 3], BASE)
    cache.commit(a)
    cache.close(a)
    b = cache.open(shared + [4, 5], BASE)
    assert b.cached_tokens == 256
    assert pool.num_evictable == 0 and all(pool.ref_count(x) == 1 for x in b.table.blocks)


def test_lru_eviction_and_forgetting():
    pool = BlockPool(4)
    cache = PrefixCache(pool)
    pa = list(range(33))  # blocks 0, 1 full (cached), 2 partial
    a = cache.open(pa, BASE)
    cache.commit(a)
    cache.close(a)  # released last block first: 2 free, then 1, 0 evictable
    assert pool.evictable_blocks() == [1, 0] and sorted(pool.free_blocks()) == [2, 3]
    b = cache.open([9] * 40, BASE)  # 3 blocks: free 3, 2, then evicts 1 (the LRU tail)
    assert b.table.blocks == [3, 2, 1] and b.cached_tokens == 0
    assert pool.evictable_blocks() == [0] and len(cache) == 1
    m, _ = cache.match(pa, BASE)
    assert m == [0]  # block 1's hash was forgotten: the chain stops after block 0
    before = (pool.evictable_blocks(), [pool.ref_count(x) for x in range(4)], len(cache))
    with pytest.raises(PoolExhausted) as e:
        cache.open(pa, BASE)  # reuses block 0, needs 2 more, and block 0 is the only free
    assert (e.value.wanted, e.value.free, e.value.total) == (2, 0, 4)
    assert (pool.evictable_blocks(), [pool.ref_count(x) for x in range(4)], len(cache)) == before
    cache.close(b)
    a2 = cache.open(pa, BASE)
    assert a2.cached_tokens == 16 and a2.table.blocks[0] == 0


def test_chunked_prefill_commits_only_written_blocks():
    pool = BlockPool(4)
    cache = PrefixCache(pool)
    a = cache.open(list(range(40)), BASE)
    assert cache.commit(a, written=15) == 0  # block 0 not fully written yet
    assert cache.commit(a, written=31) == 1 and a.hashes == [cache.hash_of(0)]
    assert cache.match(list(range(40)), BASE)[0] == [0]
    assert cache.commit(a, written=40) == 1 and len(cache) == 2


def test_fork_copies_the_shared_partial_block():
    pool = BlockPool(6)
    cache = PrefixCache(pool)
    a = cache.open(list(range(20)), BASE)  # blocks 0, 1 (4 tokens)
    cache.commit(a)
    b = cache.fork(a)
    assert cache.extend(b, [5]) == [(1, 2)] and b.table.blocks == [0, 2]
    assert cache.extend(a, [6]) == [] and a.table.blocks == [0, 1]
    assert pool.ref_count(0) == 2 and pool.ref_count(1) == pool.ref_count(2) == 1


def test_duplicate_prefix_computed_twice_stays_private():
    pool = BlockPool(6)
    cache = PrefixCache(pool)
    p = list(range(17))
    a, b = cache.open(p, BASE), cache.open(p, BASE)  # both cold: nothing cached yet
    assert cache.commit(a) == 1 and cache.commit(b) == 0
    assert cache.block_of(a.hashes[0]) == a.table.blocks[0] != b.table.blocks[0]
    cache.close(b)
    assert b.table.blocks == [] and pool.num_evictable == 0  # b's copy went back as free


# --- the stateful model ----------------------------------------------------------------------

IDENTITIES = (BASE, ADAPTER, ADAPTER.reloaded())
PREFIXES = ([t % 3 for t in range(48)], [1] * 48)


class BlockManagerMachine(RuleBasedStateMachine):
    """Requests open, extend, fork, step and close over a small pool, with a simulated
    device pool: ``kv[slot]`` holds what the step that wrote it computed,
    ``(identity, tokens[:p + 1])`` for position ``p``. Every invariant runs after every
    rule; the content check fails if sharing, copy-on-write or eviction ever hands a live
    sequence or a cached hash a slot whose K/V is not its own."""

    @initialize(num_blocks=st.integers(3, 14))
    def setup(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.cache = PrefixCache(self.pool)
        evict = self.pool.on_evict
        self.pool.on_evict = lambda b: (self._check_evicted(b), evict(b))
        self.kv: list[object] = [None] * self.pool.pool_slots
        self.seqs: list = []
        self.pending: dict[int, list[int]] = {}  # id(seq) -> positions mapped, not written
        self.cached_content: dict[bytes, list[object]] = {}

    def _check_evicted(self, block: int) -> None:
        assert all(block not in s.table.blocks for s in self.seqs), block
        event("evicted a cached block")

    def _snapshot(self) -> tuple:
        p = self.pool
        return ([p.ref_count(b) for b in range(p.num_blocks)], sorted(p.free_blocks()),
                p.evictable_blocks(), len(self.cache),
                [(s.table.blocks[:], s.table.length, len(s.tokens)) for s in self.seqs])

    @staticmethod
    def _value(seq, p: int) -> object:
        return (seq.identity, tuple(seq.tokens[: p + 1]))

    @rule(prefix=st.integers(0, 1), cut=st.integers(0, 48),
          suffix=st.lists(st.integers(0, 2), max_size=12),
          ident=st.sampled_from((0, 0, 0, 1, 2)))  # mostly one identity: prefix hits
    def open(self, prefix: int, cut: int, suffix: list[int], ident: int) -> None:
        tokens = PREFIXES[prefix][:cut] + suffix
        before = self._snapshot()
        try:
            seq = self.cache.open(tokens, IDENTITIES[ident])
        except PoolExhausted as e:
            assert self._snapshot() == before
            assert e.free < e.wanted and e.total == self.pool.num_blocks
            event("open: pool exhausted")
            return
        if seq.cached_tokens:
            event("open: prefix hit")
        assert seq.cached_tokens % BLOCK_SIZE == 0 and seq.cached_tokens < max(len(tokens), 1)
        assert seq.table.length == len(tokens)
        self.seqs.append(seq)
        self.pending[id(seq)] = list(range(seq.cached_tokens, len(tokens)))

    @rule(i=st.integers(0, 99), new=st.lists(st.integers(0, 2), min_size=1, max_size=18))
    def extend(self, i: int, new: list[int]) -> None:
        if not self.seqs:
            return
        seq = self.seqs[i % len(self.seqs)]
        before = self._snapshot()
        shared_last = (seq.table.length % BLOCK_SIZE != 0
                       and self.pool.ref_count(seq.table.blocks[-1]) > 1)
        try:
            copies = self.cache.extend(seq, new)
        except PoolExhausted:
            assert self._snapshot() == before
            event("extend: pool exhausted")
            return
        assert len(copies) == int(shared_last)
        if copies:
            event("extend: copy on write")
        for src, dst in copies:
            assert self.pool.ref_count(dst) == 1 and dst in seq.table.blocks
            assert src not in seq.table.blocks and self.pool.ref_count(src) >= 1
        src_slots, dst_slots = copy_slots(copies)  # what the engine runs on every pool
        check_write_map(dst_slots, self.pool.pool_slots)
        values = [self.kv[x] for x in src_slots]
        for x, v in zip(dst_slots, values, strict=True):
            self.kv[x] = v
        n = len(seq.tokens)
        self.pending[id(seq)].extend(range(n - len(new), n))

    @rule(i=st.integers(0, 99))
    def fork(self, i: int) -> None:
        ready = [s for s in self.seqs if not self.pending[id(s)]]  # forks follow a step
        if not ready:
            return
        seq = self.cache.fork(ready[i % len(ready)])
        self.seqs.append(seq)
        self.pending[id(seq)] = []

    @rule(i=st.integers(0, 99), first=st.integers(0, 2),
          rest=st.lists(st.integers(0, 2), max_size=3))
    def sample_two(self, i: int, first: int, rest: list[int]) -> None:
        """Parallel sampling: fork a sequence, the two take different next tokens, and
        each runs its step (the writes that must land in different blocks)."""
        ready = [s for s in self.seqs if not self.pending[id(s)]]
        if not ready:
            return
        self.fork(i)
        parent, child = ready[i % len(ready)], self.seqs[-1]
        for seq, tok in ((child, first), (parent, (first + 1) % 3)):
            self.extend(self.seqs.index(seq), [tok, *rest])
            self.step(0)

    @rule(pad=st.integers(0, 2))
    def step(self, pad: int) -> None:
        """One batched step: every row writes its pending tokens through the write map
        (padding rows and tokens write nothing), then commits its full blocks."""
        if not self.seqs:
            return
        rows = self.seqs + [None] * pad
        width = max(1, max(len(self.pending[id(s)]) for s in self.seqs))
        pos = np.full((len(rows), width), -1, np.int64)
        for r, s in enumerate(self.seqs):
            pos[r, : len(self.pending[id(s)])] = self.pending[id(s)]
        w = write_map([s.table if s else None for s in rows], pos)
        np.testing.assert_array_equal(check_write_map(w, self.pool.pool_slots), w)
        for (r, j), slot in zip(np.ndindex(pos.shape), w, strict=True):
            assert (slot == -1) == (pos[r, j] == -1)
            if slot != -1:
                self.kv[slot] = self._value(rows[r], int(pos[r, j]))
        for s in self.seqs:
            self.pending[id(s)] = []
            self.cache.commit(s)
            for k, h in enumerate(s.hashes):
                if self.cache.block_of(h) == s.table.blocks[k]:
                    self.cached_content[h] = [self._value(s, p) for p in
                                              range(k * BLOCK_SIZE, (k + 1) * BLOCK_SIZE)]

    @rule(i=st.integers(0, 99))
    def close(self, i: int) -> None:
        if not self.seqs:
            return
        seq = self.seqs.pop(i % len(self.seqs))
        del self.pending[id(seq)]
        self.cache.close(seq)

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def ref_counts_are_the_holders(self) -> None:
        p = self.pool
        holders = [0] * p.num_blocks
        for s in self.seqs:
            assert len(set(s.table.blocks)) == len(s.table.blocks)
            for b in s.table.blocks:
                holders[b] += 1
        assert [p.ref_count(b) for b in range(p.num_blocks)] == holders
        free, evictable = p.free_blocks(), set(p.evictable_blocks())
        used = {b for b in range(p.num_blocks) if holders[b]}
        assert not (free & used) and not (evictable & used) and not (free & evictable)
        assert len(free) + len(evictable) + len(used) == p.num_blocks
        assert p.num_free + p.num_used == p.num_blocks and p.num_used == len(used)
        assert evictable == {b for b in range(p.num_blocks)
                             if p.is_cached(b) and not holders[b]}

    @invariant()
    def cache_maps_are_inverse(self) -> None:
        cached = [b for b in range(self.pool.num_blocks) if self.cache.hash_of(b) is not None]
        assert len(cached) == len(self.cache)
        assert cached == [b for b in range(self.pool.num_blocks) if self.pool.is_cached(b)]
        for b in cached:
            assert self.cache.block_of(self.cache.hash_of(b)) == b

    @invariant()
    def identities_never_share(self) -> None:
        owner: dict[int, WeightsIdentity] = {}
        for s in self.seqs:
            for b in s.table.blocks:
                assert owner.setdefault(b, s.identity) == s.identity

    @invariant()
    def every_read_finds_its_own_kv(self) -> None:
        if not self.seqs:
            return
        cap = max(s.table.length for s in self.seqs) + 3
        m = read_map([None] + [s.table for s in self.seqs], cap)
        assert not m[0].any()
        for r, s in enumerate(self.seqs, start=1):
            L = s.table.length
            assert not m[r, L:].any()
            assert all(int(x) // BLOCK_SIZE in s.table.blocks for x in m[r, :L])
            pending = set(self.pending[id(s)])
            for t in range(L):
                if t not in pending:
                    assert self.kv[m[r, t]] == self._value(s, t), (r, t)

    @invariant()
    def cached_blocks_hold_their_hash(self) -> None:
        for b in range(self.pool.num_blocks):
            h = self.cache.hash_of(b)
            if h is not None:
                assert self.kv[b * BLOCK_SIZE:(b + 1) * BLOCK_SIZE] == self.cached_content[h]


BlockManagerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                                 deadline=None)
TestBlockManager = BlockManagerMachine.TestCase
