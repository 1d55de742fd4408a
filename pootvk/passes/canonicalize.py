"""Canonicalization: a normal form the matchers can rely on, with no float op changed.

- a Literal operand of a commutative op (Add, Mul, Max, Min) goes second (IEEE add/mul are
  commutative, so the value is bit-identical);
- Reshape/Broadcast to the same shape and identity Transposes are removed; Reshape of a
  Reshape is one Reshape;
- dead eqns (nothing observable uses them) and CONST slots nothing reads are removed.
"""

from __future__ import annotations

from ..ir import Eqn, Graph, Literal, SlotKind, Var
from ..ir.prims import BROADCAST, COMMUTATIVE, RESHAPE, TRANSPOSE


def _is_identity(e: Eqn) -> bool:
    if e.prim in (RESHAPE, BROADCAST) and e.inputs[0].shape == e.out.shape:
        return True
    return e.prim is TRANSPOSE and tuple(e.params["perm"]) == tuple(range(e.out.ndim))


def dead_code_elimination(g: Graph) -> Graph:
    info = g.use_info()
    kept = [e for e, live in zip(g.eqns, info.live_eqns(g), strict=True) if live]
    read = {v for e in kept for v in e.inputs} | set(info.observed)
    slots = [s for s in g.slots if s.kind is not SlotKind.CONST or s.var in read]
    consts = {s.name: g.constants[s.name] for s in slots if s.kind is SlotKind.CONST}
    return g.replace(kept, slots=slots, constants=consts)


def canonicalize(g: Graph) -> Graph:
    subst: dict[Var, Var] = {}
    producers: dict[Var, Eqn] = {}
    eqns: list[Eqn] = []
    for e in g.eqns:
        ins = tuple(subst.get(v, v) for v in e.inputs)
        lit0 = bool(ins) and isinstance(ins[0], Literal)
        if e.prim in COMMUTATIVE and lit0 and not isinstance(ins[1], Literal):
            ins = (ins[1], ins[0])
        e = Eqn(e.prim, ins, e.outputs, e.params)
        if _is_identity(e):
            subst[e.out] = ins[0]
            continue
        src = producers.get(ins[0]) if ins else None
        if e.prim is RESHAPE and src is not None and src.prim is RESHAPE:
            e = Eqn(RESHAPE, (src.inputs[0],), e.outputs, e.params)
        eqns.append(e)
        for o in e.outputs:
            producers[o] = e
    return dead_code_elimination(g.replace(eqns, subst))
