"""Compiler passes: ``Graph -> Graph``; a graph a pass cannot prove keeps its primitives."""

from __future__ import annotations

from functools import partial

from ..ir import Graph, check_graph
from .attention_rewrite import attention_rewrite
from .canonicalize import canonicalize, dead_code_elimination
from .fuse import fuse
from .linear_fuse import linear_fuse
from .matmul_fold import matmul_fold
from .ranges import elide_proven_guards, gate_state_writes, value_ranges
from .selection import selection
from .simplify import cse, fold_constants

# the selection pass runs first, on the chains as traced (it compares them with their
# definition's own trace); the matmul fold runs after the attention rewrite, which matches
# the traced q @ k^T; fuse runs after them: it would hide an attention chain's elementwise
# steps from the rewrite; the Linear fusion last, taking fuse's bodies whole into the
# Linear kernels
PASSES = (selection, canonicalize, cse, fold_constants, elide_proven_guards, attention_rewrite,
          matmul_fold, canonicalize, gate_state_writes, fuse, linear_fuse)


def compile_graph(g: Graph, *, check: bool = True, linear_prologues: bool = True) -> Graph:
    """Run the pass pipeline; with ``check`` the IR type checker runs after every pass.

    ``linear_prologues=False`` keeps the producers of a GEMV's input as their own kernels
    (``linear_fuse(prologues=False)``): every GEMV workgroup recomputes a prologue (an
    RMSNorm row's reduction, SwiGLU's exp) for the rows it reads, which a GPU hides in
    latency and a CPU device pays in cycles (``runtime.linear_prologues`` decides per device)."""
    if check:
        check_graph(g)
    passes = PASSES if linear_prologues else tuple(
        partial(linear_fuse, prologues=False) if p is linear_fuse else p for p in PASSES)
    for p in passes:
        g = p(g)
        if check:
            check_graph(g)
    return g


__all__ = [
    "attention_rewrite", "canonicalize", "compile_graph", "cse", "dead_code_elimination",
    "elide_proven_guards", "fold_constants", "fuse", "gate_state_writes", "linear_fuse",
    "matmul_fold", "selection",
    "value_ranges",
]
