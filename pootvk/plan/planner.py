"""The planner: a compiled graph and a device profile in, a ``Plan`` out.

The planner applies one plan rule per eqn (``plan.rules``), which gives the kernel schedule
and the scratch each eqn declares; fixes where slots, states and exports live; colours
every other value and all scratch into arena buffers by liveness over kernel indices
(``arena.kernel_items``); and binds each kernel operand to a byte range. Planning needs no
device: a recorded profile will do. A refusal raises a typed error before any plan exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..arena import ArenaLayout, colour, kernel_items
from ..errors import BindingRange, DtypeLowering, UnsupportedPrimitive
from ..ir import Graph, Literal, SlotKind, UseInfo, Var
from ..ir.fused import STATE_WRITES, update_parts
from ..ir.prims import RESHAPE, SLICE
from .bindings import Binding, BufferRole, Scratch
from .profile import DeviceProfile
from .rules import KernelCall, KernelRequest, PlanContext, plan_rules


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
    role: BufferRole
    slot: str | None = None


@dataclass(frozen=True)
class BoundOperand:
    """One binding of a kernel resolved: what the kernel declares and where it lives."""

    binding: Binding
    location: Location
    role: BufferRole


@dataclass(frozen=True)
class Kernel:
    request: KernelRequest
    bindings: tuple[BoundOperand, ...]  # the request's bindings(), in order
    eqn: int
    label: str

    @property
    def operands(self) -> tuple[Location, ...]:
        return tuple(b.location for b in self.bindings)


@dataclass
class Plan:
    graph: Graph
    profile: DeviceProfile
    kernels: list[Kernel]
    buffers: dict[str, BufferSpec]
    locations: dict[Var, Location]
    arena: ArenaLayout
    outputs: dict[str, Location] = field(default_factory=dict)
    #: eqn index -> location, for each Reshape or Slice that runs no kernel (a view of its
    #: operand's bytes)
    views: dict[int, Location] = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        """Everything the recorded command buffer depends on."""
        return (
            tuple((k.request, k.operands) for k in self.kernels),
            tuple(sorted((b.name, b.nbytes, b.role.value) for b in self.buffers.values())),
        )

    @property
    def arena_value_bytes(self) -> int:
        """What the coloured values and scratch would take with a buffer each (aligned)."""
        return self.arena.naive_bytes

    @property
    def arena_saved_bytes(self) -> int:
        """Bytes colouring saves: every intermediate's own buffer against the arena peak."""
        return self.arena.naive_bytes - self.arena.peak_bytes

    def __str__(self) -> str:
        naive = self.arena.naive_bytes
        pct = 100.0 * self.arena_saved_bytes / naive if naive else 0.0
        lines = [
            f"plan for {self.profile.name}: {len(self.kernels)} kernel(s), "
            f"arena peak {self.arena.peak_bytes} bytes for {naive} bytes of intermediates "
            f"(colouring saves {self.arena_saved_bytes} bytes, {pct:.0f}%)"
        ]
        for i, k in enumerate(self.kernels):
            ops = " ".join(
                f"{b.binding.name}{'->' if b.binding.access.writes else '='}{b.location}"
                for b in k.bindings
            )
            lines.append(f"  k{i} [eqn {k.eqn}] {k.request.describe()}")
            lines.append(f"       binds {ops}")
        for i, loc in self.views.items():
            out = self.graph.eqns[i].out
            lines.append(f"  view [eqn {i}] {self.graph.eqns[i].prim} -> {out.aval()} shares "
                         f"{loc} (no kernel)")
        lines.append("buffers:")
        for b in self.buffers.values():
            lines.append(f"  {b.name:<20} {b.role.value:<7} {b.nbytes:>12d} B")
        lines.append(str(self.arena))
        return "\n".join(lines)


#: bytes: kernels may read any coloured value with 16-byte vector loads from its start
VECTOR_ALIGN = 16

SLOT_ROLES: dict[SlotKind, tuple[str, BufferRole]] = {
    SlotKind.STATE: ("state", BufferRole.STATE),
    SlotKind.PARAM: ("param", BufferRole.PARAM),
    SlotKind.CONST: ("const", BufferRole.CONST),
}


def _fixed_locations(
    g: Graph, profile: DeviceProfile
) -> tuple[dict[Var, Location], dict[Var, BufferRole], dict[str, BufferSpec]]:
    """Slots, state outputs (in place over their slot), exports and witnesses: everything
    whose buffer does not depend on the schedule."""
    locs: dict[Var, Location] = {}
    roles: dict[Var, BufferRole] = {}
    bufs: dict[str, BufferSpec] = {}
    for s in g.slots:
        prefix, role = SLOT_ROLES.get(s.kind, ("in", BufferRole.INPUT))
        name = f"{prefix}:{s.name}"
        bufs[name] = BufferSpec(name, s.var.nbytes, role, s.name)
        locs[s.var], roles[s.var] = Location(name, 0, s.var.nbytes), role
    for name, v in g.states.items():
        if v not in locs:
            locs[v], roles[v] = locs[g.slot(name).var], BufferRole.STATE
    outs = [(n, v, BufferRole.EXPORT) for n, v in g.exports.items()]
    outs += [(n, v, BufferRole.WITNESS) for n, v in g.validations.items()]
    for name, v, role in outs:
        if v not in locs:
            bufs[f"out:{name}"] = BufferSpec(f"out:{name}", v.nbytes, role, name)
            locs[v], roles[v] = Location(f"out:{name}", 0, v.nbytes), role
    for b in bufs.values():
        if b.nbytes > profile.max_storage_buffer_range:
            raise BindingRange(b.name, b.nbytes, profile.max_storage_buffer_range)
    return locs, roles, bufs


def slice_offset(shape: tuple[int, ...], start: tuple[int, ...],
                 limit: tuple[int, ...]) -> int | None:
    """The element offset of a Slice whose result is one contiguous range of its dense
    row-major operand (axes before some axis keep one index, axes after it are whole:
    heads 0..8 of [1, 12, 1, 64]), else None."""
    out = [hi - lo for lo, hi in zip(start, limit, strict=True)]
    for d in range(max(len(shape), 1)):
        if all(n == 1 for n in out[:d]) and out[d + 1:] == list(shape[d + 1:]):
            return sum(lo * st for lo, st in zip(start, _strides(shape), strict=True))
    return None


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def _views(
    g: Graph, locs: dict[Var, Location], roles: dict[Var, BufferRole], align: int
) -> tuple[dict[Var, Var], dict[Var, int]]:
    """Reshapes and contiguous Slices that run no kernel: view -> the value whose bytes it
    shares (its root), and the view's byte offset into the root.

    Every value is dense row-major, so a Reshape's output is its operand's bytes under
    another shape, and a Slice that is one contiguous range of them (``slice_offset``) is
    those bytes at an offset (a multiple of ``align``, so it can be bound). A view of a
    value with a fixed home is placed there now; a root with no home yet takes its
    Reshape view's export buffer (its producer then writes the export directly), or is
    coloured and its views follow it (``plan_graph``), the root alive while any view is
    read (``arena.kernel_items``). The eqn runs as a copy instead where both have
    different homes, the view is a state output (or a Slice's output has a home of its
    own), or the operand is a literal."""
    views: dict[Var, Var] = {}
    offsets: dict[Var, int] = {}
    for e in g.eqns:
        if e.prim not in (RESHAPE, SLICE) or isinstance(e.inputs[0], Literal):
            continue
        src, out = e.inputs[0], e.out
        off = 0
        if e.prim is SLICE:
            elems = slice_offset(src.shape, e.params["start"], e.params["limit"])
            if elems is None or (elems * src.dtype.device_itemsize) % align:
                continue
            off = elems * src.dtype.device_itemsize
        root = views.get(src, src)
        off += offsets.get(src, 0)
        if out in locs:
            exported = roles[out] in (BufferRole.EXPORT, BufferRole.WITNESS)
            if root in locs or not exported or e.prim is SLICE or off or \
                    root.nbytes != out.nbytes:
                continue  # two homes: a copy
            locs[root], roles[root] = locs[out], roles[out]
        elif root in locs:
            home = locs[root]
            locs[out], roles[out] = Location(home.buffer, home.offset + off, out.nbytes), \
                roles[root]
        views[out], offsets[out] = root, off
    return views, offsets


def _check_state_order(g: Graph, info: UseInfo, views: dict[Var, Var]) -> None:
    """An eqn writing a state buffer must come after every read of the state's old value
    (through any view of it)."""
    for name, v in g.states.items():
        prod = info.producer.get(v)
        old = g.slot(name).var
        reads = [u for w in (old, *(w for w, r in views.items() if r is old))
                 for u in info.users.get(w, [])]
        late = [u for u in reads if prod is not None and u > prod]
        if late:
            raise UnsupportedPrimitive(
                str(g.eqns[prod].prim),  # type: ignore[index]
                f"state {name!r} is read by {g.eqns[late[0]].prim} after its in-place update",
            )


def _check_gated(g: Graph, info: UseInfo) -> None:
    """With validation witnesses, every state write must be gated on all of them
    (``passes.gate_state_writes``): a failed guard must leave the state unchanged."""
    witnesses = set(g.validations.values())
    if not witnesses:
        return
    for name, v in g.states.items():
        i = info.producer.get(v)
        if i is None:
            continue
        e = g.eqns[i]
        gates = set(update_parts(e.prim, e.inputs, e.params)[3]) if e.prim in STATE_WRITES \
            else set()
        if not witnesses <= gates:
            raise UnsupportedPrimitive(
                str(e.prim), f"state {name!r} is written without the step's index-guard gates "
                "(compile the graph: passes.gate_state_writes)")


def plan_graph(g: Graph, profile: DeviceProfile, *, group: bool = True) -> Plan:
    """Plan a compiled graph for ``profile``; every refusal is a typed error. With
    ``group`` the kernels are listed level by level and each level's small elementwise
    kernels share one launch (``plan.group``)."""
    has16 = bool(profile.extra.get("storage_buffer_16bit"))
    for i, e in enumerate(g.eqns):
        for v in (*e.inputs, *e.outputs):
            if v.dtype.is_16bit and not has16:  # 16-bit words are loaded and stored
                raise DtypeLowering(f"eqn {i} ({e.prim})", v.dtype.value,
                                    "storageBuffer16BitAccess")
        plan_rules[e.prim]  # a primitive with no rule: UnsupportedPrimitive before any work
    info = g.use_info()  # one walk: the state-order check and the liveness both read it
    _check_gated(g, info)
    locs, roles, bufs = _fixed_locations(g, profile)
    align = max(profile.min_storage_offset_alignment, VECTOR_ALIGN)
    views, offsets = _views(g, locs, roles, align)
    _check_state_order(g, info, views)

    def same_storage(a: Var, b: Var) -> bool:
        """Whether ``a`` and ``b`` are one set of bytes: a view and its root (the same
        bytes: a Reshape), or two values with one fixed home (a state output in place over
        its slot)."""
        if views.get(a, a) is views.get(b, b) and offsets.get(a, 0) == offsets.get(b, 0) \
                and a.nbytes == b.nbytes:
            return True
        return a in locs and locs.get(a) == locs.get(b)

    ctx = PlanContext(profile, same_storage, lambda v: v in views)

    calls: list[tuple[int, KernelCall]] = []
    scratch: dict[Scratch, int] = {}
    for i, e in enumerate(g.eqns):
        res = plan_rules[e.prim](e, ctx)
        calls += [(i, c) for c in res.kernels]
        scratch.update((s, i) for s in res.scratch)

    scratch_locs: dict[Scratch, Location] = {}
    for n, sc in enumerate(s for s in scratch if s.persistent):
        name = f"scratch:{sc.label}{n}"
        bufs[name] = BufferSpec(name, sc.nbytes, BufferRole.SCRATCH)
        scratch_locs[sc] = Location(name, 0, sc.nbytes)
    coloured = {s: i for s, i in scratch.items() if not s.persistent}
    items, names = kernel_items(info, [i for i, _ in calls], fixed=set(locs), scratch=coloured,
                                views=views)
    layout = colour(
        items,
        # 16 at least: every coloured value starts where a 16-byte vector load may read it
        alignment=align,
        max_binding=profile.max_storage_buffer_range,
        max_buffer=min(profile.max_allocation, 1 << 32),
    )
    for a, size in enumerate(layout.sizes):
        bufs[f"arena{a}"] = BufferSpec(f"arena{a}", size, BufferRole.ARENA)
    for obj, n in names.items():
        p = layout.placements[n]
        loc = Location(f"arena{p.arena}", p.offset, p.item.nbytes)
        if isinstance(obj, Scratch):
            scratch_locs[obj] = loc
        else:
            locs[obj], roles[obj] = loc, BufferRole.ARENA
    for view, root in views.items():
        home = locs[root]
        locs[view] = Location(home.buffer, home.offset + offsets[view], view.nbytes)
        roles[view] = roles[root]
    kernels = []
    for i, c in calls:
        bound = []
        for b, op in zip(c.request.bindings(), c.operands, strict=True):
            if isinstance(op, Scratch):
                bound.append(BoundOperand(b, scratch_locs[op], BufferRole.SCRATCH))
            else:
                bound.append(BoundOperand(b, locs[op], roles[op]))
        kernels.append(Kernel(c.request, tuple(bound), i, c.label))
    if group:
        from .group import group_kernels  # it builds Kernels: imported after this module

        kernels = group_kernels(kernels, profile)
    outputs = {name: locs[v] for name, v in g.outputs().items()}
    shown = {info.producer[v]: locs[v] for v in views}
    return Plan(g, profile, kernels, bufs, locs, layout, outputs, dict(sorted(shown.items())))
