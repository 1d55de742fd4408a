"""The public numpy-in, numpy-out entry points."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .errors import BindError, InvalidArgument
from .ir import BF16, F16, F32, DType, check_attention
from .ir.dtypes import is_float_array, storage_values
from .ops import trace_attention, trace_block_sparse
from .plan import current_forced
from .runtime import held_replay, resolve_device
from .vk import Device, PhysicalDeviceInfo, physical_devices


def _as_float(name: str, x: object) -> np.ndarray:
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged nested lists, odd objects
        raise BindError(name, "an array", f"{type(x).__name__} ({e})", "value") from e
    if not is_float_array(a):
        raise BindError(name, "a floating-point array", a.dtype.name, "dtype")
    if a.ndim != 4:
        raise BindError(name, "rank 4 [B, H, L, D]", a.shape, "shape")
    return np.ascontiguousarray(a)


def _as_f32(name: str, x: object) -> np.ndarray:
    return storage_values(_as_float(name, x), F32)


def _kv_dtype(k: np.ndarray, v: np.ndarray, k_shared: np.ndarray | None = None) -> DType:
    """K/V storage: float16 and bfloat16 stay 16-bit on the device; other floats are F32.
    k, v (and a split key's k_shared) share one storage dtype."""
    kinds = {np.dtype(np.float16): F16, "bfloat16": BF16}

    def kind(a: np.ndarray) -> DType:
        return kinds.get(a.dtype, kinds.get(a.dtype.name, F32))

    dk = kind(k)
    for name, other in (("v", v), ("k_shared", k_shared)):
        if other is not None and kind(other) is not dk:
            raise BindError(name, f"the dtype of k ({k.dtype.name})", other.dtype.name, "dtype")
    return dk


def _lengths(x: object, batch: int) -> np.ndarray:
    """An int array [B] as I32 (its range is the device guard's to check)."""
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise BindError("lengths", "an integer array", a.dtype.name, "dtype")
    if a.shape != (batch,):
        raise BindError("lengths", (batch,), a.shape, "shape")
    if a.size and (a.min() < -(2**31) or a.max() > 2**31 - 1):
        raise BindError("lengths", "int32 values", int(a.max()), "value")
    return a.astype(np.int32)


def _operands(q: object, k: object, v: object, k_shared: object
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, DType]:
    """q as F32; k, v (and a split key's k_shared) in their storage dtype (16-bit kept,
    other floats F32), and that dtype."""
    q, k, v = _as_f32("q", q), _as_float("k", k), _as_float("v", v)
    ks = None if k_shared is None else _as_float("k_shared", k_shared)
    kv = _kv_dtype(k, v, ks)
    if kv is F32:
        k, v = storage_values(k, F32), storage_values(v, F32)
        ks = None if ks is None else storage_values(ks, F32)
    return q, k, v, ks, kv


def _real(name: str, x: object) -> float | None:
    """None, or a finite real number as a Python float (np.float32 and ints welcome)."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(float(x)):
        raise InvalidArgument(name, "None or a finite real number", x)
    return float(x)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    device: Device | int | str | None = None,
    lengths: np.ndarray | None = None,
    k_shared: np.ndarray | None = None,
    *,
    block_size: int | None = None,
    top_k: int | None = None,
    block_scores: np.ndarray | None = None,
    positions: np.ndarray | None = None,
) -> np.ndarray:
    """softmax(softcap(q k^T * scale) + mask) v on a Vulkan device, through the whole pipeline.

    q [B,Hq,Lq,Dk], k [B,Hkv,Lk,Dk], v [B,Hkv,Lk,Dv] (Hq a multiple of Hkv: GQA/MQA),
    mask additive [B|1, 1|Hq, Lq|1, Lk] (ALiBi is just a per-head mask), scale defaults to
    1/sqrt(Dk), softcap is cap * tanh(s / cap). Computes in F32 and returns F32 [B,Hq,Lq,Dv].

    k and v given as float16 or ``ml_dtypes.bfloat16`` stay 16-bit on the device (half the
    bytes read); a device without 16-bit storage refuses them with ``DtypeLowering``. q may be
    any float dtype (it is small: it is converted to F32).

    ``k_shared`` [B,1,Lk,s] splits the key (multi-head latent attention): head g's key is
    concat(k[:, g], k_shared[:, 0]) on the last axis, so q has width Dk, k width Dk - s, and
    the kernel reads k_shared once per key for every head (the broadcast key is never
    built). It is stored like k (same dtype); scale defaults to 1/sqrt(Dk).

    ``block_size`` and ``top_k`` make it block-sparse (``ir.sparse_form``): the Lk keys are
    blocks of ``block_size`` (Lk a multiple of it); query row (b, l) at position
    ``positions[b, l]`` (ints [B, Lq] in [0, Lk - 1], else SlotRangeError; by default the
    last Lq positions of ``lengths[b]`` or of Lk: ``len - Lq + l``) attends to the ``top_k``
    complete blocks of highest score and its own block up to its position,
    ``(top_k + 1) * block_size`` keys instead of Lk. ``block_scores``
    [B, 1|Hkv, Lq, Lk / block_size] are the caller's (one selection per batch row, or per KV
    group); without them each block is scored by its mean key against the sum of its
    group's queries. It takes no mask; a split key
    (``k_shared``) is read at each selected key like the dense one.
    """
    scale, softcap = _real("scale", scale), _real("softcap", softcap)
    dev = resolve_device(device)  # a bad device= is refused before any work
    if block_size is not None or top_k is not None:
        return _block_sparse(q, k, v, mask, scale, softcap, dev, lengths, k_shared,
                             block_size, top_k, block_scores, positions)
    for name, x in (("block_scores", block_scores), ("positions", positions)):
        if x is not None:
            raise InvalidArgument(name, "None unless block_size and top_k are given", "an array")
    q, k, v, ks, kv = _operands(q, k, v, k_shared)
    values = {"q": q, "k": k, "v": v}
    if mask is not None:
        values["mask"] = _as_f32("mask", mask)
    if ks is not None:
        values["k_shared"] = ks
    ks_shape = None if ks is None else ks.shape
    check_attention(
        q.shape, k.shape, v.shape, None if mask is None else values["mask"].shape,
        softcap=softcap, k_shared=ks_shape,
    )
    if lengths is not None:
        values["lengths"] = _lengths(lengths, q.shape[0])
    shapes = (q.shape, k.shape, v.shape, None if mask is None else values["mask"].shape)
    live = lengths is not None
    with held_replay(  # held: another thread's eviction cannot free it mid-step
        ("attention", *shapes, ks_shape, scale, softcap, kv, live, current_forced()),
        lambda: trace_attention(*shapes, scale=scale, softcap=softcap, kv_dtype=kv,
                                lengths=live, k_shared_shape=ks_shape),
        dev,
    ) as rp:
        return rp.step(values)["out"]


def _count(name: str, x: object) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1:
        raise InvalidArgument(name, "an int >= 1", x)
    return int(x)


def _block_sparse(q: object, k: object, v: object, mask: object, scale: float | None,
                  softcap: float | None, dev: Device, lengths: object, k_shared: object,
                  block_size: object, top_k: object, block_scores: object,
                  positions: object) -> np.ndarray:
    """``attention``'s block-sparse form (its docstring); the positions are checked at bind
    against their declared range (``SlotRangeError`` naming ``positions``)."""
    if mask is not None:
        raise InvalidArgument("mask", "None with block_size/top_k (block-sparse attention "
                              "takes no mask)", "an array")
    bs, top = _count("block_size", block_size), _count("top_k", top_k)
    q, k, v, ks, kv = _operands(q, k, v, k_shared)
    ks_shape = None if ks is None else ks.shape
    check_attention(q.shape, k.shape, v.shape, softcap=softcap, k_shared=ks_shape)
    b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
    if lk % bs:
        raise InvalidArgument("block_size", f"a divisor of the key length Lk={lk}", bs)
    values = {"q": q, "k": k, "v": v}
    if ks is not None:
        values["k_shared"] = ks
    if positions is not None and lengths is not None:
        raise InvalidArgument("lengths", "None when positions are given (the positions say "
                              "which keys each row sees)", "an array")
    if positions is None:
        ends = np.full(b, lk, np.int64) if lengths is None else _lengths(lengths, b)
        positions = ends[:, None] - lq + np.arange(lq)[None, :]
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu" or pos.shape != (b, lq):
        raise BindError("positions", f"an integer array of shape {(b, lq)}",
                        f"{pos.dtype.name}{list(pos.shape)}", "shape")
    values["positions"] = np.clip(pos, -(2**31), 2**31 - 1).astype(np.int32)
    sshape = None
    if block_scores is not None:
        sc = np.ascontiguousarray(np.asarray(block_scores, np.float32))
        want = (b, "1|" + str(k.shape[1]), lq, lk // bs)
        if sc.ndim != 4 or sc.shape[0] != b or sc.shape[1] not in (1, k.shape[1]) or \
                sc.shape[2:] != (lq, lk // bs):
            raise BindError("block_scores", f"shape {want}", sc.shape, "shape")
        values["block_scores"] = sc
        sshape = sc.shape
    shapes = (q.shape, k.shape, v.shape)
    with held_replay(
        ("attention_block_sparse", *shapes, ks_shape, sshape, bs, top, scale, softcap, kv,
         current_forced()),
        lambda: trace_block_sparse(*shapes, block_size=bs, top_k=top, scores_shape=sshape,
                                   scale=scale, softcap=softcap, kv_dtype=kv,
                                   k_shared_shape=ks_shape),
        dev,
    ) as rp:
        return rp.step(values)["out"]


def devices() -> list[PhysicalDeviceInfo]:
    """Every Vulkan device on this machine, with its queried profile."""
    return physical_devices()
