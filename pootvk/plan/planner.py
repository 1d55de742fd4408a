"""The planner: a compiled graph and a device profile in, a ``Plan`` out.

A plan says, for every eqn, which kernel request runs it and which buffer ranges it binds;
where every value lives (its own slot buffer, its state buffer, an export buffer, or a
coloured arena slot); and the arena's size. Planning needs no device: a recorded profile
will do. A refusal raises a typed error before any plan object exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..arena import ArenaLayout, Item, colour
from ..errors import BindingRange, DtypeLowering, UnsupportedPrimitive
from ..ir import BF16, F16, Graph, Literal, Params, SlotKind, Var
from .profile import DeviceProfile
from .requests import KernelRequest, LiteralOperand, PrimRequest, fold_grid
from .schedule import attention_request

PRIM_WORKGROUP = 64
# Primitives with a generated kernel (shaders.glsl_rules must cover exactly these).
PRIM_KERNELS = frozenset({
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Unary", "Compare", "Select", "Convert",
    "Iota", "Reshape", "Broadcast", "Transpose", "Slice", "Concat", "MatMul", "Reduce",
    "DynamicUpdateSlice", "Copy",
})


@dataclass(frozen=True)
class Location:
    """A byte range of a named runtime buffer (``in:q``, ``state:k_cache``, ``arena0``...)."""

    buffer: str
    offset: int
    nbytes: int

    def __str__(self) -> str:
        return f"{self.buffer}+{self.offset}" if self.offset else self.buffer


@dataclass(frozen=True)
class BufferSpec:
    name: str
    nbytes: int
    role: str  # input | param | state | export | arena
    slot: str | None = None


@dataclass(frozen=True)
class Kernel:
    request: KernelRequest
    operands: tuple[Location, ...]  # binding order: inputs (literals omitted), then output
    eqn: int
    label: str


@dataclass
class Plan:
    graph: Graph
    profile: DeviceProfile
    kernels: list[Kernel]
    buffers: dict[str, BufferSpec]
    locations: dict[Var, Location]
    arena: ArenaLayout
    outputs: dict[str, Location] = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        """Everything the recorded command buffer depends on."""
        return (
            tuple((k.request, k.operands) for k in self.kernels),
            tuple(sorted((b.name, b.nbytes, b.role) for b in self.buffers.values())),
        )

    def __str__(self) -> str:
        lines = [
            f"plan for {self.profile.name}: {len(self.kernels)} kernel(s), "
            f"arena peak {self.arena.peak_bytes} bytes"
        ]
        for i, k in enumerate(self.kernels):
            ops = " ".join(map(str, k.operands))
            lines.append(f"  k{i} [eqn {k.eqn}] {k.request.describe()}")
            lines.append(f"       binds {ops}")
        lines.append("buffers:")
        for b in self.buffers.values():
            lines.append(f"  {b.name:<20} {b.role:<6} {b.nbytes:>12d} B")
        lines.append(str(self.arena))
        return "\n".join(lines)


def _slot_buffer(kind: SlotKind, name: str) -> tuple[str, str]:
    if kind is SlotKind.STATE:
        return f"state:{name}", "state"
    if kind is SlotKind.PARAM:
        return f"param:{name}", "param"
    return f"in:{name}", "input"


def _locate(
    g: Graph, profile: DeviceProfile
) -> tuple[dict[Var, Location], dict[str, BufferSpec], ArenaLayout]:
    locs: dict[Var, Location] = {}
    bufs: dict[str, BufferSpec] = {}
    for s in g.slots:
        name, role = _slot_buffer(s.kind, s.name)
        bufs[name] = BufferSpec(name, s.var.nbytes, role, s.name)
        locs[s.var] = Location(name, 0, s.var.nbytes)
    for name, v in g.states.items():
        if v not in locs:
            locs[v] = locs[g.slot(name).var]
    for name, v in {**g.exports, **g.validations}.items():
        if v not in locs:
            bufs[f"out:{name}"] = BufferSpec(f"out:{name}", v.nbytes, "export", name)
            locs[v] = Location(f"out:{name}", 0, v.nbytes)
    for b in bufs.values():
        if b.nbytes > profile.max_storage_buffer_range:
            raise BindingRange(b.name, b.nbytes, profile.max_storage_buffer_range)

    first: dict[Var, int] = {}
    last: dict[Var, int] = {}
    for i, e in enumerate(g.eqns):
        for o in e.outputs:
            first.setdefault(o, i)
            last.setdefault(o, i)
        for v in e.inputs:
            if v in first:
                last[v] = i
    names = {v: f"v{i}" for i, v in enumerate(first)}
    items = [
        Item(names[v], v.nbytes, first[v], last[v]) for v in first if v not in locs
    ]
    layout = colour(
        items,
        alignment=profile.min_storage_offset_alignment,
        max_binding=profile.max_storage_buffer_range,
        max_buffer=min(profile.max_allocation, 1 << 32),
    )
    for a, size in enumerate(layout.sizes):
        bufs[f"arena{a}"] = BufferSpec(f"arena{a}", size, "arena")
    for v, n in names.items():
        if n in layout.placements:
            p = layout.placements[n]
            locs[v] = Location(f"arena{p.arena}", p.offset, v.nbytes)
    return locs, bufs, layout


def _prim_request(
    prim: str, inputs: tuple[Var, ...], out: Var, params: Params, threads: int,
    profile: DeviceProfile,
) -> PrimRequest:
    ins = tuple(
        LiteralOperand(v.value, v.dtype) if isinstance(v, Literal) else (v.shape, v.dtype)
        for v in inputs
    )
    groups = -(-max(threads, 1) // PRIM_WORKGROUP)
    return PrimRequest(
        prim=prim, params=params, inputs=ins, output=(out.shape, out.dtype),
        threads=threads, local_size=PRIM_WORKGROUP, grid=fold_grid(groups, profile.max_grid),
    )


def plan_graph(g: Graph, profile: DeviceProfile) -> Plan:
    """Plan a compiled graph for ``profile``; every refusal is a typed error."""
    for e in g.eqns:
        for v in (*e.inputs, *e.outputs):
            if v.dtype in (F16, BF16):
                raise DtypeLowering(e.prim, v.dtype.value)
        if e.prim != "Attention" and e.prim not in PRIM_KERNELS:
            raise UnsupportedPrimitive(e.prim, "no kernel generator for this primitive")
    locs, bufs, layout = _locate(g, profile)

    # An eqn writing a state buffer must come after every read of the state's old value.
    uses = g.uses()
    order = {id(e): i for i, e in enumerate(g.eqns)}
    for name, v in g.states.items():
        slot_var = g.slot(name).var
        prod = g.producers().get(v)
        if prod is None:
            continue
        late = [u for u in uses.get(slot_var, []) if order[id(u)] > order[id(prod)]]
        if late:
            raise UnsupportedPrimitive(
                prod.prim, f"state {name!r} is read by {late[0].prim} after its in-place update"
            )

    kernels: list[Kernel] = []
    for i, e in enumerate(g.eqns):
        if e.prim == "Attention":
            req: KernelRequest = attention_request(e, profile)
            ops = tuple(locs[v] for v in e.inputs) + (locs[e.out],)
            kernels.append(Kernel(req, ops, i, "attention"))
            continue
        if e.prim == "DynamicUpdateSlice":
            operand, update, *starts = e.inputs
            if locs.get(operand) != locs[e.out]:  # not in place: copy the operand first
                cp = _prim_request("Copy", (operand,), e.out, Params(), operand.size, profile)
                kernels.append(Kernel(cp, (locs[operand], locs[e.out]), i, "copy"))
            req = _prim_request(e.prim, e.inputs, e.out, e.params, update.size, profile)
            ops = tuple(locs[v] for v in (update, *starts) if not isinstance(v, Literal))
            kernels.append(Kernel(req, ops + (locs[e.out],), i, e.prim))
            continue
        req = _prim_request(e.prim, e.inputs, e.out, e.params, e.out.size, profile)
        ops = tuple(locs[v] for v in e.inputs if not isinstance(v, Literal))
        kernels.append(Kernel(req, ops + (locs[e.out],), i, e.prim))

    outputs = {name: locs[v] for name, v in g.outputs().items()}
    return Plan(g, profile, kernels, bufs, locs, layout, outputs)
