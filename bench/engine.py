"""The batched engine over the paged KV cache (issue 11): aggregate decode rate against one
prompt at a time, pool memory against the fixed-capacity layout, and a prefix-cache hit's
time to first token against a cold request, one run on one device.

    python3 bench/engine.py --random            # SmolLM2-135M shapes, random F16 weights
    python3 bench/engine.py [--model PATH]      # the real file (default: smollm2)
    python3 bench/engine.py --quick             # a tiny random model (lavapipe smoke test)
        [--device D] [--prompts 8] [--max-tokens 32] [--prefix 256] [--chunk 64]

* 8 prompts of different lengths (16..16+7*step tokens) through ``Engine(max_batch=8)``,
  then the same prompts one at a time through ``Engine(max_batch=1)``: generated tokens/s
  of each (wall time of the whole run, prefills included), and the outputs must agree
  token for token (greedy);
* the pool blocks the batched run held at its peak, in bytes, against the fixed-capacity
  layout (every row a whole ``capacity`` of K/V);
* a request of ``--prefix`` shared tokens + 8 own ones, cold, then another with the same
  prefix + 5 own ones: time to first token of each (the second skips the prefix's prefill).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pootvk.llm import SMOLLM2_135M, LlamaConfig, random_weights  # noqa: E402
from pootvk.llm.blocks import BLOCK_SIZE  # noqa: E402
from pootvk.llm.engine import Engine  # noqa: E402


def run_batched(eng: Engine, prompts: list[list[int]], max_tokens: int):
    """(outputs, wall s, peak pool blocks used) of one generate call, stepping by hand."""
    first = eng._next_id
    outs: dict[int, list[int]] = {first + i: [] for i in range(len(prompts))}
    for p in prompts:
        eng.submit(p, max_tokens)
    peak = 0
    t0 = time.perf_counter()
    while eng.busy:
        for rid, tok in eng.step():
            outs[rid].append(tok)
        peak = max(peak, eng.pool.num_used)
    return [outs[first + i] for i in range(len(prompts))], time.perf_counter() - t0, peak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=64)
    a = ap.parse_args(argv)
    if a.quick:
        cfg = LlamaConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, hidden=64,
                          intermediate=96, vocab=80, capacity=128, weight_dtype="float16",
                          tied_embeddings=True)
        weights, source = random_weights(cfg, seed=0), "tiny random"
        a.max_tokens, a.prefix, a.chunk = 6, 32, 16
    elif a.random:
        cfg = replace(SMOLLM2_135M, capacity=1024)
        weights, source = random_weights(cfg, seed=0), "SmolLM2-135M shapes, random weights"
    else:
        from pootvk.llm.gguf import load_gguf

        gm = load_gguf(a.model, capacity=1024)
        cfg = replace(gm.config, tied_embeddings=gm.tied_embeddings)
        weights = {n: x for n, x in gm.weights.items() if n in cfg.weight_shapes()}
        source = str(gm.path)
    rng = np.random.default_rng(0)
    step = max(1, (cfg.capacity // 2 - 16 - a.max_tokens) // max(1, a.prompts - 1))
    step = min(step, 24)
    prompts = [rng.integers(0, cfg.vocab, 16 + i * step).tolist() for i in range(a.prompts)]
    longest = max(len(p) for p in prompts) + a.max_tokens
    pool_tokens = -(-longest // BLOCK_SIZE) * BLOCK_SIZE * a.prompts
    per_token = 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * cfg.cache_dtype.device_itemsize
    print(f"model: {source}; KV {cfg.cache_dtype.value}; {a.prompts} prompts of "
          f"{len(prompts[0])}..{len(prompts[-1])} tokens, {a.max_tokens} generated each; "
          f"pool {pool_tokens} slots", flush=True)
    with Engine(cfg, weights, max_batch=a.prompts, pool_tokens=pool_tokens, chunk=a.chunk,
                device=a.device) as eng:
        print(f"device: {eng.decode.device.name}", flush=True)
        run_batched(eng, prompts[:2], 2)  # warm: both recordings, the pipelines
        outs, wall, peak = run_batched(eng, prompts, a.max_tokens)
    with Engine(cfg, weights, max_batch=1, pool_tokens=pool_tokens, chunk=a.chunk,
                device=a.device) as one:
        run_batched(one, prompts[:1], 2)
        single, wall1 = [], 0.0
        for p in prompts:
            o, w, _ = run_batched(one, [p], a.max_tokens)
            single += o
            wall1 += w
    n = a.prompts * a.max_tokens
    same = outs == single
    print(f"batched (max_batch={a.prompts}): {n / wall:.1f} generated tokens/s ({wall:.2f} s)")
    print(f"one at a time:              {n / wall1:.1f} generated tokens/s ({wall1:.2f} s): "
          f"{wall1 / wall:.2f}x slower; outputs {'identical' if same else 'DIFFER'}")
    fixed = a.prompts * cfg.capacity * per_token
    print(f"pool at peak: {peak} blocks = {peak * BLOCK_SIZE * per_token / 1e6:.2f} MB of K/V "
          f"against {fixed / 1e6:.2f} MB for {a.prompts} fixed-capacity rows of "
          f"{cfg.capacity} ({peak * BLOCK_SIZE * per_token / fixed:.1%})")
    prefix = rng.integers(0, cfg.vocab, a.prefix).tolist()
    prompts2 = [prefix + rng.integers(0, cfg.vocab, own).tolist() for own in (8, 5)]
    with Engine(cfg, weights, max_batch=2, pool_tokens=4 * (a.prefix + 64), chunk=a.chunk,
                device=a.device) as eng:
        run_batched(eng, [rng.integers(0, cfg.vocab, a.prefix + 8).tolist()], 2)  # warm
        ttft, warm_out = [], []
        for p in prompts2:
            eng.submit(p, 8)
            req = eng.waiting[-1]
            cached = eng.cache.match(req.prompt, eng.identity)[0]
            while eng.busy:
                eng.step()
            ttft.append((req.first_token_s, len(cached) * BLOCK_SIZE))
            warm_out.append(req.generated)
    with Engine(cfg, weights, max_batch=1, pool_tokens=4 * (a.prefix + 64), chunk=a.chunk,
                device=a.device) as cold:
        same2 = cold.generate(prompts2[1:], 8) == warm_out[1:]
    print(f"time to first token, {a.prefix}-token shared prefix: cold {ttft[0][0] * 1e3:.2f} "
          f"ms ({ttft[0][1]} cached), warm {ttft[1][0] * 1e3:.2f} ms ({ttft[1][1]} cached): "
          f"{ttft[0][0] / ttft[1][0]:.1f}x; the warm request's 8 tokens "
          f"{'equal' if same2 else 'DIFFER from'} a cold engine's")
    same = same and same2
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
