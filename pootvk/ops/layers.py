"""Transformer layers as primitive chains: RMSNorm and rotary embeddings (RoPE).

Like ``ops.attention`` these emit only primitives, so every later stage (the oracle, the
passes, the planner) sees a plain graph; ``Builder.rms_norm`` and ``Builder.rope`` call
them. 16-bit operands (weights, tables) are converted to F32 first: the math is F32.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir import F32, I32, ReduceOp, Var
from .builder import Builder


def _f32(b: Builder, x: Var) -> Var:
    return x if x.dtype is F32 else b.convert(x, F32)


def rms_norm(b: Builder, x: Var, weight: Var, eps: float = 1e-6) -> Var:
    """``x * rsqrt(mean(x^2, last axis) + eps) * weight`` (Llama's RMSNorm; weight [D])."""
    d = x.shape[-1]
    if weight.shape != (d,):
        raise ShapeError(f"rms_norm weight {weight.shape} does not match the last axis {d}")
    x = _f32(b, x)
    ss = b.reduce(ReduceOp.SUM, b.mul(x, x), axis=-1, keepdim=True)
    inv = b.rsqrt(b.add(b.mul(ss, 1.0 / d), float(eps)))
    return b.mul(b.mul(x, inv), _f32(b, weight))


def rope_tables(positions: int, head_dim: int, theta: float = 10000.0, *,
                full: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [positions, head_dim // 2] (F32, computed in float64) of HF
    Llama's rotary embedding: angle[p, i] = p * theta ** (-2i / head_dim). With ``full``
    the tables are [positions, head_dim]: cos repeated, sin with its sign folded in
    ([-sin, sin]), for :func:`rope`'s shorter chain."""
    if head_dim % 2:
        raise ShapeError(f"RoPE needs an even head_dim, got {head_dim}")
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    if full:
        cos, sin = np.concatenate([cos, cos], 1), np.concatenate([-sin, sin], 1)
    return cos.astype(np.float32), sin.astype(np.float32)


def rope(b: Builder, x: Var, pos: Var, cos: Var, sin: Var) -> Var:
    """Rotary embedding of x [B, H, L, D] at positions pos .. pos + L - 1 (pos an i32
    scalar), HF Llama's non-interleaved ("neox") convention: the pair rotated together is
    (x[i], x[i + D/2]), i.e. ``x * cos + rotate_half(x) * sin``. cos/sin are tables
    [P, D/2] (:func:`rope_tables`, bound as params) whose rows are gathered at the
    positions; a position outside the table reads its last row (Gather clamps), so bound
    the position slot to the table (``Builder.pos(name, 0, P - L)``).

    Tables [P, D] from ``rope_tables(..., full=True)`` (cos repeated, sin signed) give the
    same rotation in fewer kernels: ``x * cos + concat(hi, lo) * sin`` (two slices, a
    concat, two products and a sum, instead of nine kernels); both tables must be of one
    width.

    GGUF files store Llama's q/k weights permuted for the interleaved (adjacent-pair)
    convention; weights from there must be un-permuted before this rotation applies.
    """
    if x.ndim != 4 or x.shape[3] % 2:
        raise ShapeError(f"rope takes x [B, H, L, D] with even D, got {x.shape}")
    _, _, length, d = x.shape
    half = d // 2
    width = cos.shape[1] if cos.ndim == 2 and cos.shape[1] in (half, d) else half
    for name, t in (("cos", cos), ("sin", sin)):
        if t.ndim != 2 or t.shape[1] != width:
            raise ShapeError(f"rope {name} table {t.shape} is not [positions, {half}] "
                             f"(or [positions, {d}] for both)")
    if pos.shape != () or pos.dtype is not I32:
        raise ShapeError(f"rope position must be an i32 scalar, got {pos.aval()}")
    rows = pos if length == 1 else b.add(b.iota((length,), axis=0), pos)
    c = b.reshape(_f32(b, b.gather(cos, rows)), (1, 1, length, width))
    s = b.reshape(_f32(b, b.gather(sin, rows)), (1, 1, length, width))
    x = _f32(b, x)
    lo = b.slice(x, (0, 0, 0, 0), (x.shape[0], x.shape[1], length, half))
    hi = b.slice(x, (0, 0, 0, half), x.shape)
    if width == d:  # folded tables: x * [cos, cos] + [hi, lo] * [-sin, sin]
        return b.add(b.mul(x, c), b.mul(b.concat([hi, lo], axis=3), s))
    return b.concat([b.sub(b.mul(lo, c), b.mul(hi, s)), b.add(b.mul(hi, c), b.mul(lo, s))],
                    axis=3)
