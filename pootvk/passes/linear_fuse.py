"""Linear fusion: the elementwise work on either side of a ``Linear`` runs inside its kernel.

Why: a decode step is a chain of dependent kernels, and on a GPU each link costs a few
microseconds whatever it computes (``/work/shared/research/dispatch-cost.md``: ~2 us per
dependent dispatch on the H200). Around every Linear of a Llama layer sit small elementwise
kernels: RMSNorm (a ``FusedRow``) before the q/k, v, gate, up projections and the LM head,
SwiGLU (a ``Fused``) before the down projection, the residual ``Add`` after the o and down
projections. Folded into the Linear (``ir.linear_form``) they cost a few loads and ALU ops
per element and no kernel, barrier or intermediate buffer.

What merges (after ``passes.fuse``, whose ``Fused``/``FusedRow`` eqns it takes whole):

- **prologue**: the producer of a Linear's ``a`` (or an F32 ``MatMul``'s: it becomes a
  Linear), a ``Fused``, a ``FusedRow`` over the last axis (op Sum) or one elementwise eqn,
  when ``a`` is not observable and every eqn reading it is a Linear reading it as ``a``
  only, each a GEMV (at most ``GEMV_MAX_ROWS`` rows: its workgroups read whole rows of K, so
  each recomputes a row's reduction itself, a K-float read from cache). Each reader gets its
  own copy of the computation (q/k and v, gate and up share one RMSNorm: recomputed twice,
  never stored).
- **epilogue**: the one eqn reading a Linear's output, when that output is not observable
  and the eqn is elementwise (an elementwise prim or a ``Fused``) with the output's shape
  and a float dtype the kernel stores: any matmul kind (a split-K launch runs it in its
  combine, on the final sum). The merged eqn takes the consumer's place, so the consumer's
  other operands are defined; the Linear moves down to it, which is refused when an eqn in
  between overwrites a state the Linear reads.

A merged prologue moves from its producer's position to the Linear's, refused likewise when
an eqn in between overwrites a state it reads (``passes.fuse``'s rule); every merged eqn
stays within ``fuse.MAX_OPERANDS`` buffers read and ``fuse.MAX_NODES`` nodes. A chain the
pass cannot prove keeps its kernels. The oracle evaluates a fused Linear as the chain it
replaced, bit for bit (``oracle.linear``).
"""

from __future__ import annotations

from ..ir import F32, Eqn, Graph, Literal, Params, ReduceOp, Var
from ..ir.fused import ELEMENTWISE, FUSED, FUSED_ROW, FusedBody, Leaf, Node
from ..ir.linear_form import (
    GEMV_MAX_ROWS,
    OUT_DTYPES,
    LinearForm,
    LinearPrologue,
    matmul_rows,
    split_operands,
)
from ..ir.prims import LINEAR, MATMUL
from .canonicalize import dead_code_elimination
from .fuse import MAX_NODES, MAX_OPERANDS


def single_body(e: Eqn) -> tuple[FusedBody, tuple[Var, ...]]:
    """One elementwise eqn as a body and the operands its leaves read (a value read twice
    is one leaf; a literal is a literal node)."""
    nodes: list[Node] = []
    ops: list[Var] = []
    args: list[int] = []
    leaf: dict[Var, int] = {}  # an operand -> its leaf node
    for v in e.inputs:
        if isinstance(v, Literal):
            nodes.append(Node.literal(v.value, v.dtype))
            args.append(len(nodes) - 1)
            continue
        if v not in leaf:
            leaf[v] = len(nodes)
            nodes.append(Node.operand(len(ops), v.shape, v.dtype))
            ops.append(v)
        args.append(leaf[v])
    nodes.append(Node(e.prim, tuple(args), e.params, e.out.shape, e.out.dtype))
    return FusedBody(tuple(nodes)), tuple(ops)


def as_linear(e: Eqn) -> Eqn | None:
    """``e`` as a Linear: itself, or an F32 ``MatMul`` as the Linear of an F32 weight read
    as stored (the same matmul: ``oracle.linear`` computes it by the MatMul rule); None for
    anything else (a 16-bit MatMul stores 16 bits: not a Linear)."""
    if e.prim is LINEAR:
        return e
    if e.prim is MATMUL and all(v.dtype is F32 for v in e.inputs):
        return Eqn(LINEAR, e.inputs, e.outputs, Params(form=LinearForm(False, F32)))
    return None


def _as_body(e: Eqn) -> tuple[FusedBody, tuple[Var, ...]]:
    """An elementwise or ``Fused`` eqn as (body, the operands its leaves index)."""
    if e.prim is FUSED:
        return e.params["body"], e.inputs
    return single_body(e)


#: The leaves this pass knows how to renumber and the matmul kernels how to read; a body
#: with any other kind of leaf stays its own kernel
KNOWN_LEAVES = (Leaf.OPERAND, Leaf.LITERAL, Leaf.REDUCED)


def _plain(*bodies: FusedBody) -> bool:
    return all(n.op in KNOWN_LEAVES or not isinstance(n.op, Leaf)
               for b in bodies for n in b.nodes)


def _prologue_of(e: Eqn) -> tuple[LinearPrologue, tuple[Var, ...]] | None:
    """The prologue computing ``e``'s value, and its operands; None where none can."""
    if e.prim in (FUSED, FUSED_ROW) and not _plain(
            *(v for k, v in e.params.items() if k in ("body", "epilogue"))):
        return None
    if e.prim is FUSED_ROW:
        body = e.params["body"]
        if e.params["op"] is not ReduceOp.SUM or e.params["axis"] != len(body.out.shape) - 1:
            return None
        return LinearPrologue(body, ReduceOp.SUM, e.params["epilogue"]), e.inputs
    if e.prim is FUSED or e.prim in ELEMENTWISE:
        body, ops = _as_body(e)
        return LinearPrologue(body), ops
    return None


def _nodes(form: LinearForm) -> int:
    pro = form.prologue
    n = 0 if pro is None else len(pro.body.nodes) + (len(pro.row.nodes) if pro.row else 0)
    return n + (len(form.epilogue.nodes) if form.epilogue is not None else 0)


def _fits(form: LinearForm, inputs: tuple[Var, ...]) -> bool:
    return len(inputs) <= MAX_OPERANDS and _nodes(form) <= MAX_NODES


def _state_overwrites(g: Graph) -> dict[Var, Var]:
    """A state output -> the slot value it overwrites in place."""
    return {v: g.slot(name).var for name, v in g.states.items()}


def _overwritten_between(eqns: list[Eqn | None], i: int, j: int, reads: set[Var],
                         overwrites: dict[Var, Var]) -> bool:
    """Whether an eqn strictly between positions i and j overwrites a state in ``reads``."""
    return any(overwrites.get(o) in reads for e in eqns[i + 1:j] if e is not None
               for o in e.outputs)


def _fuse_prologues(g: Graph) -> list[Eqn | None]:
    info = g.use_info()
    overwrites = _state_overwrites(g)
    eqns: list[Eqn | None] = list(g.eqns)
    for ip, p in enumerate(g.eqns):
        if len(p.outputs) != 1 or p.out in info.observed:
            continue
        made = _prologue_of(p)
        users = sorted(set(info.users.get(p.out, ())))
        if made is None or not users:
            continue
        pro, pro_ops = made
        new: dict[int, Eqn] = {}
        for iu in users:
            u = eqns[iu]
            assert u is not None
            u = as_linear(u)
            if u is None or u.params["form"].prologue is not None:
                break
            form: LinearForm = u.params["form"]
            (a,), w, extras = split_operands(form, u.inputs)
            if (a is not p.out or p.out is w or p.out in extras
                    or matmul_rows(p.out.shape, w.shape) > GEMV_MAX_ROWS
                    or _overwritten_between(eqns, ip, iu, set(pro_ops), overwrites)):
                break
            nf = LinearForm(form.transpose_b, form.b_dtype, pro, form.epilogue)
            inputs = (*pro_ops, w, *extras)
            if not _fits(nf, inputs):
                break
            new[iu] = Eqn(LINEAR, inputs, u.outputs, Params(form=nf))
        else:
            for iu, e in new.items():
                eqns[iu] = e
            eqns[ip] = None
    return eqns


def _epilogue_of(c: Eqn, y: Var) -> tuple[FusedBody, tuple[Var, ...]] | None:
    """Consumer ``c`` of a matmul value ``y`` as an epilogue body (``y`` read through its
    ``REDUCED`` leaf, every other operand renumbered from 0) and its operands."""
    if not (c.prim is FUSED or c.prim in ELEMENTWISE) or len(c.outputs) != 1:
        return None
    if c.out.shape != y.shape or c.out.dtype not in OUT_DTYPES:
        return None
    body, ops = _as_body(c)
    if not _plain(body) or body.moves:  # the sum is read at the output index only
        return None
    extras = tuple(v for v in ops if v is not y)
    nodes = []
    for n in body.nodes:
        if n.op is Leaf.OPERAND:
            v = ops[n.params["index"]]
            n = (Node.reduced(n.shape, n.dtype) if v is y
                 else Node.operand(extras.index(v), n.shape, n.dtype))
        nodes.append(n)
    return FusedBody(tuple(nodes)), extras


def _fuse_epilogues(g: Graph, eqns: list[Eqn | None]) -> list[Eqn | None]:
    live = g.replace([e for e in eqns if e is not None])
    info = live.use_info()
    overwrites = _state_overwrites(g)
    out: list[Eqn | None] = list(live.eqns)
    for il, e in enumerate(live.eqns):
        lin = as_linear(e)
        if lin is None or lin.params["form"].epilogue is not None:
            continue
        users = set(info.users.get(lin.out, ()))
        if len(users) != 1 or lin.out in info.observed:
            continue
        ic = users.pop()
        c = out[ic]
        assert c is not None
        made = _epilogue_of(c, lin.out)
        if made is None or _overwritten_between(out, il, ic, set(lin.inputs), overwrites):
            continue
        epi, extras = made
        form: LinearForm = lin.params["form"]
        nf = LinearForm(form.transpose_b, form.b_dtype, form.prologue, epi)
        inputs = (*lin.inputs, *extras)
        if not _fits(nf, inputs):
            continue
        out[ic] = Eqn(LINEAR, inputs, c.outputs, Params(form=nf))
        out[il] = None
    return out


def linear_fuse(g: Graph, *, prologues: bool = True) -> Graph:
    """Give Linears their prologues (unless ``prologues`` is False), then their epilogues
    (see the module doc)."""
    eqns = _fuse_prologues(g) if prologues else list(g.eqns)
    eqns = _fuse_epilogues(g, eqns)
    return dead_code_elimination(g.replace([e for e in eqns if e is not None]))
