"""The plan rule of SelectedAttention (``ir.sparse_form``): block-sparse attention as a
live-length attention over a logical key range read through a block table.

Under the kernel contract (the compiler forms the op only from BlockTopK's ids, and the
positions are proven inside the keys) a row's visible keys are exactly the logical keys
``i < n * bs + p - own * bs + 1`` of its ``n`` valid selected blocks followed by its own
block ``own = p // bs``, logical key ``i`` being physical key ``blk[i / bs] * bs + i % bs``.
Both kernels build that table in workgroup memory in their prologue and then run their live
length path over it, so no key a row does not see is ever read; any other input stays in
bounds (p clamped into [0, Lk - 1], ids outside [0, own) ignored).

Schedules, as for Attention (``plan.schedule``): the grouped split-KV decode kernel where it
plans (one workgroup serves the ``n_rep`` query heads of a KV group, so the selected blocks
are read once per group; with Lq > 1 one query row a workgroup, each row having its own
table), its split count chosen for the logical length ``(K + 1) * bs``, not Lk; else the
streaming kernel (one workgroup per (b, h, row), F32 K/V only). The tensor-core kernel
serves a selected decode (Lq == 1) where it would serve the dense one (wide groups, F16).
``forced_schedule`` forces either, like the Attention rule's.
"""

from __future__ import annotations

from ..errors import AttentionLds, DtypeLowering
from ..ir import F32, Eqn
from ..ir import prims as P
from ..ir.sparse_form import SelectedForm
from .decode_schedule import DecodeProblem, DecodeRequest
from .profile import DeviceProfile
from .requests import AttentionRequest, fold_grid
from .rules import PlanContext, RuleResult, attention_calls, plan_rules
from .schedule import choose_lanes, grouped_or_streaming


def selected_problem(e: Eqn) -> DecodeProblem:
    """The eqn's shapes, score transform and selection as a decode problem (selected mode:
    ``select_block`` = bs, ``select_k`` = K, ``select_heads`` = Hs)."""
    form: SelectedForm = e.params["form"]
    q, k, v, ids, _qpos = e.inputs[:5]
    b, hq, lq, dk = q.shape
    return DecodeProblem(
        b=b, hq=hq, hkv=k.shape[1], lq=lq, lk=k.shape[2], dk=dk, dv=v.shape[3],
        scale=float(form.scale), softcap=None if form.softcap is None else float(form.softcap),
        kv_dtype=form.kv_dtype.value, select_block=form.block_size, select_k=ids.shape[3],
        select_heads=ids.shape[1], dk_shared=form.shared_width,
    )


def selected_streaming(e: Eqn, profile: DeviceProfile) -> AttentionRequest:
    """The streaming kernel in selected mode: one workgroup per (b, h, row), its lanes
    walking the row's logical keys. F32 K/V only (as the Attention streaming kernel)."""
    p = selected_problem(e)
    if p.kv_dtype != F32.value:
        raise DtypeLowering("SelectedAttention (streaming)", p.kv_dtype)
    lanes = choose_lanes(p.dv, profile)

    def request(lanes: int) -> AttentionRequest:
        return AttentionRequest(
            b=p.b, hq=p.hq, hkv=p.hkv, lq=p.lq, lk=p.lk, dk=p.dk, dv=p.dv, scale=p.scale,
            softcap=p.softcap, mask=None, lanes=lanes,
            vec=4 if all(w % 4 == 0 for w in (*p.key_widths, p.dv)) else 1,
            grid=fold_grid(p.b * p.hq * p.lq, profile.max_grid),
            keys_per_step=2 if profile.device_type == "cpu" else 4,
            select_block=p.select_block, select_k=p.select_k, select_heads=p.select_heads,
            dk_shared=p.dk_shared,
        )

    r = request(lanes)
    while r.shared_bytes > profile.max_workgroup_memory:  # the block table must fit too
        if r.lanes == 1:
            raise AttentionLds(p.dv, r.shared_bytes, profile.max_workgroup_memory)
        r = request(r.lanes // 2)
    return r


def selected_schedule(e: Eqn, profile: DeviceProfile) -> AttentionRequest | DecodeRequest:
    """The request for one SelectedAttention eqn: the grouped decode kernel where it plans,
    the streaming kernel otherwise (or when forced); 16-bit K/V have only the grouped
    kernel, so its refusal is raised."""
    return grouped_or_streaming(lambda: selected_problem(e),
                                lambda: selected_streaming(e, profile), profile,
                                e.params["form"].kv_dtype is F32)


@plan_rules.register(P.SELECTED_ATTENTION)
def _selected_attention(e: Eqn, ctx: PlanContext) -> RuleResult:
    """One kernel (grouped unsplit, grouped with the fused combine, or streaming), or the
    grouped partials and a combine launch; split partials are declared scratch, a fused
    combine's arrival counters persistent zeroed scratch (as the Attention rule's).
    Operands are bound by role name (``SelectedForm.roles``)."""
    req = selected_schedule(e, ctx.profile)
    roles = e.params["form"].roles
    return attention_calls(req, dict(zip(roles, e.inputs, strict=True)), e.out,
                           "selected_attention")
