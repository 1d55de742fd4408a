"""Integer value ranges, and the two passes that read them for index guards.

``value_ranges`` proves a closed range ``(lo, hi)`` for I32 values by one forward walk: a
slot's declared range (every binder checks it), a literal's value, and one rule per
primitive (``range_rules``). A value with no rule, or whose bound leaves I32 (a kernel would
wrap), has no range: nothing is assumed about it.

An IndexGuard's clamped output is in ``[lo, hi]`` by construction, but the range counts only
when the guard's witness is a declared validation output: a bad index then fails the step
instead of turning silently into a valid-looking one (shared/seeds "Live length").

- ``elide_proven_guards``: a guard whose operand is already proven inside its range can
  never fail; it becomes the identity and its witness is dropped.
- ``gate_state_writes``: the validation channel's "nothing published" for state. Every
  in-place state write (DynamicUpdateSlice) takes the step's witnesses as gate operands and
  writes nothing when one of them failed; the guards are moved ahead of the writes. A graph
  with witnesses whose state is written some other way, or whose guard reads a value written
  this step, is refused (the step could not be undone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import UnsupportedPrimitive
from ..ir import I32, Eqn, Graph, Literal, RuleTable, Var
from ..ir import prims as P
from ..ir.fused import STATE_WRITES, update_parts

Range = tuple[int, int] | None
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
RangeRule = Callable[[Eqn, Sequence[Range], frozenset[Var]], list[Range]]
range_rules: RuleTable[P.Prim, RangeRule] = RuleTable(
    "range", lambda p, why: UnsupportedPrimitive(str(p), why)
)


def _fit(lo: int, hi: int) -> Range:
    return (lo, hi) if I32_MIN <= lo <= hi <= I32_MAX else None


def _corners(fn: Callable[[int, int], int]) -> RangeRule:
    def rule(e: Eqn, r: Sequence[Range], declared: frozenset[Var]) -> list[Range]:
        a, b = r
        if a is None or b is None:
            return [None]
        vals = [fn(x, y) for x in a for y in b]
        return [_fit(min(vals), max(vals))]

    return rule


range_rules.register(P.ADD)(_corners(lambda x, y: x + y))
range_rules.register(P.SUB)(_corners(lambda x, y: x - y))
range_rules.register(P.MUL)(_corners(lambda x, y: x * y))
range_rules.register(P.MAX)(_corners(max))
range_rules.register(P.MIN)(_corners(min))


@range_rules.register(P.RESHAPE, P.BROADCAST, P.TRANSPOSE, P.SLICE, P.COPY)
def _same(e: Eqn, r: Sequence[Range], declared: frozenset[Var]) -> list[Range]:
    return [r[0]]


@range_rules.register(P.CONCAT)
def _union(e: Eqn, r: Sequence[Range], declared: frozenset[Var]) -> list[Range]:
    if any(x is None for x in r):
        return [None]
    return [(min(x[0] for x in r), max(x[1] for x in r))]  # type: ignore[index]


@range_rules.register(P.SELECT)
def _select(e: Eqn, r: Sequence[Range], declared: frozenset[Var]) -> list[Range]:
    return _union(e, r[1:], declared)


@range_rules.register(P.IOTA)
def _iota(e: Eqn, r: Sequence[Range], declared: frozenset[Var]) -> list[Range]:
    return [(0, max(e.params["shape"][e.params["axis"]] - 1, 0))]


@range_rules.register(P.TOPK)
def _topk(e: Eqn, r: Sequence[Range], declared: frozenset[Var]) -> list[Range]:
    return [(0, e.inputs[0].shape[-1] - 1)]


@range_rules.register(P.BLOCK_TOPK)
def _block_topk(e: Eqn, r: Sequence[Range], declared: frozenset[Var]) -> list[Range]:
    return [(-1, e.inputs[0].shape[-1] - 1)]  # a block id, or -1: none


@range_rules.register(P.INDEX_GUARD)
def _guard(e: Eqn, r: Sequence[Range], declared: frozenset[Var]) -> list[Range]:
    lo, hi = e.params["lo"], e.params["hi"]
    witness = (0, e.inputs[0].size)
    if e.outputs[1] in declared:  # the clamp counts: a bad value fails the step
        x = r[0]
        return [(lo, hi) if x is None else (min(max(x[0], lo), hi), max(min(x[1], hi), lo)),
                witness]
    return [r[0], witness]


def value_ranges(g: Graph) -> dict[Var, tuple[int, int]]:
    """Proven ranges of the graph's I32 values (those with none are absent)."""
    out: dict[Var, tuple[int, int]] = {}
    for s in g.slots:
        if s.var.range is not None:
            out[s.var] = s.var.range
        elif s.var.dtype is I32 and s.name in g.constants and s.var.size:
            c = g.constants[s.name]
            out[s.var] = (int(c.min()), int(c.max()))
    declared = frozenset(g.validations.values())
    for e in g.eqns:
        if e.prim not in range_rules or not all(o.dtype is I32 for o in e.outputs):
            continue
        ins = [v.range if isinstance(v, Literal) else out.get(v) for v in e.inputs]
        for o, rng in zip(e.outputs, range_rules[e.prim](e, ins, declared), strict=True):
            if rng is not None:
                out[o] = rng
    return out


def elide_proven_guards(g: Graph) -> Graph:
    """A guard whose operand is proven inside [lo, hi] is the identity: it is removed and its
    witness (which could never report a failure) is no longer a validation output."""
    ranges = value_ranges(g)
    users = g.use_info().users
    subst: dict[Var, Var] = {}
    dead: set[Var] = set()
    eqns = []
    for e in g.eqns:
        e = Eqn(e.prim, tuple(subst.get(v, v) for v in e.inputs), e.outputs, e.params)
        x = e.inputs[0] if e.prim is P.INDEX_GUARD else None
        r = None if x is None else (x.range if isinstance(x, Literal) else ranges.get(x))
        witness_used = e.prim is P.INDEX_GUARD and bool(users.get(e.outputs[1]))
        if r is not None and e.params["lo"] <= r[0] and r[1] <= e.params["hi"] \
                and not witness_used:
            subst[e.outputs[0]] = x  # type: ignore[assignment]
            dead.add(e.outputs[1])
            continue
        eqns.append(e)
    if not dead:
        return g
    out = g.replace(eqns, subst)
    out.validations = {k: v for k, v in out.validations.items() if v not in dead}
    return out


def gate_state_writes(g: Graph) -> Graph:
    """Gate every state write on the step's witnesses (see the module docstring)."""
    witnesses = list(dict.fromkeys(g.validations.values()))
    info = g.use_info()
    writers = {info.producer[v] for v in g.states.values() if v in info.producer}
    if not witnesses or not writers:
        return g
    for name, v in g.states.items():
        i = info.producer.get(v)
        e = None if i is None else g.eqns[i]
        # in place over the state's own buffer: a gated write leaves it as it was (a DUS over
        # another value would first copy that value over the state, ungated)
        if e is not None and (e.prim not in STATE_WRITES
                              or e.inputs[0] is not g.slot(name).var):
            raise UnsupportedPrimitive(
                str(e.prim), f"state {name!r} is not updated in place by a DynamicUpdateSlice: "
                "its write cannot be gated by the step's index guards")
    # the guards and everything they read run first, in their order
    first: set[int] = set()
    stack = [info.producer[w] for w in witnesses]
    while stack:
        i = stack.pop()
        if i in first:
            continue
        if i in writers:
            raise UnsupportedPrimitive(
                "IndexGuard", "it reads a state value written in the same step")
        first.add(i)
        stack.extend(info.producer[v] for v in g.eqns[i].inputs if v in info.producer)
    eqns = [e for i, e in enumerate(g.eqns) if i in first]
    for i, e in enumerate(g.eqns):
        if i in first:
            continue
        if i in writers:
            state, ops, starts, _ = update_parts(e.prim, e.inputs, e.params)
            e = Eqn(e.prim, (state, *ops, *starts, *witnesses), e.outputs, e.params)
        eqns.append(e)
    return g.replace(eqns)
