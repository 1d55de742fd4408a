"""The public numpy-in, numpy-out entry points."""

from __future__ import annotations

import numpy as np

from .errors import BindError
from .ir import check_attention
from .ops import trace_attention
from .runtime import cached_replay, resolve_device
from .vk import Device, PhysicalDeviceInfo, physical_devices


def _as_f32(name: str, x: object) -> np.ndarray:
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating):
        raise BindError(name, "a floating-point array", a.dtype.name, "dtype")
    if a.ndim != 4:
        raise BindError(name, "rank 4 [B, H, L, D]", a.shape, "shape")
    return np.ascontiguousarray(a, dtype=np.float32)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    device: Device | int | str | None = None,
) -> np.ndarray:
    """softmax(softcap(q k^T * scale) + mask) v on a Vulkan device, through the whole pipeline.

    q [B,Hq,Lq,Dk], k [B,Hkv,Lk,Dk], v [B,Hkv,Lk,Dv] (Hq a multiple of Hkv: GQA/MQA),
    mask additive [B|1, 1|Hq, Lq|1, Lk] (ALiBi is just a per-head mask), scale defaults to
    1/sqrt(Dk), softcap is cap * tanh(s / cap). Computes in F32 and returns F32 [B,Hq,Lq,Dv].
    """
    q, k, v = _as_f32("q", q), _as_f32("k", k), _as_f32("v", v)
    values = {"q": q, "k": k, "v": v}
    if mask is not None:
        values["mask"] = _as_f32("mask", mask)
    check_attention(
        q.shape, k.shape, v.shape, None if mask is None else values["mask"].shape,
        softcap=softcap,
    )
    shapes = (q.shape, k.shape, v.shape, None if mask is None else values["mask"].shape)
    rp = cached_replay(
        ("attention", *shapes, scale, softcap),
        lambda: trace_attention(*shapes, scale=scale, softcap=softcap),
        resolve_device(device),
    )
    return rp.step(values)["out"]


def devices() -> list[PhysicalDeviceInfo]:
    """Every Vulkan device on this machine, with its queried profile."""
    return physical_devices()
