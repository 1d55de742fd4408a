"""Shared helpers for tests: random inputs for a graph and the tolerance measure."""

from __future__ import annotations

import numpy as np

from pootvk.ir import Graph, SlotKind


def nse(got: np.ndarray, ref: np.ndarray) -> float:
    """Normalised squared error sum (a-b)^2 / sum a^2 (DESIGN.md's tolerance measure)."""
    d = got.astype(np.float64) - ref
    return float((d**2).sum() / max((ref.astype(np.float64) ** 2).sum(), 1e-30))


def random_inputs(g: Graph, rng: np.random.Generator, pos: int = 0) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for s in g.slots:
        if s.kind is SlotKind.POS:
            out[s.name] = np.int32(pos)
        elif s.var.dtype.is_float:
            out[s.name] = rng.standard_normal(s.var.shape).astype(s.var.dtype.numpy)
        else:
            out[s.name] = rng.integers(0, 4, s.var.shape).astype(s.var.dtype.numpy)
    return out
