"""Elementwise fusion: a producer merged into its single consumer, so the value it makes never
goes through memory and costs no kernel of its own.

Why: a decode step is memory-bound, and an unfused elementwise chain writes and reads every
intermediate (RMSNorm traces seven eqns: x*x, Sum, *1/n, +eps, Rsqrt, *x, *w; SwiGLU's
``silu(g) * u`` two; softmax five). After this pass RMSNorm is one kernel, SwiGLU one after
its matmuls, softmax two.

What merges: an eqn of an elementwise prim (``ir.fused.ELEMENTWISE``, or a ``Fused`` eqn)
whose output

- is read by exactly one eqn (which may read it more than once: ``x * x``),
- is not observable (an export, a state output or a validation witness), and
- feeds an elementwise eqn (the two become one ``Fused`` eqn), an index-moving one
  (``Slice``, ``Concat``: the body reads through it at a moved index, XLA-style loop
  fusion, so RoPE's ``x * cos + concat(slice(x), slice(x)) * sin`` is one kernel reading
  ``x`` at three indices), the update of a ``DynamicUpdateSlice`` (which becomes a
  ``FusedUpdate`` computing the update in place at its run-time starts, gates kept; not
  when the update reads the state it overwrites), or a ``Reduce`` (which becomes a
  ``FusedReduce`` computing the producer on load).

Then a reduction keeping its axis, read by one eqn only and not observable, merges with the
elementwise chain that reads it when that chain's value has the reduction's row shape: one
``FusedRow`` kernel reduces each row and computes the chain per element of the same row
(``x * rsqrt(mean(x*x) + eps) * w``: the sum is never stored).

All within ``MAX_OPERANDS`` buffers and ``MAX_NODES`` nodes per kernel (a producer that
would pass either limit stays its own eqn). Rounds repeat to a fixed point: a value two eqns
read, both merged into one body by a round, is read by one eqn in the next and merges then
(one node both reads share: computed once). A merged computation moves to its consumer's
position, so one that reads a state slot is emitted before any eqn that overwrites that
state in place, and a reduction of such a state is not moved past the update. An eqn
nothing merges into is left exactly as it was (its ordinary primitive kernel).

The pass runs last, after the attention rewrite (it would hide an attention chain's
elementwise steps from the matcher), and keeps the oracle's answer bit for bit: the fused
rules evaluate the same rules in the same order (``oracle.fused``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import BOOL, DType, Eqn, Graph, Literal, Params, Prim, Var
from ..ir import prims as P
from ..ir.fused import (
    ELEMENTWISE,
    FUSED,
    FUSED_REDUCE,
    FUSED_ROW,
    FUSED_UPDATE,
    MOVES,
    STATE_WRITES,
    FusedBody,
    Leaf,
    Node,
    moves_reduced,
    update_parts,
)
from ..ir.prims import REDUCE
from .canonicalize import dead_code_elimination

#: Buffers one fused kernel may read (its output is one more binding: 8 in all, the
#: storage-buffer bindings per stage every device we profile offers many times over).
MAX_OPERANDS = 7
#: Nodes of one body (keeps generated kernels small and their compile time flat).
MAX_NODES = 64
#: A reduction of rows longer than LONG_ROW, fewer than FEW_ROWS of them, is not fused: a
#: fused row is one workgroup, while the Reduce kernel splits long rows over the device
#: (H200, bench/fusion.py: softmax over one 128256-wide row fused 255 us against 102 us
#: unfused in F32, 263 against 52 us in F16; RMSNorm 1x8192 fused stays 1.5-2.1x faster).
LONG_ROW = 16384
FEW_ROWS = 64


@dataclass(eq=False)
class _Expr:
    """A pending computation as a tree over graph values (DAG: shared sub-exprs are shared
    objects). ``eqn`` is the original eqn when the expr is exactly that eqn."""

    op: Prim
    params: Params
    args: tuple[_Expr | Var, ...]
    shape: tuple[int, ...]
    dtype: DType
    eqn: Eqn | None = None


def linearize(
    x: _Expr, operands: tuple[Var, ...] = (), reduced: Var | None = None
) -> tuple[FusedBody, tuple[Var, ...]]:
    """The body of ``x`` (shared sub-exprs once, each distinct value read by one leaf) and
    the values its leaves read: ``operands`` first (a FusedRow's prologue operands, which
    its epilogue may read too), then new ones in leaf order. ``reduced`` is read through
    the ``REDUCED`` leaf."""
    nodes: list[Node] = []
    memo: dict[object, int] = {}
    ops = list(operands)

    def visit(a: _Expr | Var) -> int:
        if isinstance(a, Literal):
            key: object = ("lit", repr(a.value), a.dtype)
            if key not in memo:
                memo[key] = len(nodes)
                nodes.append(Node.literal(a.value, a.dtype))
            return memo[key]
        key = id(a)
        if key in memo:
            return memo[key]
        if isinstance(a, _Expr):
            args = tuple(visit(b) for b in a.args)
            nodes.append(Node(a.op, args, a.params, a.shape, a.dtype))
        elif a is reduced:
            nodes.append(Node.reduced(a.shape, a.dtype))
        else:
            if a not in ops:
                ops.append(a)
            nodes.append(Node.operand(ops.index(a), a.shape, a.dtype))
        memo[key] = len(nodes) - 1
        return memo[key]

    visit(x)
    return FusedBody(tuple(nodes)), tuple(ops)


def _leaves(x: _Expr) -> set[Var]:
    return set(linearize(x)[1])


def _fits(x: _Expr) -> bool:
    body, ops = linearize(x)
    return len(ops) <= MAX_OPERANDS and len(body.nodes) <= MAX_NODES


def _only_moves(x: _Expr) -> bool:
    """Whether ``x`` computes nothing: it only moves indices of stored values (a Gather's
    row is a stored index)."""
    body, _ = linearize(x)
    return all(n.op is Leaf.OPERAND or n.op in MOVES or n.op is P.BROADCAST
               for n in body.nodes)


def _body_expr(body: FusedBody, operands: tuple[Var, ...],
               args: dict[Var, _Expr | Var]) -> _Expr:
    """A body as an expr whose leaf ``j`` reads ``args[operands[j]]``."""
    built: list[_Expr | Var] = []
    for n in body.nodes:
        if n.op is Leaf.OPERAND:
            built.append(args[operands[n.params["index"]]])
        elif n.op is Leaf.LITERAL:
            built.append(Literal(n.params["value"], n.dtype))
        else:
            assert isinstance(n.op, Prim)  # a Fused body has no REDUCED leaf
            built.append(_Expr(n.op, n.params, tuple(built[a] for a in n.args),
                               n.shape, n.dtype))
    root = built[-1]
    assert isinstance(root, _Expr)  # a body is never one leaf
    return root


def _expr_of(e: Eqn, args: dict[Var, _Expr | Var]) -> _Expr:
    """``e`` as an expr whose operands are ``args`` (a pending expr or the value itself)."""
    if e.prim is FUSED:
        root = _body_expr(e.params["body"], e.inputs, args)
    else:
        root = _Expr(e.prim, e.params, tuple(args.get(v, v) for v in e.inputs), e.out.shape,
                     e.out.dtype)
    if all(not isinstance(a, _Expr) for a in args.values()):
        root.eqn = e
    return root


def _as_eqn(x: _Expr, outputs: tuple[Var, ...]) -> Eqn:
    if x.eqn is not None:
        return x.eqn
    body, ops = linearize(x)
    return Eqn(FUSED, ops, outputs, Params(body=body))


def fuse(g: Graph) -> Graph:
    """Merge elementwise producers into their single consumers (see the module doc), to a
    fixed point: a value read by two eqns that one pass merged into one body is read by one
    eqn in the next, and merges then (computed once, in registers, for both reads)."""
    while True:
        fused = _fuse_once(g)
        if len(fused.eqns) == len(g.eqns):
            return fused
        g = fused


def _long_rows(e: Eqn) -> bool:
    """A Reduce over few long rows: its own kernel splits them, a fused row would not."""
    x = e.inputs[0]
    n = x.shape[e.params["axis"]] if x.shape else 1
    return n > LONG_ROW and x.size // max(n, 1) < FEW_ROWS


def _fuse_once(g: Graph) -> Graph:
    info = g.use_info()
    observed = info.observed
    overwrites = {v: g.slot(name).var for name, v in g.states.items()}  # output -> old slot

    def merges_into(e: Eqn, v: Var) -> bool:
        if e.prim in STATE_WRITES:  # the update only, never the state, a start or a gate
            state, ops, starts, gates = update_parts(e.prim, e.inputs, e.params)
            return v in ops and v is not state and v not in starts + gates
        return e.prim in ELEMENTWISE or e.prim in MOVES or e.prim is FUSED or (
            e.prim is REDUCE and e.inputs[0].dtype is not BOOL and not _long_rows(e)
        )

    shared: set[Var] = set()  # pending moves every reader computes for itself

    def inlinable(v: Var, x: _Expr) -> bool:
        """Whether ``v`` (computed by ``x``) is merged into its readers: one reader, or
        several when ``x`` only moves indices (a transpose or slice of stored values costs
        no arithmetic, so each reader reads through it instead of a kernel storing it)."""
        users = {g.eqns[u] for u in info.users.get(v, ())}
        if v in observed or not users or not all(merges_into(u, v) for u in users):
            return False
        if len(users) > 1:
            if not _only_moves(x):
                return False
            shared.add(v)
        return True

    def take(v: Var) -> None:
        """A reader merged pending ``v``: it is gone unless other readers merge it too."""
        if v not in shared:
            del pending[v]

    views = {e.out: e.inputs[0] for e in g.eqns if e.prim is P.RESHAPE}

    def root(v: Var) -> Var:
        """The value whose bytes ``v`` is (a Reshape is a view of its operand)."""
        while v in views:
            v = views[v]
        return v

    pending: dict[Var, _Expr] = {}
    eqns: list[Eqn | None] = []  # None: a reduction a FusedRow took over
    reductions: dict[Var, int] = {}  # a private keepdim reduction's output -> its position

    def row_of(x: _Expr, outputs: tuple[Var, ...]) -> Eqn | None:
        """``x`` with a reduction it reads, as one FusedRow: the reduction must be read by
        ``x`` alone, keep its axis, reduce a row of ``x``'s shape, and not read a state
        overwritten since (the reduction moves here)."""
        _, leaves = linearize(x)
        for r in leaves:
            i = reductions.get(r)
            if i is None:
                continue
            red = eqns[i]
            assert red is not None
            pro = red.params["body"] if red.prim is FUSED_REDUCE else None
            pro_ops = red.inputs
            if pro is None:
                pro = FusedBody((Node.operand(0, red.inputs[0].shape, red.inputs[0].dtype),))
            if pro.out.shape != x.shape:
                continue
            moved_past = {overwrites[o] for e in eqns[i + 1:] if e for o in e.outputs
                          if o in overwrites}
            if moved_past & set(pro_ops):
                continue
            epi, ops = linearize(x, pro_ops, reduced=r)
            if moves_reduced(epi):  # the kernel holds its own row's reduction only
                continue
            if len(ops) > MAX_OPERANDS or len(epi.nodes) + len(pro.nodes) > MAX_NODES:
                continue
            eqns[i] = None
            del reductions[r]
            ps = Params(body=pro, op=red.params["op"], axis=red.params["axis"], epilogue=epi)
            return Eqn(FUSED_ROW, ops, outputs, ps)
        return None

    def emit(x: _Expr, outputs: tuple[Var, ...]) -> None:
        eqns.append(row_of(x, outputs) or _as_eqn(x, outputs))

    def materialize(v: Var) -> None:
        emit(pending.pop(v), (v,))

    def update_of(e: Eqn) -> Eqn | None:
        """A state write whose update reads pending exprs, as one FusedUpdate computing
        them: the update must not read the state it overwrites, itself or through a view
        (one kernel would read elements it writes), nor bind more buffers than the limit
        or the unfused write."""
        state, ops, starts, gates = update_parts(e.prim, e.inputs, e.params)
        if not any(v in pending for v in ops):
            return None
        fixed = sum(1 for v in starts if not isinstance(v, Literal)) + len(gates)
        cap = max(MAX_OPERANDS, 1 + fixed) - fixed
        body = e.params["body"] if e.prim is FUSED_UPDATE else None  # else the one update
        args: dict[Var, _Expr | Var] = {v: v for v in ops}
        merged = False
        for v in ops:
            if v not in pending:
                continue
            args[v] = pending[v]
            u = pending[v] if body is None else _body_expr(body, ops, args)
            new_body, leaves = linearize(u)
            if any(root(w) is root(state) for w in leaves) or len(leaves) > cap \
                    or len(new_body.nodes) > MAX_NODES:
                args[v] = v
            else:
                take(v)
                merged = True
        for v in e.inputs:
            if v in pending:
                materialize(v)
        if not merged:
            return None
        top = args[ops[0]] if body is None else _body_expr(body, ops, args)
        assert isinstance(top, _Expr)
        new_body, leaves = linearize(top)
        return Eqn(FUSED_UPDATE, (state, *leaves, *starts, *gates), e.outputs,
                   Params(body=new_body))

    def note_reduction(e: Eqn) -> None:
        users = set(info.users.get(e.out, ()))
        user = g.eqns[users.pop()].prim if len(users) == 1 else None
        if (e.params["keepdim"] and e.out not in observed and e.out.dtype is not BOOL
                and (user in ELEMENTWISE or user is FUSED)):
            reductions[e.out] = len(eqns) - 1

    for e in g.eqns:
        for o in e.outputs:  # an in-place state write: computations reading the old value first
            old = overwrites.get(o)
            if old is not None and old is not o:
                for v in [v for v, x in pending.items() if old in _leaves(x)]:
                    materialize(v)
        if e.prim is REDUCE and _long_rows(e):
            for v in e.inputs:
                if v in pending:
                    materialize(v)
            eqns.append(e)
            continue
        if e.prim in STATE_WRITES and (made := update_of(e)) is not None:
            eqns.append(made)
            continue
        if e.prim is P.RESHAPE and (e.inputs[0] not in pending or (
                _only_moves(pending[e.inputs[0]]) and not inlinable(
                    e.out, _expr_of(e, {e.inputs[0]: pending[e.inputs[0]]})))):
            # a view of a stored value: no kernel, and a leaf as it is; a pending move
            # whose reshape nothing merges is stored as it is (a Slice may be a view too)
            if e.inputs[0] in pending:
                materialize(e.inputs[0])
            eqns.append(e)
            continue
        if e.prim in ELEMENTWISE or e.prim in MOVES or e.prim is FUSED or e.prim is REDUCE:
            args: dict[Var, _Expr | Var] = {v: v for v in e.inputs if not isinstance(v, Literal)}
            for v in list(args):
                if v not in pending:
                    continue
                args[v] = pending[v]
                if _fits(_expr_of(e, args)):
                    take(v)
                else:
                    args[v] = v
                    materialize(v)
            if e.prim is REDUCE:
                src = args[e.inputs[0]]
                if isinstance(src, _Expr):
                    body, ops = linearize(src)
                    ps = Params(body=body, **dict(e.params))
                    eqns.append(Eqn(FUSED_REDUCE, ops, e.outputs, ps))
                else:
                    eqns.append(e)
                note_reduction(eqns[-1])  # type: ignore[arg-type]
                continue
            x = _expr_of(e, args)
            if inlinable(e.out, x):
                pending[e.out] = x
            else:
                emit(x, e.outputs)
            continue
        for v in e.inputs:
            if v in pending:
                materialize(v)
        eqns.append(e)
        if e.prim is FUSED_REDUCE:  # made by an earlier pass: a FusedRow's prologue still
            note_reduction(e)
    for v in list(pending):  # nothing observable reads these: only dead code is left here
        materialize(v)  # (or moves every reader merged: dead now too)
    return dead_code_elimination(g.replace([e for e in eqns if e is not None]))
