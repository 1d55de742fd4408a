"""Plan rules: one per primitive (and per fused eqn), in one table keyed by ``Prim``.

A rule turns one eqn into the kernels it runs and the scratch it declares. Each kernel call
lists its operands in the order of its request's ``bindings()``: a ``Var`` of the graph or
a ``Scratch`` the rule declared. Locations are not known yet (the arena is coloured over the
kernel schedule the rules produce), so rules only name operands.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import UnsupportedPrimitive
from ..ir import (
    F32,
    U32,
    DType,
    Eqn,
    Literal,
    Params,
    Prim,
    ReduceOp,
    RuleTable,
    Var,
    attention_operands,
)
from ..ir import prims as P
from ..ir.linear_form import split_operands
from .bindings import Scratch
from .decode_schedule import DecodeCombineRequest, DecodeRequest
from .matmul_schedule import MatMulCombineRequest, MatMulRequest, choose_matmul, combine_request
from .profile import DeviceProfile
from .requests import (
    AttentionRequest,
    FusedReduceRequest,
    FusedRequest,
    FusedUpdateRequest,
    GroupRequest,
    LiteralOperand,
    PrimRequest,
    ReduceRequest,
    ScatterRequest,
    fold_grid,
)
from .schedule import attention_schedule
from .topk import TopKRequest

KernelRequest = (
    AttentionRequest | PrimRequest | ReduceRequest | ScatterRequest | DecodeRequest
    | DecodeCombineRequest | MatMulRequest | MatMulCombineRequest | FusedRequest
    | FusedReduceRequest | FusedUpdateRequest | GroupRequest | TopKRequest
)

PRIM_WORKGROUP = 64
#: invocations of a Reduce/ScatterUpdate workgroup at most (fewer on a small problem)
ROW_WORKGROUP = 256
#: outputs a Reduce workgroup takes side by side when the reduced axis is not the last:
#: 32 consecutive 4-byte reads are one 128-byte line
COALESCE = 32


@dataclass(frozen=True)
class KernelCall:
    """One kernel a rule runs: its request, its operands (binding order) and a label."""

    request: KernelRequest
    operands: tuple[Var | Scratch, ...]
    label: str


@dataclass
class RuleResult:
    kernels: list[KernelCall]
    scratch: list[Scratch] = field(default_factory=list)


@dataclass(frozen=True)
class PlanContext:
    """What a rule may ask of the planner: the device, and whether two values already share
    storage (a state output in place over its slot)."""

    profile: DeviceProfile
    same_storage: Callable[[Var, Var], bool]
    #: whether a value is a view of another's bytes (the planner's ``_views``): no kernel
    is_view: Callable[[Var], bool] = lambda v: False


PlanRule = Callable[[Eqn, PlanContext], RuleResult]
plan_rules: RuleTable[Prim, PlanRule] = RuleTable(
    "plan", lambda p, why: UnsupportedPrimitive(str(p), f"{why}: no kernel for this primitive")
)


def prim_request(
    prim: Prim, inputs: tuple[Var, ...], out: Var, params: Params, threads: int,
    profile: DeviceProfile,
) -> PrimRequest:
    """A one-invocation-per-element request (``threads`` invocations)."""
    ins = tuple(
        LiteralOperand(v.value, v.dtype) if isinstance(v, Literal) else (v.shape, v.dtype)
        for v in inputs
    )
    groups = -(-max(threads, 1) // PRIM_WORKGROUP)
    return PrimRequest(
        prim=prim, params=params, inputs=ins, output=(out.shape, out.dtype),
        threads=threads, local_size=PRIM_WORKGROUP, grid=fold_grid(groups, profile.max_grid),
    )


def _bound(req: PrimRequest, inputs: tuple[Var, ...]) -> tuple[Var, ...]:
    return tuple(inputs[j] for j in req.bound_inputs)


@plan_rules.register(
    *P.BINARY, P.UNARY, P.COMPARE, P.SELECT, P.CONVERT, P.IOTA, P.BROADCAST,
    P.TRANSPOSE, P.CONCAT, P.COPY, P.GATHER, P.INDEX_GUARD,
)
def _elementwise(e: Eqn, ctx: PlanContext) -> RuleResult:
    """One invocation per (first) output element; IndexGuard also binds its witness.
    F16/BF16 operands are read 16-bit and computed in F32 (the planner refuses them on a
    device without 16-bit storage)."""
    out = e.outputs[0]
    req = prim_request(e.prim, e.inputs, out, e.params, out.size, ctx.profile)
    return RuleResult([KernelCall(req, (*_bound(req, e.inputs), *e.outputs), str(e.prim))])


@plan_rules.register(P.RESHAPE)
def _reshape(e: Eqn, ctx: PlanContext) -> RuleResult:
    """No kernel: the planner makes a Reshape a view (its output shares its operand's
    bytes). A copy only where the output has a home of its own (a state output, or an
    export whose operand already lives elsewhere) or the operand is a literal."""
    if ctx.same_storage(e.inputs[0], e.out):
        return RuleResult([])
    return _elementwise(e, ctx)


@plan_rules.register(P.SLICE)
def _slice(e: Eqn, ctx: PlanContext) -> RuleResult:
    """No kernel for a contiguous slice the planner made a view (its operand's bytes at an
    offset); a kernel copying the elements otherwise."""
    if ctx.is_view(e.out):
        return RuleResult([])
    return _elementwise(e, ctx)


def copy_first(operand: Var, out: Var, ctx: PlanContext) -> list[KernelCall]:
    """In-place primitives run over their output: the operand is copied there first unless
    the output already shares the operand's storage (a donated state updated in place)."""
    if ctx.same_storage(operand, out):
        return []
    cp = prim_request(P.COPY, (operand,), out, Params(), operand.size, ctx.profile)
    return [KernelCall(cp, (operand, out), "copy")]


def _matmul_call(e: Eqn, ctx: PlanContext, transpose_b: bool) -> RuleResult:
    form = e.params["form"] if e.prim is P.LINEAR else None
    if form is None:
        a_ops, b, extras = (e.inputs[0],), e.inputs[1], ()
    else:
        a_ops, b, extras = split_operands(form, e.inputs)
    pro = form.prologue if form is not None else None
    epi = form.epilogue if form is not None else None
    # A's logical shape: the prologue's value where one computes A
    a_shape = a_ops[0].shape if pro is None else (pro.row or pro.body).out.shape
    req = choose_matmul(a_shape, b.shape, e.out.shape, transpose_b=transpose_b,
                        b_dtype=b.dtype, a_dtype=a_ops[0].dtype if pro is None else F32,
                        out_dtype=e.out.dtype, profile=ctx.profile, prologue=pro,
                        pro_dtypes=tuple(v.dtype for v in a_ops) if pro is not None else (),
                        epilogue=epi, epi_dtypes=tuple(v.dtype for v in extras))
    if req.splits == 1:
        return RuleResult([KernelCall(req, (*a_ops, b, *extras, e.out), str(e.prim))])
    part = Scratch(req.partial_floats, F32, "matmul_partials")
    return RuleResult([KernelCall(req, (*a_ops, b, part), str(e.prim)),
                       KernelCall(combine_request(req, ctx.profile), (part, *extras, e.out),
                                  "combine")],
                      [part])


@plan_rules.register(P.MATMUL)
def _matmul(e: Eqn, ctx: PlanContext) -> RuleResult:
    """GEMV for few rows, tiled GEMM otherwise (plan.matmul_schedule). F16/BF16 operands
    are read 16-bit and computed in F32, the output rounded to 16 bits at its store."""
    return _matmul_call(e, ctx, transpose_b=False)


@plan_rules.register(P.LINEAR)
def _linear(e: Eqn, ctx: PlanContext) -> RuleResult:
    """The folded matmul: B read in its stored layout and dtype (no transpose or convert
    kernel runs)."""
    return _matmul_call(e, ctx, transpose_b=e.params["form"].transpose_b)


@plan_rules.register(P.DYNAMIC_UPDATE_SLICE)
def _dynamic_update_slice(e: Eqn, ctx: PlanContext) -> RuleResult:
    """One invocation per update element, in place over the output."""
    update = e.inputs[1]
    req = prim_request(e.prim, e.inputs, e.out, e.params, update.size, ctx.profile)
    call = KernelCall(req, (*_bound(req, e.inputs), e.out), str(e.prim))
    return RuleResult([*copy_first(e.inputs[0], e.out, ctx), call])


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _row_workgroup(profile: DeviceProfile) -> int:
    """The largest power of two <= ROW_WORKGROUP the device runs in one workgroup."""
    cap = min(ROW_WORKGROUP, profile.max_invocations, profile.max_workgroup_size[0])
    return 1 << (cap.bit_length() - 1)


def reduce_request(
    op: ReduceOp, dtype: DType, outer: int, n: int, inner: int, profile: DeviceProfile,
    out_dtype: DType | None = None,
) -> ReduceRequest:
    """The layout of one reduction pass over [outer, n, inner]: lanes per output up to the
    reduced length (a power of two, at most a workgroup), and the rest of the workgroup on
    neighbouring outputs: at least ``COALESCE`` of them when the reduced axis is not the
    last, so a warp's loads are consecutive; never more outputs than exist."""
    local = _row_workgroup(profile)
    vec = 4 if inner == 1 and n % 4 == 0 else 1  # rows start 16-byte aligned (the arena's)
    cols_min = 1 if inner == 1 else min(_pow2(inner), COALESCE, local)
    lanes = min(_pow2(n // vec), local // cols_min)
    cols = min(local // lanes, _pow2(outer * inner))
    groups = -(-outer * inner // cols)
    return ReduceRequest(
        op=op, dtype=dtype, outer=outer, n=n, inner=inner, cols=cols, lanes=lanes,
        subgroup=profile.subgroup_shuffle, grid=fold_grid(groups, profile.max_grid), vec=vec,
        out_dtype=None if out_dtype in (None, dtype) else out_dtype,
    )


#: a reduction this large (elements) whose outputs fill too few workgroups is split
SPLIT_MIN_ELEMENTS = 1 << 18
#: elements of a row one split workgroup reduces at least
SPLIT_MIN_CHUNK = 2048


def reduce_splits(groups: int, n: int, total: int, profile: DeviceProfile) -> int:
    """Chunks to cut each reduced row into (a divisor of n, so each chunk is a plain row of
    a [outer * splits, n / splits, inner] view): 1 unless the single pass fills fewer than
    two workgroups per compute unit; then the first that does, or the most that keep
    chunks of ``SPLIT_MIN_CHUNK``."""
    target = 2 * (profile.compute_units or 16)
    if groups >= target or total < SPLIT_MIN_ELEMENTS:
        return 1
    best = 1
    for s in range(2, n // SPLIT_MIN_CHUNK + 1):
        if n % s == 0:
            best = s
            if groups * s >= target:
                break
    return best


@plan_rules.register(P.REDUCE)
def _reduce(e: Eqn, ctx: PlanContext) -> RuleResult:
    """One pass; or, for a few long rows, two: chunk partials (in the compute type, F32 for
    16-bit input, declared scratch) then the partials of each row."""
    (x,), axis, op = e.inputs, e.params["axis"], e.params["op"]
    outer, n, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])
    one = reduce_request(op, x.dtype, outer, n, inner, ctx.profile)
    splits = reduce_splits(one.workgroups, n, x.size, ctx.profile)
    if splits == 1:
        return RuleResult([KernelCall(one, (x, e.out), str(e.prim))])
    acc = F32 if x.dtype.is_16bit else x.dtype
    part = Scratch(outer * splits * inner, acc, "partials")
    first = reduce_request(op, x.dtype, outer * splits, n // splits, inner, ctx.profile, acc)
    second = reduce_request(op, acc, outer, splits, inner, ctx.profile, x.dtype)
    return RuleResult([KernelCall(first, (x, part), str(e.prim)),
                       KernelCall(second, (part, e.out), str(e.prim))], [part])


@plan_rules.register(P.SCATTER_UPDATE)
def _scatter_update(e: Eqn, ctx: PlanContext) -> RuleResult:
    """A workgroup per update row, in place over the output (copied there first unless
    the output is the donated operand's own storage)."""
    operand, indices, updates = e.inputs
    row = math.prod(operand.shape[1:])
    lanes = min(_row_workgroup(ctx.profile), max(_pow2(row), 32))
    req = ScatterRequest(
        dtype=operand.dtype, rows=operand.shape[0], row=row, n=indices.shape[0], lanes=lanes,
        grid=fold_grid(indices.shape[0], ctx.profile.max_grid),
    )
    call = KernelCall(req, (indices, updates, e.out), str(e.prim))
    return RuleResult([*copy_first(operand, e.out, ctx), call])


@plan_rules.register(P.ATTENTION)
def _attention(e: Eqn, ctx: PlanContext) -> RuleResult:
    """Grouped split-KV decode where it plans (its split partials are declared scratch,
    coloured with the values; a fused combine's arrival counters are persistent, zeroed
    scratch), else the streaming kernel. A paged key (``KeyLayout.PAGED``) plans the dense
    schedule of its logical shapes; its pools are bound as k and v (in place: no gather)
    and its ``read`` map as one more binding, by role like every operand."""
    req = attention_schedule(e, ctx.profile)
    return attention_calls(req, attention_operands(e.params["form"], e.inputs), e.out,
                           "attention")


def attention_calls(req: AttentionRequest | DecodeRequest, by_role: dict[str, Var], out: Var,
                    label: str) -> RuleResult:
    """The kernels of one attention request over operands named by role (bound in the
    kernel's binding order): one kernel (streaming, grouped unsplit, or grouped with the
    fused combine: its arrival counters persistent zeroed scratch), or the grouped partials
    (declared scratch, coloured with the values) and a combine launch."""
    ins = tuple(by_role[b.name] for b in req.bindings() if b.name in by_role)
    if len(ins) != len(by_role):
        raise RuntimeError(f"{req.describe()} binds {[b.name for b in req.bindings()]}, "
                           f"not every operand of {sorted(by_role)}")
    if isinstance(req, AttentionRequest) or req.splits == 1:
        return RuleResult([KernelCall(req, (*ins, out), label)])
    part = Scratch(req.partial_floats, F32, "partials")
    if req.fused_combine:
        count = Scratch(req.counters, U32, "counters", persistent=True)
        call = KernelCall(req, (*ins, part, count, out), label)
        return RuleResult([call], [part, count])
    return RuleResult([
        KernelCall(req, (*ins, part), label),
        KernelCall(DecodeCombineRequest(req), (part, out), "combine"),
    ], [part])
