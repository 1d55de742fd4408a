"""The tracer: a builder that appends typed primitive eqns to a graph under construction.

One method per primitive; each types its eqn through ``ir.new_eqn`` so a malformed trace
fails where it is written, with a ShapeError, not later in a pass.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from ..errors import ShapeError
from ..ir import (
    F32,
    I32,
    CompareOp,
    DType,
    Eqn,
    Graph,
    Literal,
    Prim,
    ReduceOp,
    Slot,
    SlotKind,
    UnaryOp,
    Var,
    new_eqn,
)
from ..ir import prims as P

Operand = Var | float | int


class Builder:
    def __init__(self) -> None:
        self.slots: list[Slot] = []
        self.eqns: list[Eqn] = []
        self.exports: dict[str, Var] = {}
        self.states: dict[str, Var] = {}
        self.validations: dict[str, Var] = {}

    # --- slots and outputs ------------------------------------------------------------------
    def slot(
        self,
        name: str,
        kind: SlotKind,
        shape: Sequence[int],
        dtype: DType = F32,
        range: tuple[int, int] | None = None,
    ) -> Var:
        if any(s.name == name for s in self.slots):
            raise ShapeError(f"slot {name!r} declared twice")
        if range is not None and not dtype.is_int:
            raise ShapeError(f"slot {name!r}: only integer slots carry a range")
        if kind is SlotKind.WRITEMAP and (dtype is not I32 or len(shape) != 1 or range is None
                                          or range[0] != -1 or range[1] < 0):
            raise ShapeError(f"write map {name!r} must be i32 [n] declared in (-1, S - 1) for "
                             f"a pool of S slots, got {dtype.value}{list(shape)} in {range}")
        if kind is SlotKind.SLOTMAP and dtype is not I32:
            raise ShapeError(f"read map {name!r} must be i32, got {dtype.value}")
        v = Var(tuple(shape), dtype, range)
        self.slots.append(Slot(name, kind, v))
        return v

    def param(self, name: str, shape: Sequence[int], dtype: DType = F32) -> Var:
        return self.slot(name, SlotKind.PARAM, shape, dtype)

    def input(self, name: str, shape: Sequence[int], dtype: DType = F32) -> Var:
        return self.slot(name, SlotKind.INPUT, shape, dtype)

    def state(self, name: str, shape: Sequence[int], dtype: DType = F32) -> Var:
        return self.slot(name, SlotKind.STATE, shape, dtype)

    def tokens(self, name: str, shape: Sequence[int], vocab: int) -> Var:
        """Token ids, declared in [0, vocab - 1]: a bound id outside that range is refused
        at bind (SlotRangeError) before a Gather could clamp it."""
        return self.slot(name, SlotKind.TOKENS, shape, I32, (0, vocab - 1))

    def pos(self, name: str, lo: int, hi: int) -> Var:
        return self.slot(name, SlotKind.POS, (), I32, (lo, hi))

    def slotmap(self, name: str, shape: Sequence[int], pool_slots: int) -> Var:
        """A paged read map (SLOTMAP): i32 pool slots declared in [0, pool_slots - 1], so a
        word outside the pool is refused at bind (SlotRangeError) and the attention rewrite
        may read the pools in place through it (``ops.paged_attention``)."""
        _check_pool(name, pool_slots)
        return self.slot(name, SlotKind.SLOTMAP, shape, I32, (0, int(pool_slots) - 1))

    def writemap(self, name: str, n: int, pool_slots: int) -> Var:
        """A paged write map (WRITEMAP): [n] i32, one pool slot per new row or -1 (write
        nothing), declared in [-1, pool_slots - 1]; bound only as a checked
        ``ir.ForwardSlotMap`` (a slot outside the pool or named twice: WriteMapError)."""
        _check_pool(name, pool_slots)
        return self.slot(name, SlotKind.WRITEMAP, (n,), I32, (-1, int(pool_slots) - 1))

    def set_state(self, name: str, v: Var) -> None:
        self.states[name] = v

    def export(self, name: str, v: Var) -> None:
        self.exports[name] = v

    def build(self) -> Graph:
        return Graph(
            list(self.slots), list(self.eqns), dict(self.exports), dict(self.states),
            dict(self.validations),
        )

    # --- primitives ---------------------------------------------------------------------------
    def lit(self, x: Operand, dtype: DType) -> Var:
        return x if isinstance(x, Var) else Literal(x, dtype)

    def emit(self, prim: Prim, inputs: Sequence[Var], **params: object) -> Var:
        e = new_eqn(prim, inputs, **params)
        self.eqns.append(e)
        return e.out

    def _bin(self, prim: Prim, a: Operand, b: Operand) -> Var:
        dt = a.dtype if isinstance(a, Var) else b.dtype if isinstance(b, Var) else F32
        return self.emit(prim, [self.lit(a, dt), self.lit(b, dt)])

    def add(self, a: Operand, b: Operand) -> Var:
        return self._bin(P.ADD, a, b)

    def sub(self, a: Operand, b: Operand) -> Var:
        return self._bin(P.SUB, a, b)

    def mul(self, a: Operand, b: Operand) -> Var:
        return self._bin(P.MUL, a, b)

    def div(self, a: Operand, b: Operand) -> Var:
        return self._bin(P.DIV, a, b)

    def max(self, a: Operand, b: Operand) -> Var:
        return self._bin(P.MAX, a, b)

    def min(self, a: Operand, b: Operand) -> Var:
        return self._bin(P.MIN, a, b)

    def unary(self, op: UnaryOp | str, x: Var) -> Var:
        return self.emit(P.UNARY, [x], op=_enum(UnaryOp, op))

    def exp(self, x: Var) -> Var:
        return self.unary(UnaryOp.EXP, x)

    def tanh(self, x: Var) -> Var:
        return self.unary(UnaryOp.TANH, x)

    def compare(self, op: CompareOp | str, a: Operand, b: Operand) -> Var:
        dt = a.dtype if isinstance(a, Var) else b.dtype if isinstance(b, Var) else I32
        return self.emit(P.COMPARE, [self.lit(a, dt), self.lit(b, dt)], op=_enum(CompareOp, op))

    def select(self, pred: Var, a: Operand, b: Operand) -> Var:
        dt = a.dtype if isinstance(a, Var) else b.dtype if isinstance(b, Var) else F32
        return self.emit(P.SELECT, [pred, self.lit(a, dt), self.lit(b, dt)])

    def convert(self, x: Var, dtype: DType) -> Var:
        return self.emit(P.CONVERT, [x], dtype=dtype)

    def iota(self, shape: Sequence[int], axis: int, dtype: DType = I32) -> Var:
        return self.emit(P.IOTA, [], shape=tuple(shape), axis=axis, dtype=dtype)

    def reshape(self, x: Var, shape: Sequence[int]) -> Var:
        return self.emit(P.RESHAPE, [x], shape=tuple(shape))

    def broadcast(self, x: Var, shape: Sequence[int]) -> Var:
        return self.emit(P.BROADCAST, [x], shape=tuple(shape))

    def transpose(self, x: Var, perm: Sequence[int]) -> Var:
        return self.emit(P.TRANSPOSE, [x], perm=tuple(perm))

    def slice(self, x: Var, start: Sequence[int], limit: Sequence[int]) -> Var:
        return self.emit(P.SLICE, [x], start=tuple(start), limit=tuple(limit))

    def concat(self, xs: Sequence[Var], axis: int) -> Var:
        return self.emit(P.CONCAT, list(xs), axis=axis)

    def matmul(self, a: Var, b: Var) -> Var:
        return self.emit(P.MATMUL, [a, b])

    def reduce(self, op: ReduceOp | str, x: Var, axis: int, keepdim: bool = True) -> Var:
        return self.emit(
            P.REDUCE, [x], op=_enum(ReduceOp, op), axis=axis % x.ndim, keepdim=keepdim
        )

    def index_guard(self, x: Var, lo: int, hi: int, name: str) -> Var:
        """``clamp(x, lo, hi)``, with the guard's witness declared as validation output
        ``name``: a step in which any element of x is outside [lo, hi] raises GuardFailed
        naming ``name`` and publishes nothing."""
        if name in self.validations:
            raise ShapeError(f"validation {name!r} declared twice")
        e = new_eqn(P.INDEX_GUARD, [x], lo=int(lo), hi=int(hi))
        self.eqns.append(e)
        clamped, witness = e.outputs
        self.validations[name] = witness
        return clamped

    def dynamic_update_slice(self, operand: Var, update: Var, starts: Sequence[Operand]) -> Var:
        return self.emit(
            P.DYNAMIC_UPDATE_SLICE, [operand, update, *(self.lit(s, I32) for s in starts)]
        )

    def scatter_update(self, operand: Var, indices: Var, updates: Var) -> Var:
        """Row ``indices[n]`` of ``operand`` becomes ``updates[n]`` (the last wins on a
        repeated row); an index outside [0, rows), such as -1, writes nothing. In place
        when the result is the operand's state update."""
        return self.emit(P.SCATTER_UPDATE, [operand, indices, updates])


    def gather(self, table: Var, indices: Var) -> Var:
        """``table[indices]`` along axis 0: [V, *rest] by [*idx] -> [*idx, *rest]; an index
        outside [0, V) reads the nearest row (clamped, never out of bounds)."""
        return self.emit(P.GATHER, [table, indices])

    def topk(self, x: Var, k: int) -> Var:
        """The i32 indices [..., k] of the ``k`` largest entries of f32 ``x`` along its last
        axis (NaN below every number, ties to the lower index), in ascending index order."""
        return self.emit(P.TOPK, [x], k=int(k))

    def copy(self, x: Var) -> Var:
        return self.emit(P.COPY, [x])

    # unary shortcuts (``unary(op, x)`` takes any UnaryOp)
    def neg(self, x: Var) -> Var:
        return self.unary(UnaryOp.NEG, x)

    def sqrt(self, x: Var) -> Var:
        return self.unary(UnaryOp.SQRT, x)

    def rsqrt(self, x: Var) -> Var:
        return self.unary(UnaryOp.RSQRT, x)

    def log(self, x: Var) -> Var:
        return self.unary(UnaryOp.LOG, x)

    def recip(self, x: Var) -> Var:
        return self.unary(UnaryOp.RECIP, x)

    def sigmoid(self, x: Var) -> Var:
        return self.unary(UnaryOp.SIGMOID, x)

    def silu(self, x: Var) -> Var:
        return self.unary(UnaryOp.SILU, x)

    # --- layers ---------------------------------------------------------------------------
    # Chains of the primitives above, written as functions over a Builder in ops.layers and
    # ops.attention (which import this module, hence the imports inside the methods). The
    # attention helpers emit the chain the attention rewrite fuses into one kernel.
    def rms_norm(self, x: Var, weight: Var, eps: float = 1e-6) -> Var:
        """``x * rsqrt(mean(x^2) + eps) * weight`` over the last axis (F32 math)."""
        from .layers import rms_norm

        return rms_norm(self, x, weight, eps)

    def rope(self, x: Var, pos: Var, cos: Var, sin: Var) -> Var:
        """HF Llama's (non-interleaved) rotary embedding of x [B, H, L, D] at pos..pos+L-1,
        from cos/sin tables [P, D/2] (``ops.layers.rope_tables``)."""
        from .layers import rope

        return rope(self, x, pos, cos, sin)

    def repeat_kv(self, x: Var, n_rep: int) -> Var:
        """GQA: each of x's [B, Hkv, L, D] heads repeated n_rep times -> [B, Hkv*n_rep, L, D]."""
        from .attention import repeat_kv

        return repeat_kv(self, x, n_rep)

    def attention(
        self, q: Var, k: Var, v: Var, mask: Var | None = None, scale: float | None = None,
        softcap: float | None = None,
    ) -> Var:
        """softmax(cap(q k^T * scale) + mask) v over [B, H, L, D] (GQA when Hq > Hkv)."""
        from .attention import attention_core

        return attention_core(self, q, k, v, mask, scale, softcap)

    def attention_decode(
        self, q: Var, k_new: Var, v_new: Var, k_cache: Var, v_cache: Var, pos: Var,
        *, mask: Var | None = None, scale: float | None = None, softcap: float | None = None,
    ) -> tuple[Var, Var, Var]:
        """One token over a KV cache: k_new/v_new written at ``pos`` (DynamicUpdateSlice),
        attention over keys <= pos (in-graph causal mask). Returns (out, k_cache',
        v_cache'); pass the caches to ``set_state``. Lq > 1 is a causal prefill chunk."""
        from .attention import attention_prefill

        return attention_prefill(self, q, k_new, v_new, k_cache, v_cache, pos, mask=mask,
                                 scale=scale, softcap=softcap)


def _check_pool(name: str, pool_slots: int) -> None:
    if isinstance(pool_slots, bool) or not isinstance(pool_slots, numbers.Integral) \
            or pool_slots < 1:
        raise ShapeError(f"map {name!r}: a pool has at least one slot, got {pool_slots!r}")


def _enum(kind: type, op: object) -> object:
    """A sub-op enum member from the member or its name as printed (``"Exp"``)."""
    try:
        return kind(op)
    except ValueError:
        raise ShapeError(f"{op!r} is not one of {[m.value for m in kind]}") from None
