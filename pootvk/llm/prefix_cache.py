"""Prefix caching: requests that begin with the same tokens, under the same weights, share
the K/V blocks of that prefix and skip its prefill.

A full block is identified by ``block_hash(parent_hash, its BLOCK_SIZE token ids, weights
identity)``: the parent hash chains in every earlier token, so equal hashes mean equal
prefixes, and the weights identity (model file digest, LoRA adapter id, adapter
generation) keeps the base model and each adapter apart even when their tokens match: the
K/V of one never feeds another (seed, "Prefix caching"). Only full blocks are cached; a
partial block is still being written.

Life of a request (the engine's calls, in step order)::

    seq = cache.open(prompt, identity)      # pins the cached prefix, maps the rest
    # prefill prompt[seq.cached_tokens:] at those positions, then:
    cache.commit(seq)                       # its newly full blocks become cached
                                            # (commit(seq, written) between chunks)
    copies = cache.extend(seq, [token])     # each decode step; run copies, the step,
    cache.commit(seq)                       # then commit
    cache.close(seq)                        # blocks stay cached, unpinned (evictable)

Pinning is the block's reference count: a cached block that no table holds is evictable
(``BlockPool``) and is evicted least recently released first when an allocation needs the
space; the pool then tells this cache to forget its hash. This is a block-allocation policy;
the kernels do not change.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import PoolExhausted
from .blocks import BLOCK_SIZE, BlockCopy, BlockPool, BlockTable, blocks_for

#: Adapter generations handed out by reloaded(): unique in the process, which is the cache's
#: lifetime, so a reloaded adapter can never meet an identity it had before.
_GENERATIONS = itertools.count(1)


@dataclass(frozen=True)
class WeightsIdentity:
    """What makes two K/V computations of the same tokens equal: the model file's digest,
    the LoRA adapter id (None: the base model) and the adapter's generation."""

    model_digest: str
    adapter: str | None = None
    generation: int = 0

    @classmethod
    def of_file(cls, path: str | Path, adapter: str | None = None) -> WeightsIdentity:
        """The identity of a model file: the SHA-256 of its bytes."""
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return cls(h.hexdigest(), adapter)

    def with_adapter(self, adapter: str | None) -> WeightsIdentity:
        return replace(self, adapter=adapter, generation=0)

    def reloaded(self) -> WeightsIdentity:
        """A fresh identity for a hot-reloaded adapter: it never matches the blocks its
        previous weights cached."""
        return replace(self, generation=next(_GENERATIONS))

    @property
    def key(self) -> bytes:
        return repr((self.model_digest, self.adapter, self.generation)).encode()


def block_hash(parent: bytes | None, tokens: Sequence[int], identity: WeightsIdentity) -> bytes:
    """SHA-256 over (parent block hash, the block's token ids, the weights identity)."""
    if len(tokens) != BLOCK_SIZE:
        raise ValueError(f"a cached block holds {BLOCK_SIZE} tokens, got {len(tokens)}")
    h = hashlib.sha256()
    h.update(parent if parent is not None else b"root")
    h.update(np.asarray(tokens, dtype="<i8").tobytes())
    h.update(identity.key)
    return h.digest()


@dataclass(eq=False)
class CachedSequence:
    """A request's tokens, its block table and the hashes of its committed full blocks.

    ``tokens`` are the ids whose K/V the table maps (written, or written by the next step);
    ``cached_tokens`` is how many prompt tokens ``open`` found cached (their prefill is
    skipped: the caller prefills ``tokens[cached_tokens:]`` only).
    """

    identity: WeightsIdentity
    table: BlockTable
    tokens: list[int]
    cached_tokens: int = 0
    hashes: list[bytes] = field(default_factory=list)


class PrefixCache:
    """Maps full-block hashes to pool blocks; one per :class:`BlockPool` (it takes the
    pool's ``on_evict``)."""

    def __init__(self, pool: BlockPool) -> None:
        if pool.on_evict is not None:
            raise ValueError("this pool already has a prefix cache")
        self.pool = pool
        self._block_of: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        pool.on_evict = self._evicted

    def __len__(self) -> int:
        return len(self._block_of)

    def block_of(self, h: bytes) -> int | None:
        return self._block_of.get(h)

    def hash_of(self, block: int) -> bytes | None:
        return self._hash_of.get(block)

    def match(self, tokens: Sequence[int], identity: WeightsIdentity
              ) -> tuple[list[int], list[bytes]]:
        """The longest chain of cached full blocks that ``tokens`` begins with, and their
        hashes. At most ``(len(tokens) - 1) // BLOCK_SIZE`` blocks: the last token is always
        computed, since its logits start the generation."""
        blocks: list[int] = []
        hashes: list[bytes] = []
        parent: bytes | None = None
        for i in range(max(len(tokens) - 1, 0) // BLOCK_SIZE):
            h = block_hash(parent, tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE], identity)
            b = self._block_of.get(h)
            if b is None:
                break
            blocks.append(b)
            hashes.append(h)
            parent = h
        return blocks, hashes

    def open(self, tokens: Sequence[int], identity: WeightsIdentity) -> CachedSequence:
        """A sequence for a new request: its table points at the cached prefix blocks
        (pinned) and maps the rest of ``tokens``. All or nothing: :class:`PoolExhausted`
        pins, allocates and evicts nothing."""
        blocks, hashes = self.match(tokens, identity)
        need = blocks_for(len(tokens)) - len(blocks)
        # pinning an evictable matched block takes it out of what allocation may use
        available = self.pool.num_free - sum(self.pool.ref_count(b) == 0 for b in blocks)
        if need > available:
            raise PoolExhausted(need, available, self.pool.num_blocks)
        cached = len(blocks) * BLOCK_SIZE
        table = BlockTable.sharing(self.pool, blocks, cached)
        copies = table.append(len(tokens) - cached)
        assert not copies, "a table of full blocks never copies on append"
        return CachedSequence(identity, table, list(tokens), cached, hashes)

    def extend(self, seq: CachedSequence, tokens: Sequence[int]) -> list[BlockCopy]:
        """Map ``tokens`` after the sequence's last position (the next step writes them);
        returns the copy-on-write copies to run first (see :meth:`BlockTable.append`)."""
        copies = seq.table.append(len(tokens))
        seq.tokens.extend(tokens)
        return copies

    def commit(self, seq: CachedSequence, written: int | None = None) -> int:
        """Cache the sequence's full blocks not cached yet among its first ``written``
        positions (default: all its tokens); call after the step that wrote their K/V, with
        ``written`` the positions written so far when a prompt is prefilled in chunks.
        Returns how many blocks became cached. A block whose hash is already cached (another
        request computed the same prefix) stays private to this table."""
        written = len(seq.tokens) if written is None else min(written, len(seq.tokens))
        added = 0
        for i in range(len(seq.hashes), written // BLOCK_SIZE):
            parent = seq.hashes[-1] if seq.hashes else None
            h = block_hash(parent, seq.tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE],
                           seq.identity)
            seq.hashes.append(h)
            b = seq.table.blocks[i]
            if h in self._block_of or b in self._hash_of:
                continue
            self._block_of[h] = b
            self._hash_of[b] = h
            self.pool.mark_cached(b)
            added += 1
        return added

    def fork(self, seq: CachedSequence) -> CachedSequence:
        """A second sequence continuing the same tokens (parallel sampling): shares every
        block; the partial last block is copied when either writes into it."""
        return CachedSequence(seq.identity, seq.table.fork(), list(seq.tokens),
                              seq.cached_tokens, list(seq.hashes))

    def close(self, seq: CachedSequence) -> None:
        """The request completed: release its blocks. Cached ones stay, unpinned, until an
        allocation evicts them; the rest are free."""
        seq.table.free()
        seq.tokens, seq.hashes = [], []

    def _evicted(self, block: int) -> None:
        h = self._hash_of.pop(block)
        del self._block_of[h]
