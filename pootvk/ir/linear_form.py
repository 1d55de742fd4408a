"""The Linear form: how a folded matmul reads its weight operand.

``Linear(a, w)`` computes ``a @ op(w)`` in F32, where ``op`` transposes the last two axes of
``w`` when ``transpose_b`` (the PyTorch/GGUF ``Linear`` layout ``W[N, K]``, K contiguous per
output) and ``w`` is stored as ``b_dtype`` (F32, or F16/BF16 read as their 16-bit words and
converted in registers). The compile pass ``passes.matmul_fold`` makes it from
``MatMul(a, [Transpose] [Convert] w)``, so neither a transpose kernel nor a convert kernel
runs; its answer is the chain's answer bit for bit (the oracle computes the same matmul).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ShapeError
from .dtypes import BF16, F16, F32, DType

B_DTYPES = (F32, F16, BF16)


@dataclass(frozen=True)
class LinearForm:
    transpose_b: bool
    b_dtype: DType = F32

    def describe(self) -> str:
        return f"form=linear(b{'^T' if self.transpose_b else ''}:{self.b_dtype.value})"


def logical_b_shape(form: LinearForm, b_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The [.., K, N] shape the matmul sees: the stored shape, last two axes swapped when
    ``transpose_b``."""
    if len(b_shape) < 2:
        raise ShapeError(f"Linear weight must have rank >= 2, got {b_shape}")
    if form.transpose_b:
        return (*b_shape[:-2], b_shape[-1], b_shape[-2])
    return tuple(b_shape)


def check_linear_operands(
    form: LinearForm, a: tuple[tuple[int, ...], DType], b: tuple[tuple[int, ...], DType],
) -> tuple[int, ...]:
    """The shape rule: a F32 [.., M, K], b ``form.b_dtype`` stored [.., K, N] (or [.., N, K]
    when transposed); batch dims broadcast. Returns the F32 output shape."""
    import numpy as np

    (sa, da), (sb, db) = a, b
    if form.b_dtype not in B_DTYPES:
        raise ShapeError(f"Linear weight dtype {form.b_dtype.value} not in F32/F16/BF16")
    if da is not F32 or db is not form.b_dtype:
        raise ShapeError(f"Linear operands {da.value}, {db.value} != f32, {form.b_dtype.value}")
    kn = logical_b_shape(form, sb)
    if len(sa) < 2 or sa[-1] != kn[-2]:
        raise ShapeError(f"Linear {sa} @ {kn}: contraction dims differ")
    try:
        batch = tuple(np.broadcast_shapes(sa[:-2], kn[:-2]))
    except ValueError as e:
        raise ShapeError(f"Linear batch dims {sa[:-2]} and {kn[:-2]} do not broadcast") from e
    return (*batch, sa[-2], kn[-1])
