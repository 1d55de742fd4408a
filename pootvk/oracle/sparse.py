"""Oracle rules of the selection primitives: TopK directly in numpy, BlockTopK and
SelectedAttention by evaluating the very primitive chains they replace (``ops.sparse``), so
a fused eqn gives its chain's answer bit for bit and the semantics have one definition."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir import Params
from ..ir import prims as P
from ..ir.dtypes import from_numpy
from .evaluate import eval_rules, evaluate

rule = eval_rules.register


def topk_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest along the last axis, ordered by (value descending, NaN
    last, -0 == +0, index ascending), then listed ascending: TopK's contract."""
    x = np.asarray(x, np.float32)
    n = x.shape[-1]
    nan = np.isnan(x)
    vals = np.where(nan, np.float32(0), x) + np.float32(0)  # -0 + 0 = +0: one zero
    idx = np.broadcast_to(np.arange(n), x.shape)
    order = np.lexsort((idx, -vals, nan), axis=-1)  # the last key sorts first
    return np.sort(order[..., :k], axis=-1).astype(np.int32)


@rule(P.TOPK)
def _topk(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return topk_indices(xs[0], p["k"])


def _run_chain(build, xs: Sequence[np.ndarray]) -> np.ndarray:
    from ..ops.builder import Builder

    b = Builder()
    ins = [b.input(f"x{i}", x.shape, from_numpy(x.dtype)) for i, x in enumerate(xs)]
    b.export("out", build(b, *ins))
    return evaluate(b.build(), {f"x{i}": x for i, x in enumerate(xs)})["out"]


@rule(P.BLOCK_TOPK)
def _block_topk(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    from ..ops.sparse import block_topk

    return _run_chain(lambda b, s, qp: block_topk(b, s, qp, p["block_size"], p["top_k"]), xs)


@rule(P.SELECTED_ATTENTION)
def _selected_attention(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    from ..ops.sparse import selected_attention

    f = p["form"]
    return _run_chain(lambda b, q, k, v, ids, qp, *ks: selected_attention(
        b, q, k, v, ids, qp, f.block_size, f.scale, f.softcap, *ks), xs)
