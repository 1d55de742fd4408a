"""A batched generation engine over the paged KV cache: several prompts at once, sequences
joining and leaving between steps (continuous batching), prefix caching.

One recorded decode step serves ``max_batch`` rows (``paged_model.trace_llama_paged``
with one token a row): a row is a request's slot for as long as it generates; an empty row
is padding (token 0, position 0, write -1: it writes nothing; read all slot 0 with length 1:
its logits are ignored), so the recording never changes as requests come and go. A new
request first takes its cached prefix from the :class:`~pootvk.llm.prefix_cache.PrefixCache`
(pinned blocks: that prefill is skipped), then prefills the rest of its prompt in chunks of
``chunk`` tokens (a second recorded step, one row, sharing the weights and pools), its
first generated token from the last prompt token's logits. The block tables and step maps
are ``llm.blocks``'; K/V lives in one pool per layer of ``pool_tokens`` slots shared by
every row, so memory follows the tokens in flight, not ``max_batch x capacity``.

Sampling runs on the host per request: greedy by default, or temperature / top-k / top-p
from the request's own seeded generator. Out of pool blocks, a request waits (admission)
or the step raises :class:`~pootvk.errors.PoolExhausted` (a running request cannot grow;
no preemption yet).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument, PoolExhausted
from ..runtime.program import Program
from ..vk import Device
from .blocks import BLOCK_SIZE, BlockPool, read_map, write_map
from .model import LlamaConfig, default_buckets, model_params
from .paged_model import trace_llama_paged
from .prefix_cache import CachedSequence, PrefixCache, WeightsIdentity
from .sampling import check_sampling, sample


@dataclass(eq=False)
class Request:
    """One prompt in the engine: its tokens so far, what it generated, its row."""

    id: int
    prompt: list[int]
    max_tokens: int
    generated: list[int] = field(default_factory=list)
    seq: CachedSequence | None = None
    row: int | None = None
    submitted_s: float = 0.0
    first_token_s: float | None = None  # time to first token, from submission
    eos_id: int | None = None  # generating it ends the request (it is still reported)
    temperature: float = 0.0  # 0: greedy; else sampled (top_k, top_p) from ``rng``
    top_k: int = 0
    top_p: float = 1.0
    rng: np.random.Generator | None = None

    def pick(self, logits: np.ndarray) -> int:
        """The next token from this request's logits row."""
        return sample(logits, self.rng, temperature=self.temperature, top_k=self.top_k,
                      top_p=self.top_p)

    @property
    def done(self) -> bool:
        return len(self.generated) >= self.max_tokens or (
            self.eos_id is not None and bool(self.generated) and self.generated[-1] == self.eos_id)


class Engine:
    """``Engine(cfg, weights, max_batch=8, pool_tokens=...)``; ``generate(prompts,
    max_tokens)`` returns each prompt's generated ids, ``stream`` yields ``(request id,
    token)`` as they come (a request ends after ``max_tokens`` or on ``eos_id``, which is
    reported). ``weights`` are ``cfg.weight_shapes()``'s arrays (as for
    ``LlamaModel``); ``identity`` keys the prefix cache (another model or adapter: another
    identity, never a shared block)."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, np.ndarray], *,
                 max_batch: int = 8, pool_tokens: int | None = None, chunk: int | None = None,
                 device: Device | int | str | None = None,
                 identity: WeightsIdentity | None = None, eos_id: int | None = None) -> None:
        if max_batch < 1 or (chunk is not None and chunk < 1):
            raise InvalidArgument("max_batch/chunk", "ints >= 1", (max_batch, chunk))
        pool_tokens = max_batch * cfg.capacity if pool_tokens is None else pool_tokens
        blocks = pool_tokens // BLOCK_SIZE
        if blocks < 1:
            raise InvalidArgument("pool_tokens", f"at least {BLOCK_SIZE}", pool_tokens)
        self.cfg, self.max_batch, self.keys = cfg, max_batch, cfg.capacity
        self.pool = BlockPool(blocks)
        self.cache = PrefixCache(self.pool)
        # the cache lives and dies with this engine, whose weights never change: one identity
        # serves unless the caller keys it (WeightsIdentity.of_file, an adapter's)
        self.identity = identity or WeightsIdentity("engine")
        slots = blocks * BLOCK_SIZE
        self.decode = Program(trace_llama_paged(cfg, max_batch, 1, slots, self.keys), device)
        try:
            self.decode.set_params(**model_params(cfg, weights))
        except BaseException:
            self.decode.close()
            raise
        self._slots = slots
        # default: the model's largest prefill bucket for the device (64 on a GPU; 8 on a CPU
        # device, whose tiled GEMM is compute-bound: llm.model.default_buckets)
        self.chunk = chunk if chunk is not None else \
            min(max(default_buckets(self.decode.device)), 64)
        #: prefill steps by the logical keys they attend (a power of two >= the chunk's last
        #: position + 1, at most the context): a chunk's attention visits its keys, not the
        #: whole context (the mask form has no live length to stop at)
        self._prefills: dict[int, Program] = {}
        self.eos_id = eos_id
        self.rows: list[Request | None] = [None] * max_batch
        self.waiting: list[Request] = []
        self._next_id = 0

    @property
    def busy(self) -> bool:
        """Whether a request is waiting or running."""
        return bool(self.waiting) or any(r is not None for r in self.rows)

    # --- requests ---------------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], max_tokens: int, *, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> int:
        """Queue a prompt; returns its request id. Greedy by default; with ``temperature``
        > 0 each token is sampled (``llm.sampling.sample``: top-k, top-p) from the
        request's own generator seeded by ``seed``."""
        check_sampling(temperature, top_k, top_p)
        prompt = [int(t) for t in prompt]
        if not prompt or max_tokens < 1:
            raise InvalidArgument("prompt/max_tokens", "a non-empty prompt, max_tokens >= 1",
                                  (len(prompt), max_tokens))
        if len(prompt) + max_tokens > self.keys:
            raise InvalidArgument("prompt", f"prompt + max_tokens <= {self.keys} positions",
                                  len(prompt) + max_tokens)
        r = Request(self._next_id, prompt, max_tokens, submitted_s=time.perf_counter(),
                    eos_id=self.eos_id, temperature=temperature, top_k=top_k, top_p=top_p,
                    rng=np.random.default_rng(seed))
        self._next_id += 1
        self.waiting.append(r)
        return r.id

    def _admit(self) -> list[tuple[int, int]]:
        """Move waiting requests into free rows while the pool can map their prompts:
        prefill each (its cached prefix skipped); returns their first tokens."""
        out = []
        while self.waiting and None in self.rows:
            r = self.waiting[0]
            try:
                r.seq = self.cache.open(r.prompt, self.identity)
            except PoolExhausted:
                if any(x is not None for x in self.rows):
                    break  # wait for a running request to free blocks
                raise
            self.waiting.pop(0)
            r.row = self.rows.index(None)
            self.rows[r.row] = r
            tok = self._prefill(r)
            r.generated.append(tok)
            r.first_token_s = time.perf_counter() - r.submitted_s
            out.append((r.id, tok))
            if r.done:
                self._finish(r)
        return out

    def _prefill(self, r: Request) -> int:
        seq = r.seq
        assert seq is not None
        start, end, c = seq.cached_tokens, len(r.prompt), self.chunk
        logits = None
        for p0 in range(start, end, c):
            n = min(c, end - p0)
            pos = np.zeros((1, c), np.int64)
            pos[0, :n] = np.arange(p0, p0 + n)
            wpos = np.full((1, c), -1, np.int64)
            wpos[0, :n] = pos[0, :n]
            keys = self._prefill_keys(p0 + n)
            visible = np.arange(keys)[None, :] <= pos[0, :, None]
            visible[n:] = False  # padding tokens see nothing (their rows are ignored)
            mask = np.where(visible, 0.0, -np.inf).astype(np.float32)[None, None]
            toks = np.zeros(c, np.int32)
            toks[:n] = r.prompt[p0:p0 + n]
            logits = self._prefill_program(keys)(
                tokens=toks, pos=pos.reshape(-1).astype(np.int32),
                write=write_map([seq.table], wpos),
                # the table maps the whole prompt; the chunk reads its first ``keys`` slots
                read=np.ascontiguousarray(
                    read_map([seq.table], max(keys, len(r.prompt)))[:, :keys]),
                mask=mask,
                last=np.array([n - 1], np.int32))["logits"]
            self.cache.commit(seq, p0 + n)
        if logits is None:  # open() keeps the last prompt token uncached: never reached
            raise AssertionError("a prompt with nothing to prefill")
        return r.pick(logits[0])

    def _prefill_keys(self, end: int) -> int:
        keys = max(self.chunk, 16)
        while keys < end:
            keys *= 2
        return min(keys, self.keys)

    def _prefill_program(self, keys: int) -> Program:
        prog = self._prefills.get(keys)
        if prog is None:
            prog = Program(trace_llama_paged(self.cfg, 1, self.chunk, self._slots, keys),
                           share=self.decode)
            self._prefills[keys] = prog
        return prog

    def _finish(self, r: Request) -> None:
        assert r.seq is not None and r.row is not None
        self.cache.close(r.seq)
        self.rows[r.row] = None

    # --- stepping ---------------------------------------------------------------------------

    def step(self) -> list[tuple[int, int]]:
        """Admit what fits, then one decode step for every running request: the
        ``(request id, token)`` pairs produced (first tokens of newly admitted requests
        included)."""
        out = self._admit()
        live = [r for r in self.rows if r is not None]
        if not live:
            return out
        b = self.max_batch
        toks = np.zeros(b, np.int32)
        pos = np.full((b, 1), -1, np.int64)
        for r in live:
            assert r.seq is not None and r.row is not None
            p = len(r.seq.tokens)
            copies = self.cache.extend(r.seq, [r.generated[-1]])
            if copies:  # only a fork shares a partial block; the engine forks nothing
                raise AssertionError(f"unexpected copy-on-write {copies}")
            toks[r.row], pos[r.row, 0] = r.generated[-1], p
        tables = [None if r is None else r.seq.table for r in self.rows]  # type: ignore[union-attr]
        length = np.where(pos[:, 0] >= 0, pos[:, 0] + 1, 1).astype(np.int32)
        logits = self.decode(tokens=toks, pos=np.maximum(pos[:, 0], 0).astype(np.int32),
                             write=write_map(tables, pos), read=read_map(tables, self.keys),
                             len=length)["logits"]
        for r in live:
            assert r.seq is not None and r.row is not None
            self.cache.commit(r.seq)
            tok = r.pick(logits[r.row])
            r.generated.append(tok)
            out.append((r.id, tok))
            if r.done:
                self._finish(r)
        return out

    def stream(self, prompts: Sequence[Sequence[int]], max_tokens: int, *,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None) -> Iterator[tuple[int, int]]:
        """Submit every prompt (sampling as :meth:`submit`; a ``seed`` s gives prompt i the
        seed s + i), then step until all are done, yielding (request id, token) (ids in
        submission order from the first one returned)."""
        for i, p in enumerate(prompts):
            self.submit(p, max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        seed=None if seed is None else seed + i)
        while self.busy:
            yield from self.step()

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int, *,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None) -> list[list[int]]:
        """Each prompt's generated ids, in order (greedy unless told: see :meth:`stream`)."""
        first = self._next_id
        outs: dict[int, list[int]] = {first + i: [] for i in range(len(prompts))}
        for rid, tok in self.stream(prompts, max_tokens, temperature=temperature, top_k=top_k,
                                    top_p=top_p, seed=seed):
            outs[rid].append(tok)
        return [outs[first + i] for i in range(len(prompts))]

    def close(self) -> None:
        for p in self._prefills.values():
            p.close()
        self.decode.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
