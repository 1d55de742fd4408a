"""Plan rules of the fused elementwise primitives (``ir.fused``): one kernel per eqn.

``Fused``: one invocation per output element, like an ordinary elementwise primitive.
``FusedUpdate``: one invocation per update element, writing into the state in place (the
state copied to the output first when they do not share storage, as DynamicUpdateSlice).
``FusedReduce``: one workgroup per output element; its lane count is the reduced length
rounded up to a power of two, at most ``REDUCE_LANES`` (and the device's workgroup limit),
so a short axis does not leave most lanes idle and a long one is folded ``n / lanes``
elements per lane before the lanes combine (subgroup shuffles where the profile has them,
then a shared-memory tree).
"""

from __future__ import annotations

import math

from ..ir import Eqn, Literal
from ..ir.fused import FUSED, FUSED_REDUCE, FUSED_ROW, FUSED_UPDATE, update_parts
from .requests import (
    FusedReduceRequest,
    FusedRequest,
    FusedUpdateRequest,
    LiteralOperand,
    fold_grid,
)
from .rules import PRIM_WORKGROUP, KernelCall, PlanContext, RuleResult, copy_first, plan_rules

REDUCE_LANES = 256


@plan_rules.register(FUSED)
def _fused(e: Eqn, ctx: PlanContext) -> RuleResult:
    n = e.out.size
    req = FusedRequest(
        body=e.params["body"], inputs=tuple((v.shape, v.dtype) for v in e.inputs),
        output=(e.out.shape, e.out.dtype), threads=n, local_size=PRIM_WORKGROUP,
        grid=fold_grid(-(-max(n, 1) // PRIM_WORKGROUP), ctx.profile.max_grid),
    )
    return RuleResult([KernelCall(req, (*e.inputs, e.out), "fused")])


@plan_rules.register(FUSED_UPDATE)
def _fused_update(e: Eqn, ctx: PlanContext) -> RuleResult:
    state, ops, starts, gates = update_parts(e.prim, e.inputs, e.params)
    n = math.prod(e.params["body"].out.shape)
    req = FusedUpdateRequest(
        body=e.params["body"], inputs=tuple((v.shape, v.dtype) for v in ops),
        state=(e.out.shape, e.out.dtype),
        starts=tuple(LiteralOperand(v.value, v.dtype) if isinstance(v, Literal)
                     else (v.shape, v.dtype) for v in starts),
        gates=len(gates), threads=n, local_size=PRIM_WORKGROUP,
        grid=fold_grid(-(-max(n, 1) // PRIM_WORKGROUP), ctx.profile.max_grid),
    )
    bound = (*ops, *(v for v in starts if not isinstance(v, Literal)), *gates, e.out)
    return RuleResult([*copy_first(state, e.out, ctx), KernelCall(req, bound, "fused update")])


def reduce_lanes(length: int, max_invocations: int) -> int:
    """A power of two covering ``length``, at most ``REDUCE_LANES`` and the device limit."""
    cap = min(REDUCE_LANES, max_invocations)
    lanes = 1
    while lanes < length and lanes * 2 <= cap:
        lanes *= 2
    return lanes


@plan_rules.register(FUSED_REDUCE, FUSED_ROW)
def _fused_reduce(e: Eqn, ctx: PlanContext) -> RuleResult:
    """A workgroup per reduced row (``FusedRow``: which also writes the row's epilogue)."""
    body, axis = e.params["body"], e.params["axis"]
    row = e.prim is FUSED_ROW
    req = FusedReduceRequest(
        body=body, op=e.params["op"], axis=axis, keepdim=True if row else e.params["keepdim"],
        inputs=tuple((v.shape, v.dtype) for v in e.inputs), output=(e.out.shape, e.out.dtype),
        lanes=reduce_lanes(body.out.shape[axis], ctx.profile.max_invocations),
        grid=fold_grid(max(math.prod(body.out.shape) // max(body.out.shape[axis], 1), 1),
                       ctx.profile.max_grid),
        epilogue=e.params["epilogue"] if row else None, subgroup=ctx.profile.subgroup_shuffle,
    )
    return RuleResult([KernelCall(req, (*e.inputs, e.out), "fused row" if row else
                                  "fused reduce")])
