"""Schedule choice for the Attention eqn: grouped split-KV decode, or streaming lanes.

The grouped schedule (``decode_schedule``) reads every K/V byte once per KV head and splits
the keys over the compute units; it is the default wherever it plans. The streaming
schedule (one workgroup per query row, lanes walking their keys) is the universal fallback:
it needs nothing but ``lanes * (dv + 2)`` floats of workgroup memory. ``forced_schedule``
is the test and measurement hook: it forces the schedule, the split count and schedule
fields for the plans made inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ..errors import AttentionLds, DtypeLowering, ShapeError
from ..ir import F32, Eqn, KeyLayout, attention_operands
from ..ir.attention_form import paged_view_shapes
from .decode_schedule import DecodeProblem, DecodeRequest, choose_decode_schedule
from .profile import DeviceProfile
from .requests import AttentionRequest, fold_grid

MAX_LANES = 64
SCHEDULES = ("grouped", "streaming")


@dataclass(frozen=True)
class ForcedSchedule:
    schedule: str | None = None  # "grouped" | "streaming"; None = the planner's choice
    splits: int | None = None  # grouped: force the split count (chunks may be partial/empty)
    overrides: tuple[tuple[str, object], ...] = ()  # grouped: schedule fields

    def __bool__(self) -> bool:
        return self != ForcedSchedule()


_forced: ContextVar[ForcedSchedule] = ContextVar("pootvk_forced_schedule",
                                                 default=ForcedSchedule())  # noqa: B039 (frozen)


@contextmanager
def forced_schedule(
    schedule: str | None = None, splits: int | None = None, **overrides: object
) -> Iterator[ForcedSchedule]:
    """Plans made inside use this schedule (tests run every schedule on lavapipe this way;
    ``bench`` compares them)."""
    if schedule not in (None, *SCHEDULES):
        raise ValueError(f"schedule {schedule!r} not in {SCHEDULES}")
    f = ForcedSchedule(schedule, splits, tuple(sorted(overrides.items())))
    token = _forced.set(f)
    try:
        yield f
    finally:
        _forced.reset(token)


def current_forced() -> ForcedSchedule:
    return _forced.get()


def choose_lanes(dv: int, profile: DeviceProfile) -> int:
    """Widest power of two <= 64 whose running state, lanes * (dv + 2) floats, fits."""
    per_lane = (dv + 2) * 4
    lanes = MAX_LANES
    while lanes >= 1:
        if lanes * per_lane <= profile.max_workgroup_memory and lanes <= profile.max_invocations:
            return lanes
        lanes //= 2
    raise AttentionLds(dv, per_lane, profile.max_workgroup_memory)


def decode_problem(e: Eqn) -> DecodeProblem:
    """The eqn's shapes and score transform. A paged key (``KeyLayout.PAGED``) is planned
    over its logical [B, Hkv, Lk, D] K/V (``paged_view_shapes``): the schedule is the dense
    one for those shapes, and the problem records the pools' slot count."""
    form = e.params["form"]
    ops = attention_operands(form, e.inputs)
    q, mask = ops["q"], ops.get("mask")
    k_shape, v_shape, slots = ops["k"].shape, ops["v"].shape, 0
    if form.keys is KeyLayout.PAGED:
        slots = k_shape[0]
        k_shape, v_shape = paged_view_shapes(k_shape, v_shape, ops["read"].shape)
    b, hq, lq, dk = q.shape
    return DecodeProblem(
        b=b, hq=hq, hkv=k_shape[1], lq=lq, lk=k_shape[2], dk=dk, dv=v_shape[3],
        scale=float(form.scale), softcap=None if form.softcap is None else float(form.softcap),
        mask=None if mask is None else tuple(mask.shape[:3]), kv_dtype=form.kv_dtype.value,
        live_len=form.live, dk_shared=form.shared_width, pool_slots=slots,
    )


def grouped_or_streaming(
    problem: Callable[[], DecodeProblem], streaming: Callable[[], AttentionRequest],
    profile: DeviceProfile, f32: bool,
) -> AttentionRequest | DecodeRequest:
    """The grouped decode kernel where ``problem()`` plans on ``profile``, else the streaming
    kernel ``streaming()``; ``forced_schedule`` forces either. The streaming kernel reads
    F32 K/V only, so a 16-bit problem the grouped kernel refuses raises that refusal."""
    f = current_forced()
    if f.schedule == "streaming":
        return streaming()
    try:
        return choose_decode_schedule(
            problem(), profile, has_subgroup_shuffle=profile.subgroup_shuffle,
            force_splits=f.splits, overrides=dict(f.overrides) or None,
        )
    except (AttentionLds, ShapeError):
        if f.schedule == "grouped" or not f32:
            raise
        return streaming()


def attention_schedule(e: Eqn, profile: DeviceProfile) -> AttentionRequest | DecodeRequest:
    """The request for one Attention eqn on ``profile``: grouped where it plans, streaming
    otherwise (16-bit K/V have only the grouped kernel: a refusal is then raised)."""
    return grouped_or_streaming(lambda: decode_problem(e), lambda: attention_request(e, profile),
                                profile, e.params["form"].kv_dtype is F32)


def attention_request(e: Eqn, profile: DeviceProfile) -> AttentionRequest:
    """The request for one Attention eqn: the streaming schedule for ``profile``."""
    p = decode_problem(e)  # the shapes and score transform, read from the eqn once
    if p.kv_dtype != F32.value:
        raise DtypeLowering("Attention", p.kv_dtype)
    # Keys a lane takes per loop step. Measured (BENCHMARKS.md): on the H200 four keys in
    # flight per lane beat one by up to 1.3x on large batches; on lavapipe two is best (four
    # spills the 8-wide SIMD registers).
    kps = 2 if profile.device_type == "cpu" else 4
    return AttentionRequest(
        b=p.b, hq=p.hq, hkv=p.hkv, lq=p.lq, lk=p.lk, dk=p.dk, dv=p.dv, scale=p.scale,
        softcap=p.softcap, mask=p.mask, live=p.live_len, lanes=choose_lanes(p.dv, profile),
        vec=4 if all(w % 4 == 0 for w in (*p.key_widths, p.dv)) else 1,
        grid=fold_grid(p.b * p.hq * p.lq, profile.max_grid), keys_per_step=kps,
        dk_shared=p.dk_shared, pool_slots=p.pool_slots,
    )
