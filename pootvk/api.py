"""The public numpy-in, numpy-out entry points."""

from __future__ import annotations

import numpy as np

from .errors import BindError, ShapeError
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
    b, hq, lq, dk = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ShapeError(f"batch differs: q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape[3] != dk:
        raise ShapeError(f"key width {k.shape[3]} != query width {dk}")
    if v.shape[1:3] != k.shape[1:3]:
        raise ShapeError(f"v {v.shape} and k {k.shape} differ in heads or length")
    if k.shape[1] == 0 or hq % k.shape[1]:
        raise ShapeError(f"query heads {hq} not a multiple of key/value heads {k.shape[1]}")
    if min(q.shape + k.shape + v.shape) == 0:
        raise ShapeError(f"empty operand: q {q.shape}, k {k.shape}, v {v.shape}")
    values = {"q": q, "k": k, "v": v}
    if mask is not None:
        m = _as_f32("mask", mask)
        mb, mh, mq, mk = m.shape
        if mb not in (1, b) or mh not in (1, hq) or mq not in (1, lq) or mk != k.shape[2]:
            raise ShapeError(
                f"mask {m.shape} does not fit [{b}|1, {hq}|1, {lq}|1, {k.shape[2]}]"
            )
        values["mask"] = m
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
