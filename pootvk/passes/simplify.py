"""Simplification passes: common-subexpression elimination and constant folding.

Why: a model traces the same causal mask once per layer; CSE makes N layers share one
(Iota, Compare, Select) chain. An eqn whose operands are all constants (an ``Iota`` has
none) is evaluated once at compile time by the oracle's own rule and becomes a CONST slot,
written once when a plan is loaded, so it is never a per-step kernel. Both passes keep the
oracle's answer bit-for-bit: CSE removes only repeats of an identical computation, and
folding computes with the very rule the oracle would have run.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from ..ir import Eqn, Graph, Literal, Slot, SlotKind, Var
from ..ir.prims import DYNAMIC_UPDATE_SLICE
from ..oracle.evaluate import eval_eqn
from .canonicalize import dead_code_elimination

# Eqns that write state in place are never merged or folded: they are updates, not values.
IN_PLACE = (DYNAMIC_UPDATE_SLICE,)
FOLD_LIMIT_BYTES = 16 << 20  # a folded constant larger than this stays a kernel


def _operand_key(v: Var) -> Hashable:
    # repr keeps -0.0 apart from 0.0 (equal as floats, not as operands)
    return ("lit", repr(v.value), v.dtype) if isinstance(v, Literal) else id(v)


def cse(g: Graph) -> Graph:
    """Merge eqns with the same primitive, params and operands (after earlier merges)."""
    subst: dict[Var, Var] = {}
    seen: dict[Hashable, Eqn] = {}
    eqns: list[Eqn] = []
    for e in g.eqns:
        ins = tuple(subst.get(v, v) for v in e.inputs)
        e = Eqn(e.prim, ins, e.outputs, e.params)
        if e.prim not in IN_PLACE:
            key = (e.prim, tuple(_operand_key(v) for v in ins), e.params)
            first = seen.get(key)
            if first is not None:
                subst.update(zip(e.outputs, first.outputs, strict=True))
                continue
            seen[key] = e
        eqns.append(e)
    return dead_code_elimination(g.replace(eqns, subst))


def fold_constants(g: Graph) -> Graph:
    """Evaluate eqns whose operands are literals or constants; their results become CONST
    slots. Observed values and values over ``FOLD_LIMIT_BYTES`` are left as eqns."""
    consts: dict[Var, np.ndarray] = {
        s.var: g.constants[s.name] for s in g.slots if s.kind is SlotKind.CONST
    }
    observed = set(g.outputs().values())
    slots, constants = list(g.slots), dict(g.constants)
    eqns: list[Eqn] = []
    for e in g.eqns:
        foldable = (
            e.prim not in IN_PLACE
            and all(isinstance(v, Literal) or v in consts for v in e.inputs)
            and not any(o in observed for o in e.outputs)
            and sum(o.nbytes for o in e.outputs) <= FOLD_LIMIT_BYTES
        )
        if not foldable:
            eqns.append(e)
            continue
        args = [
            np.asarray(v.value, v.dtype.numpy) if isinstance(v, Literal) else consts[v]
            for v in e.inputs
        ]
        for o, val in zip(e.outputs, eval_eqn(e, args), strict=True):
            name = f"const{len(constants)}"
            slots.append(Slot(name, SlotKind.CONST, o))
            constants[name] = np.ascontiguousarray(val)
            consts[o] = constants[name]
    return dead_code_elimination(g.replace(eqns, slots=slots, constants=constants))
