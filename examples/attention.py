"""Attention through the whole pipeline, and what each stage made of it.

    python3 examples/attention.py
"""

import numpy as np

import pootvk
from pootvk.ops import trace_attention
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph
from pootvk.plan import plan_graph
from pootvk.runtime import resolve_device

rng = np.random.default_rng(0)
q = rng.standard_normal((1, 8, 4, 64), dtype=np.float32)  # 8 query heads, 4 rows
k = rng.standard_normal((1, 2, 300, 64), dtype=np.float32)  # 2 key/value heads: GQA x4
v = rng.standard_normal((1, 2, 300, 96), dtype=np.float32)  # value width != key width
slopes = 2.0 ** (-np.arange(1, 9, dtype=np.float32))  # ALiBi is just a per-head mask
alibi = (slopes[:, None, None] * (np.arange(300) - 299)[None, None, :])[None]
alibi = np.broadcast_to(alibi, (1, 8, 4, 300)).astype(np.float32)

out = pootvk.attention(q, k, v, mask=alibi, softcap=30.0)

g = trace_attention(q.shape, k.shape, v.shape, alibi.shape, softcap=30.0)
ref = evaluate(g, {"q": q, "k": k, "v": v, "mask": alibi})["out"]
print(f"{len(g.eqns)} traced eqns:\n{g}\n")
fused = compile_graph(g)
print(f"after the rewrite:\n{fused}\n")
print(plan_graph(fused, resolve_device(None).profile))
err = float(((out - ref) ** 2).sum() / (ref**2).sum())
print(f"\nout {out.shape}, normalised squared error vs the oracle: {err:.1e}")
assert err <= 5e-4
