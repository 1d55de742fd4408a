"""The batched engine (``llm.engine``) on the device: prompts of different lengths joining
and leaving a 2-row decode step generate exactly what each generates alone through the
fixed-capacity oracle model (greedy); a request sharing a 32-token prefix skips that
prefill and generates what a cold engine generates; bad requests are refused."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.errors import InvalidArgument
from pootvk.llm.engine import Engine
from pootvk.llm.model import LlamaConfig, OracleLlama, random_weights

CFG = LlamaConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, hidden=64, intermediate=96,
                  vocab=80, capacity=64, weight_dtype="float16", tied_embeddings=True,
                  kv_dtype="float16")
WEIGHTS = random_weights(CFG, seed=5)
RNG = np.random.default_rng(12)
PROMPTS = [RNG.integers(0, CFG.vocab, n).tolist() for n in (5, 19, 33, 12)]
PREFIX = RNG.integers(0, CFG.vocab, 32).tolist()


def alone(prompt: list[int], steps: int) -> list[int]:
    return [t for t, _ in OracleLlama(CFG, WEIGHTS).generate(prompt, steps)]


def test_continuous_batching_matches_each_prompt_alone(device):
    """4 prompts (5, 19, 33, 12 tokens), 2 rows: the third and fourth join as the first two
    finish; 8-token prefill chunks (the 33-token prompt takes 5); each output equals the
    prompt generated alone."""
    with Engine(CFG, WEIGHTS, max_batch=2, pool_tokens=160, chunk=8, device=device) as eng:
        got = eng.generate(PROMPTS, max_tokens=9)
        assert eng.pool.num_used == 0  # every block released (cached ones are evictable)
    assert got == [alone(p, 9) for p in PROMPTS]


def test_a_shared_prefix_skips_its_prefill_and_changes_nothing(device):
    a, b = PREFIX + [3, 4, 5], PREFIX + [9, 1]
    with Engine(CFG, WEIGHTS, max_batch=2, pool_tokens=160, chunk=8, device=device) as eng:
        first = eng.generate([a], max_tokens=6)
        rid = eng.submit(b, 6)
        eng.step()  # admits b: its prefix blocks come from the cache
        (req,) = [r for r in eng.rows if r is not None and r.id == rid]
        assert req.seq is not None and req.seq.cached_tokens == 32
        while eng.busy:
            eng.step()
        warm = req.generated
    with Engine(CFG, WEIGHTS, max_batch=2, pool_tokens=160, chunk=8, device=device) as cold:
        assert cold.generate([b], max_tokens=6) == [warm]
    assert first == [alone(a, 6)] and warm == alone(b, 6)


def test_bad_requests_are_refused(device):
    with Engine(CFG, WEIGHTS, max_batch=1, pool_tokens=64, device=device) as eng:
        with pytest.raises(InvalidArgument):
            eng.submit([], 4)
        with pytest.raises(InvalidArgument, match="positions"):
            eng.submit([1] * 60, 8)  # 68 positions past the 64-key context


def test_sampled_requests_draw_from_their_own_seeded_generators(device):
    """temperature / top-k / top-p per request, each from its own generator (seed s + i):
    two prompts sampled together give what each gives sampled alone from the fixed-capacity
    oracle's logits with the same generator, and a seed repeats its tokens."""
    from pootvk.llm.sampling import sample

    def alone_sampled(prompt, steps, seed):
        rng = np.random.default_rng(seed)
        m, out = OracleLlama(CFG, WEIGHTS), []
        logits = m.prefill(prompt)
        for _ in range(steps):
            out.append(sample(logits, rng, temperature=3.0, top_k=40, top_p=0.95))
            logits = m.step(out[-1])
        return out

    kw = {"temperature": 3.0, "top_k": 40, "top_p": 0.95, "seed": 7}
    with Engine(CFG, WEIGHTS, max_batch=2, pool_tokens=160, chunk=8, device=device) as eng:
        got = eng.generate(PROMPTS[:2], 8, **kw)
        again = eng.generate(PROMPTS[:2], 8, **kw)
    assert got == again
    assert got == [alone_sampled(p, 8, 7 + i) for i, p in enumerate(PROMPTS[:2])]
    assert got != [alone(p, 8) for p in PROMPTS[:2]]  # sampled, not greedy
