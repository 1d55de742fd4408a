"""Plan rules: one per primitive (and per fused eqn), in one table keyed by ``Prim``.

A rule turns one eqn into the kernels it runs and the scratch it declares. Each kernel call
lists its operands in the order of its request's ``bindings()``: a ``Var`` of the graph or
a ``Scratch`` the rule declared. Locations are not known yet (the arena is coloured over the
kernel schedule the rules produce), so rules only name operands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import DtypeLowering, UnsupportedPrimitive
from ..ir import (
    BF16,
    F16,
    F32,
    U32,
    Eqn,
    Literal,
    Params,
    Prim,
    RuleTable,
    Var,
    attention_operands,
)
from ..ir import prims as P
from .bindings import Scratch
from .decode_schedule import DecodeCombineRequest, DecodeRequest
from .matmul_schedule import MatMulRequest, choose_matmul
from .profile import DeviceProfile
from .requests import (
    AttentionRequest,
    FusedReduceRequest,
    FusedRequest,
    LiteralOperand,
    PrimRequest,
    fold_grid,
)
from .schedule import attention_schedule

KernelRequest = (
    AttentionRequest | PrimRequest | DecodeRequest | DecodeCombineRequest | MatMulRequest
    | FusedRequest | FusedReduceRequest
)

PRIM_WORKGROUP = 64


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


#: Primitives whose kernels take 16-bit (F16/BF16) operands: pure data movement copies the
#: 16-bit words, Convert converts through F32. Arithmetic on 16-bit values is not lowered.
MOVES_16BIT = (P.RESHAPE, P.BROADCAST, P.TRANSPOSE, P.SLICE, P.CONCAT, P.COPY,
               P.DYNAMIC_UPDATE_SLICE, P.CONVERT, P.GATHER)


def _check_16bit(e: Eqn) -> None:
    if e.prim in MOVES_16BIT:
        return
    for v in (*e.inputs, *e.outputs):
        if v.dtype in (F16, BF16):
            raise DtypeLowering(str(e.prim), v.dtype.value, "a 16-bit arithmetic kernel")


def _bound(req: PrimRequest, inputs: tuple[Var, ...]) -> tuple[Var, ...]:
    return tuple(inputs[j] for j in req.bound_inputs)


@plan_rules.register(
    *P.BINARY, P.UNARY, P.COMPARE, P.SELECT, P.CONVERT, P.IOTA, P.RESHAPE, P.BROADCAST,
    P.TRANSPOSE, P.SLICE, P.CONCAT, P.REDUCE, P.COPY, P.GATHER, P.INDEX_GUARD,
)
def _elementwise(e: Eqn, ctx: PlanContext) -> RuleResult:
    """One invocation per (first) output element; IndexGuard also binds its witness."""
    _check_16bit(e)
    out = e.outputs[0]
    req = prim_request(e.prim, e.inputs, out, e.params, out.size, ctx.profile)
    return RuleResult([KernelCall(req, (*_bound(req, e.inputs), *e.outputs), str(e.prim))])


def _matmul_call(e: Eqn, ctx: PlanContext, transpose_b: bool) -> RuleResult:
    a, b = e.inputs
    req = choose_matmul(a.shape, b.shape, e.out.shape, transpose_b=transpose_b,
                        b_dtype=b.dtype, a_dtype=a.dtype, out_dtype=e.out.dtype,
                        profile=ctx.profile)
    return RuleResult([KernelCall(req, (a, b, e.out), str(e.prim))])


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
    """In place when the output shares the operand's storage (a state update); otherwise
    the operand is copied to the output first."""
    operand, update = e.inputs[0], e.inputs[1]
    calls = []
    if not ctx.same_storage(operand, e.out):
        cp = prim_request(P.COPY, (operand,), e.out, Params(), operand.size, ctx.profile)
        calls.append(KernelCall(cp, (operand, e.out), "copy"))
    req = prim_request(e.prim, e.inputs, e.out, e.params, update.size, ctx.profile)
    calls.append(KernelCall(req, (*_bound(req, e.inputs), e.out), str(e.prim)))
    return RuleResult(calls)


@plan_rules.register(P.ATTENTION)
def _attention(e: Eqn, ctx: PlanContext) -> RuleResult:
    """Grouped split-KV decode where it plans (its split partials are declared scratch,
    coloured with the values; a fused combine's arrival counters are persistent, zeroed
    scratch), else the streaming kernel."""
    req = attention_schedule(e, ctx.profile)
    # the eqn's operands in the kernel's binding order (bound by role name)
    by_role = attention_operands(e.params["form"], e.inputs)
    ins = tuple(by_role[b.name] for b in req.bindings() if b.name in by_role)
    if len(ins) != len(by_role):
        raise RuntimeError(f"{req.describe()} binds {[b.name for b in req.bindings()]}, "
                           f"not every operand of {sorted(by_role)}")
    if isinstance(req, AttentionRequest) or req.splits == 1:
        return RuleResult([KernelCall(req, (*ins, e.out), "attention")])
    part = Scratch(req.partial_floats, F32, "partials")
    if req.fused_combine:
        count = Scratch(req.counters, U32, "counters", persistent=True)
        call = KernelCall(req, (*ins, part, count, e.out), "attention")
        return RuleResult([call], [part, count])
    return RuleResult([
        KernelCall(req, (*ins, part), "attention"),
        KernelCall(DecodeCombineRequest(req), (part, e.out), "combine"),
    ], [part])
