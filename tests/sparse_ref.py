"""An independent float64 reference of block-sparse attention (written from the words of
``ir.sparse_form``, loop by loop, sharing no code with the tracer or the oracle), and the
inputs the sparse tests share."""

from __future__ import annotations

import numpy as np


def ref_select(scores: np.ndarray, qpos: np.ndarray, bs: int, top_k: int) -> np.ndarray:
    """ids [B, Hs, Lq, K]: per row the K complete blocks of highest score (NaN as -inf,
    ties to the lower id), ascending, then -1."""
    b_, hs, lq, nb = scores.shape
    out = np.full((b_, hs, lq, top_k), -1, np.int32)
    for b in range(b_):
        for h in range(hs):
            for i in range(lq):
                own = max(int(qpos[b, i]), -1) // bs if qpos[b, i] >= 0 else 0
                cand = [(-(s if not np.isnan(s) else -np.inf), j)
                        for j, s in enumerate(scores[b, h, i, :own].astype(np.float64))]
                picked = sorted(j for _, j in sorted(cand)[:top_k])
                out[b, h, i, :len(picked)] = picked
    return out


def ref_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, ids: np.ndarray,
               qpos: np.ndarray, bs: int, scale: float, softcap: float | None = None
               ) -> np.ndarray:
    """out [B, Hq, Lq, Dv] in float64: each row's visible keys (its selected blocks and
    its own block up to its position), softmax over them."""
    b_, hq, lq, _ = q.shape
    hkv, dv = k.shape[1], v.shape[3]
    n_rep, hs = hq // hkv, ids.shape[1]
    out = np.zeros((b_, hq, lq, dv))
    for b in range(b_):
        for h in range(hq):
            g = h // n_rep
            for i in range(lq):
                p = int(qpos[b, i])
                blocks = [c for c in ids[b, g if hs > 1 else 0, i] if c >= 0] + [p // bs]
                keys = [c * bs + j for c in blocks for j in range(bs) if c * bs + j <= p]
                kk = k[b, g, keys].astype(np.float64)
                s = kk @ q[b, h, i].astype(np.float64) * scale
                if softcap is not None:
                    s = np.tanh(s / softcap) * softcap
                w = np.exp(s - s.max())
                out[b, h, i] = (w / w.sum()) @ v[b, g, keys].astype(np.float64)
    return out
