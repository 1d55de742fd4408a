"""A user graph, built with pootvk.ops.Builder and run with pootvk.compile: one pre-norm
transformer block decoding over a KV cache (RMSNorm, RoPE, GQA attention, SwiGLU), then the
Llama-shaped test model generating greedily.

    python examples/graph_api.py
"""

import numpy as np

import pootvk
from pootvk.ops import Builder, rope_tables
from pootvk.oracle import evaluate

H, HQ, HKV, D, CAP = 64, 4, 2, 16, 32

b = Builder()
x = b.input("x", (1, H))                            # one token's hidden state
pos = b.pos("pos", 0, CAP - 1)                      # its position, declared in [0, CAP-1]
w = {n: b.param(n, s) for n, s in [("norm", (H,)), ("wq", (H, HQ * D)), ("wk", (H, HKV * D)),
                                   ("wv", (H, HKV * D)), ("wo", (HQ * D, H))]}
cos, sin = b.param("cos", (CAP, D // 2)), b.param("sin", (CAP, D // 2))
kc, vc = b.state("k_cache", (1, HKV, CAP, D)), b.state("v_cache", (1, HKV, CAP, D))

h = b.rms_norm(x, w["norm"], eps=1e-5)
q = b.rope(b.reshape(b.matmul(h, w["wq"]), (1, HQ, 1, D)), pos, cos, sin)
k = b.rope(b.reshape(b.matmul(h, w["wk"]), (1, HKV, 1, D)), pos, cos, sin)
v = b.reshape(b.matmul(h, w["wv"]), (1, HKV, 1, D))
att, kc2, vc2 = b.attention_decode(q, k, v, kc, vc, pos)  # fused into one Attention kernel
b.set_state("k_cache", kc2)                          # donated: updated in place every call
b.set_state("v_cache", vc2)
b.export("y", b.add(x, b.matmul(b.reshape(att, (1, HQ * D)), w["wo"])))
graph = b.build()

rng = np.random.default_rng(0)
params = {n: (rng.standard_normal(v.shape) / np.sqrt(v.shape[0])).astype(np.float32)
          for n, v in w.items()}
params["cos"], params["sin"] = rope_tables(CAP, D)
caches = {n: np.zeros((1, HKV, CAP, D), np.float32) for n in ("k_cache", "v_cache")}

with pootvk.compile(graph) as program:               # compiled, planned, recorded once
    print(str(program.plan).splitlines()[0])         # print(program.plan): every kernel
    program.set_params(**params)                     # weights: written once
    for t in range(5):
        xt = rng.standard_normal((1, H)).astype(np.float32)
        y = program(x=xt, pos=np.int32(t))["y"]      # the caches stay on the device
        ref = evaluate(graph, {"x": xt, "pos": np.int32(t), **params, **caches})
        caches = {n: ref[n] for n in caches}
        err = float(((y - ref["y"]) ** 2).sum() / (ref["y"] ** 2).sum())
        print(f"step {t}: normalised squared error vs the oracle {err:.1e}")
    assert program.recordings == 1

cfg = pootvk.llm.LlamaConfig(layers=2, weight_dtype="float16", capacity=64)
with pootvk.llm.LlamaModel(cfg, seed=0) as model:    # embedding .. LM head, one recording
    tokens = [t for t, _logits in model.generate([1], 16)]
print("greedy tokens:", tokens)
