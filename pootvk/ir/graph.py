"""The IR's data: variables, equations, input slots and the graph that holds them.

Like JAX's jaxpr, a ``Var`` carries only its abstract value (shape, dtype and, for integers,
an optional proven value range); names are given when the graph is printed. A ``Literal``
is a scalar constant operand. ``Eqn.params`` is an immutable, hashable mapping.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from .dtypes import DType

if TYPE_CHECKING:
    from .prims import Prim


class Var:
    """An SSA value. Identity is object identity; equality is never structural."""

    __slots__ = ("shape", "dtype", "range", "__weakref__")

    def __init__(
        self, shape: tuple[int, ...], dtype: DType, range: tuple[int, int] | None = None
    ) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.range = range

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.device_itemsize

    def aval(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.shape))}]"

    def __repr__(self) -> str:
        return f"Var({self.aval()})"


class Literal(Var):
    """A scalar constant operand, inlined wherever it is used (it has no storage)."""

    __slots__ = ("value",)

    def __init__(self, value: float | int | bool, dtype: DType) -> None:
        rng = (int(value), int(value)) if dtype.is_int else None
        super().__init__((), dtype, rng)
        self.value = value

    def __repr__(self) -> str:
        return f"Literal({self.value!r}:{self.dtype.value})"


class Params(Mapping[str, Any]):
    """Immutable, hashable eqn parameters (values must be hashable)."""

    __slots__ = ("_items",)

    def __init__(
        self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), **kw: Any
    ) -> None:
        d = {**dict(items), **kw}
        self._items = tuple(sorted(d.items()))

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Params) and self._items == other._items

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._items) + "}"


@dataclass(frozen=True, eq=False)
class Eqn:
    prim: Prim
    inputs: tuple[Var, ...]
    outputs: tuple[Var, ...]
    params: Params = field(default_factory=Params)

    @property
    def out(self) -> Var:
        (o,) = self.outputs
        return o


class SlotKind(Enum):
    """How an input slot is bound.

    PARAM: weights, bound when they change. INPUT: a per-step activation (q, new k/v).
    STATE: a KV pool or cache, donated and updated in place (a matching state output).
    POS, LEN: per-step integers with a declared range; SLOTMAP/WRITEMAP: paged maps;
    TOKENS: token ids. CONST: a value computed at compile time (constant folding), held in
    ``Graph.constants`` and written once, never bound by a caller.
    """

    PARAM = "param"
    INPUT = "input"
    STATE = "state"
    POS = "pos"
    SLOTMAP = "slotmap"
    WRITEMAP = "writemap"
    LEN = "len"
    TOKENS = "tokens"
    CONST = "const"

    @property
    def per_step(self) -> bool:
        return self not in (SlotKind.PARAM, SlotKind.STATE, SlotKind.CONST)

    @property
    def bound(self) -> bool:
        """Whether a caller binds this slot (everything but compile-time constants)."""
        return self is not SlotKind.CONST


@dataclass(frozen=True, eq=False)
class Slot:
    name: str
    kind: SlotKind
    var: Var

    @property
    def range(self) -> tuple[int, int] | None:
        return self.var.range


@dataclass(eq=False)
class Graph:
    """Input slots, eqns in order, named exports, state outputs and validation witnesses.

    ``states`` maps a STATE slot's name to the Var holding its value after the step; the
    runtime updates that slot's buffer in place. ``validations`` are the witnesses of index
    guards (``IndexGuard``: an I32 [2], the count of offending elements and one of them); a
    nonzero first word fails the step and nothing of it is published. ``constants`` holds the value
    (a numpy array) of every CONST slot, by slot name.
    """

    slots: list[Slot]
    eqns: list[Eqn]
    exports: dict[str, Var]
    states: dict[str, Var] = field(default_factory=dict)
    validations: dict[str, Var] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)

    def slot(self, name: str) -> Slot:
        for s in self.slots:
            if s.name == name:
                return s
        raise KeyError(f"no slot {name!r}; slots: {[s.name for s in self.slots]}")

    def outputs(self) -> dict[str, Var]:
        """Everything observable after a step: exports, state outputs, witnesses."""
        return {**self.exports, **self.states, **self.validations}

    def use_info(self) -> UseInfo:
        """Producers, users and last uses of every value, from one walk over the eqns."""
        return UseInfo.of(self)

    def count(self, prim: Prim) -> int:
        """How many eqns apply ``prim`` (a ``Prim`` object: a name string is refused, it
        would silently count nothing)."""
        from .prims import Prim

        if not isinstance(prim, Prim):
            raise TypeError(f"count() takes a Prim (pootvk.ir.prims), got {prim!r}")
        return sum(1 for e in self.eqns if e.prim is prim)

    def replace(
        self, eqns: list[Eqn], subst: Mapping[Var, Var] | None = None,
        *, slots: list[Slot] | None = None, constants: Mapping[str, Any] | None = None,
    ) -> Graph:
        """A graph with new eqns and the observable outputs renamed through ``subst``
        (optionally new slots and constants: constant folding adds CONST slots)."""
        s = subst or {}
        ren = {k: s.get(v, v) for k, v in self.exports.items()}
        return Graph(
            list(self.slots if slots is None else slots),
            list(eqns),
            ren,
            {k: s.get(v, v) for k, v in self.states.items()},
            {k: s.get(v, v) for k, v in self.validations.items()},
            dict(self.constants if constants is None else constants),
        )

    def __str__(self) -> str:
        from .printing import format_graph

        return format_graph(self)


@dataclass(frozen=True)
class UseInfo:
    """One walk over a graph's eqns: who produces each value, who uses it, its last use.

    Indices are eqn positions. Liveness (the arena), dead-code elimination and the oracle's
    freeing of dead values all read this one record instead of walking the graph again.
    """

    producer: dict[Var, int]
    users: dict[Var, list[int]]
    observed: frozenset[Var]

    @staticmethod
    def of(g: Graph) -> UseInfo:
        producer: dict[Var, int] = {}
        users: dict[Var, list[int]] = {}
        for i, e in enumerate(g.eqns):
            for v in e.inputs:
                if not isinstance(v, Literal):
                    users.setdefault(v, []).append(i)
            for o in e.outputs:
                producer[o] = i
        return UseInfo(producer, users, frozenset(g.outputs().values()))

    def last_use(self, v: Var) -> int | None:
        u = self.users.get(v)
        return u[-1] if u else None

    def live_eqns(self, g: Graph) -> list[bool]:
        """Which eqns something observable depends on (the rest is dead code)."""
        live = [False] * len(g.eqns)
        stack = [self.producer[v] for v in self.observed if v in self.producer]
        while stack:
            i = stack.pop()
            if live[i]:
                continue
            live[i] = True
            stack.extend(self.producer[v] for v in g.eqns[i].inputs if v in self.producer)
        return live
