"""Walking a graph back from a value, as the pattern-matching passes do (the attention
rewrite, the selection pass): the eqn that produced a value, when it applies a given
primitive with given params, and a literal operand's value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..ir import Eqn, Literal, Prim, Var


def producer_eqn(eqns: Sequence[Eqn], producer: Mapping[Var, int], v: Var | None,
                 prim: Prim, **params: object) -> Eqn | None:
    """The eqn of ``eqns`` that produced ``v`` (``producer``: value -> eqn index) if it
    applies ``prim`` with every one of ``params``; None otherwise (a literal, a slot, no
    value, another primitive or other params)."""
    i = None if v is None or isinstance(v, Literal) else producer.get(v)
    e = None if i is None else eqns[i]
    if e is None or e.prim is not prim:
        return None
    if any(e.params.get(k) != want for k, want in params.items()):
        return None
    return e


def literal(v: Var | None) -> float | None:
    """A literal operand's value as a float; None for anything else."""
    return float(v.value) if isinstance(v, Literal) else None
