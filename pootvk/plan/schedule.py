"""Schedule choice: how many lanes a streaming attention workgroup gets on a device."""

from __future__ import annotations

from ..errors import AttentionLds, DtypeLowering
from ..ir import F32, Eqn
from .profile import DeviceProfile
from .requests import AttentionRequest, fold_grid, tile_bytes

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


def choose_tile(lanes: int, dk: int, dv: int, profile: DeviceProfile) -> int:
    """Keys staged per tile in the cooperative form: the widest power of two <= lanes whose
    K/V rows fit beside the lanes' state; 0 (each lane loads its own keys) when the widths
    are not vec4-aligned or not even one key fits."""
    if dk % 4 or dv % 4:
        return 0
    state = lanes * (dv + 2) * 4
    tile = lanes
    while tile >= 1:
        if state + tile_bytes(tile, dk, dv, lanes) <= profile.max_workgroup_memory:
            return tile
        tile //= 2
    return 0


def attention_request(
    e: Eqn, profile: DeviceProfile, cooperative: bool | None = None
) -> AttentionRequest:
    """The request for one Attention eqn.

    ``cooperative`` None picks by device: the cooperative form (keys staged through
    workgroup memory with coalesced loads, every thread working on every key) on GPUs;
    the per-lane form on CPU drivers, where a barrier costs more than a strided load.
    """
    q, k, v, *rest = e.inputs
    if q.dtype is not F32:
        raise DtypeLowering("Attention", q.dtype.value)
    b, hq, lq, dk = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    lanes = choose_lanes(dv, profile)
    mask = tuple(rest[0].shape[:3]) if rest else None
    vec = 4 if dk % 4 == 0 and dv % 4 == 0 else 1
    softcap = e.params["softcap"]
    if cooperative is None:
        cooperative = profile.device_type != "cpu"
    tile = choose_tile(lanes, dk, dv, profile) if cooperative else 0
    return AttentionRequest(
        b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv,
        scale=float(e.params["scale"]),
        softcap=None if softcap is None else float(softcap),
        mask=mask, lanes=lanes, vec=vec,
        grid=fold_grid(b * hq * lq, profile.max_grid), tile=tile,
    )
