"""A fixed-capacity KV-cache decode loop: recorded once, replayed every token.

    python3 examples/decode_loop.py [steps]
"""

import sys
import time

import numpy as np

from pootvk.llm import DecodeLoop

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 128
rng = np.random.default_rng(0)
with DecodeLoop(batch=1, q_heads=16, kv_heads=4, head_dim=64, capacity=steps) as loop:
    print(f"device: {loop.device.name}")
    print(loop.plan)
    t0 = time.perf_counter()
    for _ in range(steps):
        q = rng.standard_normal((1, 16, 1, 64), dtype=np.float32)
        k_new = rng.standard_normal((1, 4, 1, 64), dtype=np.float32)
        v_new = rng.standard_normal((1, 4, 1, 64), dtype=np.float32)
        out = loop.step(q, k_new, v_new)
    dt = time.perf_counter() - t0
    print(f"{steps} steps, {loop.recordings} recording, {steps / dt:.0f} steps/s, "
          f"position {loop.position}/{loop.capacity}, out {out.shape}")
