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
from typing import TypeVar

from ..errors import ShapeError
from .dtypes import BF16, F16, F32, I32, DType

Shape = tuple[int, ...]
T = TypeVar("T")


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
    orthogonal to the additive mask (ALiBi over a live cache). ``shared_width`` is the
    split key's ``s``: the last ``s`` key channels come from the ``k_shared`` operand
    [B, 1, Lk, s], one row per key read for every head (0 unless ``keys`` is SPLIT)."""

    scale: float
    softcap: float | None = None
    n_rep: int = 1
    mask: MaskKind = MaskKind.NONE
    mask_bcast: tuple[bool, bool, bool] | None = None
    keys: KeyLayout = KeyLayout.DENSE
    kv_dtype: DType = F32
    live: bool = False
    shared_width: int = 0

    def __post_init__(self) -> None:
        split = self.keys is KeyLayout.SPLIT
        if split != (self.shared_width > 0) or self.shared_width < 0:
            raise ShapeError(f"keys={self.keys.value} with shared_width={self.shared_width}: "
                             "a split key needs s >= 1, other layouts s = 0")

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
        if self.keys is KeyLayout.SPLIT:
            parts.append(f"keys=split[{self.shared_width}]")
        elif self.keys is not KeyLayout.DENSE:
            parts.append(f"keys={self.keys.value}")
        if self.kv_dtype is not F32:
            parts.append(f"kv={self.kv_dtype.value}")
        return " ".join(parts)

    @property
    def roles(self) -> tuple[str, ...]:
        """The fused eqn's operand roles in operand order: q, k, v, then the additive mask,
        the live length ``len``, a split key's ``k_shared`` and a paged key's ``read`` map,
        each where the form has it. Stages take operands by these names
        (``attention_operands``); kernels bind them by the same names. A paged form's k and
        v are the pools [S, Hkv, D] and ``read`` [B, Lk] I32 names the pool slot of each
        logical key: key t of row b and head g is pool row ``read[b, t] * Hkv + g``."""
        return ("q", "k", "v", *(("mask",) if self.mask is MaskKind.ADDITIVE else ()),
                *(("len",) if self.live else ()),
                *(("k_shared",) if self.keys is KeyLayout.SPLIT else ()),
                *(("read",) if self.keys is KeyLayout.PAGED else ()))

    @property
    def n_operands(self) -> int:
        return len(self.roles)


def attention_operands(form: AttentionForm, operands: Sequence[T]) -> dict[str, T]:
    """The operands of a fused Attention eqn by role (``AttentionForm.roles``)."""
    if len(operands) != form.n_operands:
        raise ShapeError(f"Attention {form.describe()} takes {form.n_operands} operands "
                         f"{form.roles}, got {len(operands)}")
    return dict(zip(form.roles, operands, strict=True))


def paged_view_shapes(k_pool: Shape, v_pool: Shape, read: Shape) -> tuple[Shape, Shape]:
    """The logical [B, Hkv, Lk, D] key and value shapes of pools k [S, Hkv, Dk] and
    v [S, Hkv, Dv] read through ``read`` [B, Lk]."""
    if len(k_pool) != 3 or len(v_pool) != 3 or len(read) != 2:
        raise ShapeError(f"a paged key takes pools k [S, Hkv, Dk], v [S, Hkv, Dv] and read "
                         f"[B, Lk], got k {tuple(k_pool)}, v {tuple(v_pool)}, "
                         f"read {tuple(read)}")
    if tuple(k_pool[:2]) != tuple(v_pool[:2]):
        raise ShapeError(f"pools differ in slots or heads: k {tuple(k_pool)}, v {tuple(v_pool)}")
    b, lk = read
    return (b, k_pool[1], lk, k_pool[2]), (b, v_pool[1], lk, v_pool[2])


def _rank4(name: str, s: Shape) -> None:
    if len(s) != 4:
        raise ShapeError(f"attention wants rank-4 {name} [B, H, L, D], got {tuple(s)}")


def check_attention(
    q: Shape, k: Shape, v: Shape, mask: Shape | None = None,
    *, softcap: float | None = None, n_rep: int | None = None, k_shared: Shape | None = None,
) -> tuple[int, int, int, int]:
    """Validate attention operand shapes; returns the output shape [B, Hq, Lq, Dv].

    ``n_rep`` None derives it (Hq must be a multiple of Hkv); given, it must match.
    ``k_shared`` [B, 1, Lk, s] is a split key's part shared by every head: q then has width
    Dk = (k's width) + s, and the key of head g is concat(k[:, g], k_shared[:, 0]).
    """
    _rank4("q", q)
    _rank4("k", k)
    _rank4("v", v)
    b, hq, lq, dk = q
    if min(*q, *k, *v) == 0:
        raise ShapeError(f"empty operand: q {tuple(q)}, k {tuple(k)}, v {tuple(v)}")
    if k[0] != b or v[0] != b:
        raise ShapeError(f"batch differs: q {tuple(q)}, k {tuple(k)}, v {tuple(v)}")
    if k_shared is not None:
        _rank4("k_shared", k_shared)
        ks = tuple(k_shared)
        if min(ks) == 0 or ks[:3] != (b, 1, k[2]):
            raise ShapeError(f"k_shared {ks} is not [B={b}, 1, Lk={k[2]}, s >= 1]")
        if k[3] + ks[3] != dk:
            raise ShapeError(f"key width {k[3]} + shared key width {ks[3]} = "
                             f"{k[3] + ks[3]} != query width {dk}")
    elif k[3] != dk:
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
    k_shared: Shape | None = None,
) -> AttentionForm:
    """The form of an attention over these shapes (validated); scale defaults to
    1/sqrt(Dk) (Dk the query width, the whole key's width)."""
    check_attention(q, k, v, mask, softcap=softcap, k_shared=k_shared)
    return AttentionForm(
        scale=float(q[3]) ** -0.5 if scale is None else float(scale),
        softcap=None if softcap is None else float(softcap),
        n_rep=q[1] // k[1],
        mask=MaskKind.NONE if mask is None else MaskKind.ADDITIVE,
        mask_bcast=None if mask is None else mask_bcast(mask),
        kv_dtype=kv_dtype,
        keys=KeyLayout.DENSE if k_shared is None else KeyLayout.SPLIT,
        shared_width=0 if k_shared is None else k_shared[3],
    )


def check_form_operands(
    form: AttentionForm, shapes: Sequence[Shape], dtypes: Sequence[DType]
) -> tuple[Shape, DType]:
    """The shape rule of a fused Attention eqn: its operands against its form (a paged
    form's pools and read map checked, then its logical [B, Hkv, Lk, D] K/V)."""
    sh = attention_operands(form, shapes)
    dt = attention_operands(form, dtypes)
    if form.keys is KeyLayout.PAGED:
        sh = dict(sh)
        sh["k"], sh["v"] = paged_view_shapes(sh["k"], sh["v"], sh["read"])
        if dt["read"] is not I32:
            raise ShapeError(f"a paged key's read map must be i32, got {dt['read'].value}")
        if sh["read"][0] != sh["q"][0]:
            raise ShapeError(f"read map {tuple(sh['read'])} has not the query's "
                             f"{sh['q'][0]} rows")
    mask, ks = sh.get("mask"), sh.get("k_shared")
    out = check_attention(sh["q"], sh["k"], sh["v"], mask, softcap=form.softcap,
                          n_rep=form.n_rep, k_shared=ks)
    if mask is not None and mask_bcast(mask) != form.mask_bcast:
        raise ShapeError(f"mask {tuple(mask)} does not broadcast as {form.mask_bcast}")
    if ks is not None and ks[3] != form.shared_width:
        raise ShapeError(f"k_shared width {ks[3]} != the form's s = {form.shared_width}")
    for role in ("k", "v", "k_shared"):
        if role in dt and dt[role] is not form.kv_dtype:
            raise ShapeError(
                f"{role} is {dt[role].value} but the form stores {form.kv_dtype.value}"
            )
    if form.kv_dtype not in (F32, F16, BF16) or dt["q"] is not F32:
        raise ShapeError(f"Attention computes in f32: q is {dt['q'].value}")
    if mask is not None and dt["mask"] is not F32:
        raise ShapeError(f"Attention mask must be f32, got {dt['mask'].value}")
    if form.live and (tuple(sh["len"]) != (out[0],) or dt["len"] is not I32):
        raise ShapeError(f"Attention live length must be i32[{out[0]}], "
                         f"got {dt['len'].value}{list(sh['len'])}")
    return out, F32
