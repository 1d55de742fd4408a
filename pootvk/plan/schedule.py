"""Schedule choice: how many lanes a streaming attention workgroup gets on a device."""

from __future__ import annotations

from ..errors import AttentionLds, DtypeLowering
from ..ir import F32, Eqn
from .profile import DeviceProfile
from .requests import AttentionRequest, fold_grid

MAX_LANES = 64


def choose_lanes(dv: int, profile: DeviceProfile) -> int:
    """Widest power of two <= 64 whose running state, lanes * (dv + 2) floats, fits."""
    per_lane = (dv + 2) * 4
    lanes = MAX_LANES
    while lanes >= 1:
        if lanes * per_lane <= profile.max_workgroup_memory and lanes <= profile.max_invocations:
            return lanes
        lanes //= 2
    raise AttentionLds(dv, per_lane, profile.max_workgroup_memory)


def attention_request(e: Eqn, profile: DeviceProfile) -> AttentionRequest:
    """The request for one Attention eqn: the streaming schedule for ``profile``."""
    q, k, v, *rest = e.inputs
    form = e.params["form"]
    if form.kv_dtype is not F32:
        raise DtypeLowering("Attention", form.kv_dtype.value)
    b, hq, lq, dk = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    lanes = choose_lanes(dv, profile)
    mask = tuple(rest[0].shape[:3]) if rest else None
    vec = 4 if dk % 4 == 0 and dv % 4 == 0 else 1
    softcap = form.softcap
    # Keys a lane takes per loop step. Measured (BENCHMARKS.md): on the H200 four keys in
    # flight per lane beat one by up to 1.3x on large batches; on lavapipe two is best (four
    # spills the 8-wide SIMD registers).
    kps = 2 if profile.device_type == "cpu" else 4
    return AttentionRequest(
        b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv,
        scale=float(form.scale),
        softcap=None if softcap is None else float(softcap),
        mask=mask, lanes=lanes, vec=vec,
        grid=fold_grid(b * hq * lq, profile.max_grid), keys_per_step=kps,
    )
