"""The block manager driving the compiled paged step on the device (lavapipe): block
tables, a prefix-cache hit that skips its prefill, equal tokens under two identities, a fork
whose copy-on-write runs on the pools, a padding row; every real row's output against a
float64 attention over that row's own K/V history.

Each token's K/V is a deterministic function of (identity, tokens[:p + 1]), as a model's
is, so a cached block serves a later request correctly only if the cache matched the right
prefix under the right identity. The pools start as NaN: a row reading a slot its table
does not map (or one never written) fails instead of drifting.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import pootvk
from pootvk.ir import KeyLayout
from pootvk.ir import prims as P
from pootvk.llm.blocks import BlockPool, copy_slots, read_map, write_map
from pootvk.llm.prefix_cache import CachedSequence, PrefixCache, WeightsIdentity
from pootvk.ops import trace_paged_step
from tests.helpers import assert_close

ROWS, HQ, HKV, D, BLOCKS, KEYS = 3, 4, 2, 8, 10, 48
BASE = WeightsIdentity("m" * 64)
ADAPTER = BASE.with_adapter("lora")


def kv_of(seq: CachedSequence, p: int) -> tuple[np.ndarray, np.ndarray]:
    """The K and V rows [HKV, D] a model would compute at position p of seq."""
    key = repr((seq.identity, seq.tokens[: p + 1])).encode()
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
    return (rng.standard_normal((HKV, D)).astype(np.float32),
            rng.standard_normal((HKV, D)).astype(np.float32))


def reference(q: np.ndarray, seq: CachedSequence, n: int) -> np.ndarray:
    """float64 attention of q [HQ, D] over positions 0..n-1 of seq (GQA)."""
    kv = [kv_of(seq, p) for p in range(n)]
    k = np.stack([a for a, _ in kv]).astype(np.float64)  # [n, HKV, D]
    v = np.stack([b for _, b in kv]).astype(np.float64)
    out = np.empty((HQ, D))
    for h in range(HQ):
        g = h // (HQ // HKV)
        s = k[:, g] @ q[h].astype(np.float64) / np.sqrt(D)
        w = np.exp(s - s.max())
        out[h] = (w / w.sum()) @ v[:, g]
    return out


class Driver:
    """A minimal engine over a decode-shaped step (one token a row a step): a prompt's
    uncached tokens are fed one a step (its table maps them all from ``open``), then each
    step appends one generated token."""

    def __init__(self, prog: pootvk.runtime.Program, cache: PrefixCache) -> None:
        self.prog, self.cache = prog, cache
        self.rng = np.random.default_rng(1)
        self.written: dict[int, int] = {}
        self.copies: list[tuple[int, int]] = []

    def open(self, tokens: list[int], identity: WeightsIdentity) -> CachedSequence:
        seq = self.cache.open(tokens, identity)
        self.written[id(seq)] = seq.cached_tokens
        return seq

    def fork(self, seq: CachedSequence) -> CachedSequence:
        child = self.cache.fork(seq)
        self.written[id(child)] = self.written[id(seq)]
        return child

    def step(self, rows: list[CachedSequence | None], new: list[int]) -> None:
        pos = []
        for seq, tok in zip(rows, new, strict=True):
            if seq is None:
                pos.append(-1)
                continue
            if self.written[id(seq)] == len(seq.tokens):  # prompt done: generate
                for src, dst in self.cache.extend(seq, [tok]):
                    self._copy(src, dst)
            pos.append(self.written[id(seq)])
        tables = [s.table if s is not None else None for s in rows]
        k_new = np.zeros((ROWS, HKV, D), np.float32)
        v_new = np.zeros((ROWS, HKV, D), np.float32)
        for r, s in enumerate(rows):
            if s is not None:
                k_new[r], v_new[r] = kv_of(s, pos[r])
        q = self.rng.standard_normal((ROWS, HQ, 1, D)).astype(np.float32)
        lens = np.array([p + 1 if p >= 0 else 1 for p in pos], np.int32)
        out = self.prog(q=q, k_new=k_new, v_new=v_new,
                        write=write_map(tables, [[p] for p in pos]),
                        read=read_map(tables, KEYS), len=lens)["out"]
        for r, s in enumerate(rows):
            if s is not None:
                assert_close(out[r, :, 0], reference(q[r, :, 0], s, pos[r] + 1))
                self.written[id(s)] = pos[r] + 1
                self.cache.commit(s, self.written[id(s)])

    def _copy(self, src: int, dst: int) -> None:
        s, d = copy_slots([(src, dst)])
        for name in ("k_pool", "v_pool"):
            pool = self.prog.state(name)
            pool[d] = pool[s]
            self.prog.set_state(name, pool)
        self.copies.append((src, dst))


@pytest.fixture(scope="module")
def program(device):  # type: ignore[no-untyped-def]
    pool = BlockPool(BLOCKS)
    g = trace_paged_step(ROWS, HQ, HKV, D, pool.pool_slots, KEYS, live=True)
    with pootvk.compile(g, device) as prog:
        (att,) = [e for e in prog.plan.graph.eqns if e.prim is P.ATTENTION]
        assert att.params["form"].keys is KeyLayout.PAGED  # read in place through the map
        yield prog, pool


def test_block_manager_drives_the_paged_step(program):
    prog, pool = program
    for name in ("k_pool", "v_pool"):
        prog.set_state(name, np.full((pool.pool_slots, HKV, D), np.nan, np.float32))
    cache = PrefixCache(pool)
    drv = Driver(prog, cache)
    prompt = [(7 * i) % 31 for i in range(20)]

    # A (base) and C (adapter, equal tokens) prefill side by side, a padding row beside them
    a, c = drv.open(prompt, BASE), drv.open(prompt, ADAPTER)
    assert a.cached_tokens == c.cached_tokens == 0
    assert not set(a.table.blocks) & set(c.table.blocks)
    for _ in range(20):
        drv.step([a, None, c], [0, 0, 0])
    assert len(cache) == 2  # block 0 of each identity

    # B shares A's first block: its prefill starts at position 16
    b = drv.open(prompt[:16] + [3, 1, 4, 1, 5], BASE)
    assert b.cached_tokens == 16 and b.table.blocks[0] == a.table.blocks[0]
    # A' forks A (parallel sampling): the partial block 1 is shared until one writes it
    a2 = drv.fork(a)
    assert a2.table.blocks == a.table.blocks
    for i in range(6):
        drv.step([a2, b, a], [i % 5, 0, (i + 2) % 5])
    assert len(drv.copies) == 1 and drv.copies[0][0] == a.table.blocks[1]
    assert a2.table.blocks[1] == drv.copies[0][1]  # A' got the copy, A kept its block
    assert b.table.length == 22 and drv.written[id(b)] == 22

    # A completes; its block 1 (now full) stays cached and unpinned; D reuses two blocks
    for _ in range(6):
        drv.step([a2, b, a], [1, 2, 3])
    a_tokens, a_blocks = list(a.tokens), list(a.table.blocks)
    assert len(a_tokens) == 32 and len(a.hashes) == 2
    cache.close(a)
    assert pool.evictable_blocks() == [a_blocks[1]]  # block 0 is still held by A' and B
    d = drv.open(a_tokens + [9, 9], BASE)
    assert d.cached_tokens == 32 and d.table.blocks[:2] == a_blocks
    for _ in range(3):
        drv.step([d, b, a2], [1, 1, 1])

    # the adapter's own cached block serves the adapter; a reloaded adapter starts cold
    cache.close(b)
    cache.close(a2)
    e = drv.open(prompt + [5], ADAPTER)
    e2 = drv.open(prompt + [5], ADAPTER.reloaded())
    assert e.cached_tokens == 16 and e.table.blocks[0] == c.table.blocks[0]
    assert e2.cached_tokens == 0 and not set(e2.table.blocks) & set(c.table.blocks)
    for _ in range(6):
        drv.step([e, e2, d], [4, 4, 4])
