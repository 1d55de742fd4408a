"""Block-sparse attention as data: the selection (``BlockTopK``) and the attention over the
selected blocks (``SelectedAttention``), their one validator and their semantics in words.

A key cache of ``Lk`` positions is cut into ``NB = Lk / bs`` blocks of ``bs`` keys. Query
row ``(b, l)`` stands at position ``qpos[b, l]``; its *own* block is the one holding that
position and is unfinished, the blocks before it are complete::

    eligible[j]  = (j + 1) * bs <= qpos           (block j is complete: j < qpos // bs)
    own          = #eligible                      (= qpos // bs for qpos >= 0)

``BlockTopK(scores [B, Hs, Lq, NB], qpos [B, Lq]) -> ids [B, Hs, Lq, K]`` keeps the ``K``
eligible blocks of highest score: the scores with NaN read as -inf and every ineligible
block at -inf, the ``K`` largest by ``TopK`` (ties to the lower block id), listed in
ascending block id; a picked block that is not eligible (fewer than K are) is ``-1``. So a
row's ids are distinct eligible blocks, ascending, then ``-1``s; deterministic on every
device because the order is total.

``SelectedAttention(q, k, v, ids, qpos) -> out [B, Hq, Lq, Dv]``: row ``(b, h, l)`` attends
to the keys of its ``K`` selected blocks and of its own block, ``(K + 1) * bs`` positions
``pos = c * bs + j`` (``c`` a slot's block id, ``j < bs``), of which those with
``0 <= pos <= qpos`` are visible (a ``-1`` slot sees nothing; the own block only up to the
row's position). The selection is shared by the query heads of a KV group (``Hs = Hkv``) or
by all heads (``Hs = 1``), so a grouped kernel reads each selected K/V block once per group.
Scores, softcap and softmax are Attention's (a -inf score adds zero weight); there is no mask
operand: the selected block ids and the query positions take its place.

Both are formed by the selection pass (``passes.selection``) from the primitive chains of
``ops.sparse``, which state the same semantics and run on every device unfused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ShapeError
from .dtypes import BF16, F16, F32, I32, DType

Shape = tuple[int, ...]

#: the roles of a SelectedAttention eqn's operands, in operand order (a split key's
#: ``k_shared`` last: ``SelectedForm.roles``)
SELECTED_ROLES = ("q", "k", "v", "ids", "qpos")


@dataclass(frozen=True)
class SelectedForm:
    """Everything but the shapes of a SelectedAttention: the score transform (scale, softcap),
    the GQA ratio, the block size and the K/V storage dtype (16-bit K/V stay 16-bit in memory
    and are computed in F32)."""

    scale: float
    block_size: int
    softcap: float | None = None
    n_rep: int = 1
    kv_dtype: DType = F32
    #: a split key's shared width s (latent attention): the last s key channels come from
    #: ``k_shared`` [B, 1, Lk, s], read at the same key for every head (0: a dense key)
    shared_width: int = 0

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ShapeError(f"block size must be >= 1, got {self.block_size}")
        if self.shared_width < 0:
            raise ShapeError(f"shared key width must be >= 0, got {self.shared_width}")
        if self.softcap is not None and not self.softcap > 0:
            raise ShapeError(f"softcap must be > 0, got {self.softcap}")

    def describe(self) -> str:
        parts = [f"scale={self.scale:.6g}", f"block={self.block_size}", f"n_rep={self.n_rep}"]
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:.6g}")
        if self.kv_dtype is not F32:
            parts.append(f"kv={self.kv_dtype.value}")
        if self.shared_width:
            parts.append(f"keys=split[{self.shared_width}]")
        return " ".join(parts)

    @property
    def roles(self) -> tuple[str, ...]:
        """The operand roles in order: q, k, v, ids, qpos, then a split key's k_shared."""
        return (*SELECTED_ROLES, *(("k_shared",) if self.shared_width else ()))


def check_selection(scores: Shape, qpos: Shape, block_size: int, top_k: int) -> Shape:
    """BlockTopK's operands: scores [B, Hs, Lq, NB], qpos [B, Lq]; 1 <= K <= NB. Returns
    the ids' shape [B, Hs, Lq, K]."""
    if len(scores) != 4 or min(scores) < 1:
        raise ShapeError(f"block scores must be [B, Hs, Lq, NB], got {tuple(scores)}")
    b, hs, lq, nb = scores
    if tuple(qpos) != (b, lq):
        raise ShapeError(f"query positions {tuple(qpos)} are not [B={b}, Lq={lq}]")
    if block_size < 1:
        raise ShapeError(f"block size must be >= 1, got {block_size}")
    if not 1 <= top_k <= nb:
        raise ShapeError(f"top_k={top_k} is not in [1, {nb}] (the scores' blocks)")
    return (b, hs, lq, top_k)


def check_selected(
    form: SelectedForm, shapes: Sequence[Shape], dtypes: Sequence[DType]
) -> tuple[Shape, DType]:
    """SelectedAttention's shape rule: q [B, Hq, Lq, Dk] f32, k [B, Hkv, Lk, Dk] and
    v [B, Hkv, Lk, Dv] stored as the form says, Lk a multiple of the block size, ids
    [B, Hs, Lq, K] i32 with Hs in {1, Hkv}, qpos [B, Lq] i32. Returns [B, Hq, Lq, Dv], F32."""
    roles = form.roles
    if len(shapes) != len(roles) or len(dtypes) != len(roles):
        raise ShapeError(f"SelectedAttention {form.describe()} takes {roles}, got "
                         f"{len(shapes)} operands")
    q, k, v, ids, qpos = (tuple(s) for s in shapes[:5])
    dq, dk_, dv_, di, dp = dtypes[:5]
    sw = form.shared_width
    for name, s in (("q", q), ("k", k), ("v", v), ("ids", ids)):
        if len(s) != 4 or min(s) < 1:
            raise ShapeError(f"SelectedAttention {name} must be a non-empty rank-4 "
                             f"[B, H, L, D], got {s}")
    b, hq, lq, d = q
    if k[0] != b or v[0] != b or k[3] + sw != d or tuple(v[1:3]) != tuple(k[1:3]):
        raise ShapeError(f"SelectedAttention q {q}, k {k}, v {v} do not fit "
                         f"[B, Hq, Lq, Dk], [B, Hkv, Lk, Dk - {sw}], [B, Hkv, Lk, Dv]")
    if sw:
        ks, dks = tuple(shapes[5]), dtypes[5]
        if ks != (b, 1, k[2], sw) or dks is not form.kv_dtype:
            raise ShapeError(f"k_shared {dks.value}{list(ks)} is not "
                             f"{form.kv_dtype.value}[{b}, 1, {k[2]}, {sw}]")
    hkv, lk = k[1], k[2]
    if hq != hkv * form.n_rep:
        raise ShapeError(f"Hq={hq} is not Hkv={hkv} * n_rep={form.n_rep}")
    if lk % form.block_size:
        raise ShapeError(f"key length {lk} is not a multiple of the block size "
                         f"{form.block_size}")
    if ids[0] != b or ids[1] not in (1, hkv) or ids[2] != lq:
        raise ShapeError(f"selected ids {ids} are not [B={b}, 1|Hkv={hkv}, Lq={lq}, K]")
    if ids[3] > lk // form.block_size:
        raise ShapeError(f"{ids[3]} selected blocks of {lk // form.block_size}")
    if qpos != (b, lq):
        raise ShapeError(f"query positions {qpos} are not [B={b}, Lq={lq}]")
    if dq is not F32:
        raise ShapeError(f"SelectedAttention computes in f32: q is {dq.value}")
    if form.kv_dtype not in (F32, F16, BF16) or dk_ is not form.kv_dtype \
            or dv_ is not form.kv_dtype:
        raise ShapeError(f"k is {dk_.value}, v {dv_.value}, the form stores "
                         f"{form.kv_dtype.value}")
    if di is not I32 or dp is not I32:
        raise ShapeError(f"ids and qpos must be i32, got {di.value} and {dp.value}")
    return (b, hq, lq, v[3]), F32
