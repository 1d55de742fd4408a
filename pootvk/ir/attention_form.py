"""The Attention form as data: one frozen record and the one validator everybody calls.

An ``AttentionForm`` names everything a fused attention computes besides its operands'
shapes: the mask kind (none, or an additive mask with its broadcast axes), the live length
(an I32 ``len [B]`` operand: keys at ``t >= len[b]`` are never visited), the key layout
(dense, split, paged), the K/V storage dtype, the scale, the softcap and the GQA ratio.
``pootvk.attention``, the tracer and the shape rule all validate through
:func:`check_attention`, so a shape is refused with the same message wherever it enters.

Adding a form: add the enum member, teach :func:`check_attention` its operands, then give
the plan rule a schedule and the generator its indexing (see docs/DESIGN.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from ..errors import ShapeError, UnsupportedPrimitive
from .dtypes import BF16, F16, F32, I32, DType

Shape = tuple[int, ...]


class MaskKind(Enum):
    NONE = "none"
    ADDITIVE = "additive"  # an operand [B|1, Hq|1, Lq|1, Lk] added to the scores


class KeyLayout(Enum):
    DENSE = "dense"  # k [B, Hkv, Lk, Dk]
    SPLIT = "split"  # k [B, Hkv, Lk, Dk - s] + shared k [B, 1, Lk, s] (latent attention)
    PAGED = "paged"  # pools [S, Hkv, D] + a read map [B, Lk]


@dataclass(frozen=True)
class AttentionForm:
    """Everything but the shapes. ``mask_bcast`` says which of (B, H, Lq) the additive mask
    broadcasts over (extent 1); it is None for other mask kinds. ``live``: the last operand
    is an I32 ``len [B]``; row b attends to keys ``t < len[b]`` only (the rewrite emits it
    when value ranges prove ``1 <= len <= Lk``; kernels clamp it into ``0..=Lk``). It is
    orthogonal to the additive mask (ALiBi over a live cache)."""

    scale: float
    softcap: float | None = None
    n_rep: int = 1
    mask: MaskKind = MaskKind.NONE
    mask_bcast: tuple[bool, bool, bool] | None = None
    keys: KeyLayout = KeyLayout.DENSE
    kv_dtype: DType = F32
    live: bool = False

    def describe(self) -> str:
        parts = [f"scale={self.scale:.6g}"]
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:.6g}")
        parts.append(f"n_rep={self.n_rep}")
        mask = self.mask.value
        if self.mask_bcast is not None:
            mask += "[" + ",".join("1" if b else "n" for b in self.mask_bcast) + "]"
        parts.append(f"mask={mask}")
        if self.live:
            parts.append("live")
        if self.keys is not KeyLayout.DENSE:
            parts.append(f"keys={self.keys.value}")
        if self.kv_dtype is not F32:
            parts.append(f"kv={self.kv_dtype.value}")
        return " ".join(parts)

    @property
    def n_operands(self) -> int:
        return 3 + (self.mask is not MaskKind.NONE) + self.live


def _rank4(name: str, s: Shape) -> None:
    if len(s) != 4:
        raise ShapeError(f"attention wants rank-4 {name} [B, H, L, D], got {tuple(s)}")


def check_attention(
    q: Shape, k: Shape, v: Shape, mask: Shape | None = None,
    *, softcap: float | None = None, n_rep: int | None = None,
) -> tuple[int, int, int, int]:
    """Validate dense attention operand shapes; returns the output shape [B, Hq, Lq, Dv].

    ``n_rep`` None derives it (Hq must be a multiple of Hkv); given, it must match.
    """
    _rank4("q", q)
    _rank4("k", k)
    _rank4("v", v)
    b, hq, lq, dk = q
    if min(*q, *k, *v) == 0:
        raise ShapeError(f"empty operand: q {tuple(q)}, k {tuple(k)}, v {tuple(v)}")
    if k[0] != b or v[0] != b:
        raise ShapeError(f"batch differs: q {tuple(q)}, k {tuple(k)}, v {tuple(v)}")
    if k[3] != dk:
        raise ShapeError(f"key width {k[3]} != query width {dk}")
    if tuple(v[1:3]) != tuple(k[1:3]):
        raise ShapeError(f"v {tuple(v)} and k {tuple(k)} differ in heads or length")
    hkv = k[1]
    if hq % hkv:
        raise ShapeError(f"query heads {hq} not a multiple of key/value heads {hkv}")
    if n_rep is not None and hkv * n_rep != hq:
        raise ShapeError(f"Hq={hq} is not Hkv={hkv} * n_rep={n_rep}")
    if softcap is not None and not softcap > 0:
        raise ShapeError(f"softcap must be > 0, got {softcap}")
    if mask is not None:
        _rank4("mask", mask)
        mb, mh, mq, mk = mask
        if mb not in (1, b) or mh not in (1, hq) or mq not in (1, lq) or mk != k[2]:
            raise ShapeError(f"mask {tuple(mask)} does not fit [{b}|1, {hq}|1, {lq}|1, {k[2]}]")
    return (b, hq, lq, v[3])


def mask_bcast(mask: Shape) -> tuple[bool, bool, bool]:
    return (mask[0] == 1, mask[1] == 1, mask[2] == 1)


def form_for(
    q: Shape, k: Shape, v: Shape, mask: Shape | None = None, *,
    scale: float | None = None, softcap: float | None = None, kv_dtype: DType = F32,
) -> AttentionForm:
    """The form of a dense attention over these shapes (validated); scale defaults to
    1/sqrt(Dk)."""
    check_attention(q, k, v, mask, softcap=softcap)
    return AttentionForm(
        scale=float(q[3]) ** -0.5 if scale is None else float(scale),
        softcap=None if softcap is None else float(softcap),
        n_rep=q[1] // k[1],
        mask=MaskKind.NONE if mask is None else MaskKind.ADDITIVE,
        mask_bcast=None if mask is None else mask_bcast(mask),
        kv_dtype=kv_dtype,
    )


def check_form_operands(
    form: AttentionForm, shapes: Sequence[Shape], dtypes: Sequence[DType]
) -> tuple[Shape, DType]:
    """The shape rule of a fused Attention eqn: its operands against its form."""
    if form.keys is not KeyLayout.DENSE:
        raise UnsupportedPrimitive("Attention", f"the {form.keys.value} key form is not built")
    if len(shapes) != form.n_operands:
        raise ShapeError(
            f"Attention with mask={form.mask.value} takes {form.n_operands} operands, "
            f"got {len(shapes)}"
        )
    mask = shapes[3] if form.mask is MaskKind.ADDITIVE else None
    out = check_attention(*shapes[:3], mask, softcap=form.softcap, n_rep=form.n_rep)
    if mask is not None and mask_bcast(mask) != form.mask_bcast:
        raise ShapeError(f"mask {tuple(mask)} does not broadcast as {form.mask_bcast}")
    q_dt, k_dt, v_dt = dtypes[:3]
    if k_dt is not form.kv_dtype or v_dt is not form.kv_dtype:
        raise ShapeError(
            f"k/v are {k_dt.value}/{v_dt.value} but the form stores {form.kv_dtype.value}"
        )
    if form.kv_dtype not in (F32, F16, BF16) or q_dt is not F32:
        raise ShapeError(f"Attention computes in f32: q is {q_dt.value}")
    if mask is not None and dtypes[3] is not F32:
        raise ShapeError(f"Attention mask must be f32, got {dtypes[3].value}")
    if form.live and (tuple(shapes[-1]) != (out[0],) or dtypes[-1] is not I32):
        raise ShapeError(f"Attention live length must be i32[{out[0]}], "
                         f"got {dtypes[-1].value}{list(shapes[-1])}")
    return out, F32
