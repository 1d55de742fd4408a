"""The Linear form: how a folded matmul reads its weight operand, and what it computes on
the way in and out.

``Linear(a, w)`` computes ``a @ op(w)`` in F32, where ``op`` transposes the last two axes of
``w`` when ``transpose_b`` (the PyTorch/GGUF ``Linear`` layout ``W[N, K]``, K contiguous per
output) and ``w`` is stored as ``b_dtype`` (F32, or F16/BF16 read as their 16-bit words and
converted in registers). The compile pass ``passes.matmul_fold`` makes it from
``MatMul(a, [Transpose] [Convert] w)``, so neither a transpose kernel nor a convert kernel
runs; its answer is the chain's answer bit for bit (the oracle computes the same matmul).

``passes.linear_fuse`` then folds the elementwise work around it into the same kernel, as
data (``ir.fused`` bodies), so no kernel of its own runs and no intermediate is stored:

- a ``prologue`` computes each element of ``a`` on load from the eqn's first operands: an
  elementwise body (SwiGLU's ``silu(g) * u``), or a row form (RMSNorm: ``row`` per element,
  reading through its ``REDUCED`` leaf the ``op`` reduction of ``body`` over the row, the
  last axis, which the GEMV recomputes per workgroup; the semantics of ``FusedRow``);
- an ``epilogue`` computes each output element from the matmul's value (its ``REDUCED``
  leaf: the contraction's sum) and extra operands broadcast at the output index (the
  residual ``Add``).

Operands: ``(a-side..., w, epilogue operands...)``: the a side is ``a`` itself, or the
prologue's operands (its leaves index them from 0); the epilogue's leaves index the operands
after ``w`` from 0, each read once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ShapeError
from .dtypes import BF16, F16, F32, DType

if TYPE_CHECKING:
    from .fused import FusedBody
    from .graph import Var
    from .prims import ReduceOp

B_DTYPES = (F32, F16, BF16)
#: Rows (after folding batch dims into rows) up to which a Linear runs as a GEMV, one
#: workgroup per output slice reading all of K (``plan.matmul_schedule``); past it, a tiled
#: GEMM. Static shape info: ``passes.linear_fuse`` gives only GEMVs a prologue.
GEMV_MAX_ROWS = 8
#: The dtypes an epilogue may store (the matmul kernels' stores)
OUT_DTYPES = (F32, F16, BF16)


@dataclass(frozen=True)
class LinearPrologue:
    """``a`` computed on load: ``body`` elementwise (``row`` None), or the ``FusedRow`` of
    ``body`` reduced by ``op`` over the last axis with ``row`` per element."""

    body: FusedBody
    op: ReduceOp | None = None
    row: FusedBody | None = None

    @property
    def n_operands(self) -> int:
        """Operands the prologue reads: the body's, and any more its row reads."""
        from .fused import Leaf

        n = self.body.n_operands
        for node in self.row.nodes if self.row is not None else ():
            if node.op is Leaf.OPERAND:
                n = max(n, node.params["index"] + 1)
        return n

    def describe(self) -> str:
        if self.row is None:
            return str(self.body)
        assert self.op is not None
        return f"{self.row} r={self.op.value}({self.body})"


@dataclass(frozen=True)
class LinearForm:
    transpose_b: bool
    b_dtype: DType = F32
    prologue: LinearPrologue | None = None
    epilogue: FusedBody | None = None

    @property
    def a_operands(self) -> int:
        """Operands before ``w``: 1 (``a``), or the prologue's."""
        return 1 if self.prologue is None else self.prologue.n_operands

    def describe(self) -> str:
        out = f"form=linear(b{'^T' if self.transpose_b else ''}:{self.b_dtype.value})"
        if self.prologue is not None:
            out += f" a={self.prologue.describe()}"
        if self.epilogue is not None:
            out += f" y={self.epilogue}"
        return out


def split_operands(
    form: LinearForm, xs: Sequence[Var]
) -> tuple[tuple[Var, ...], Var, tuple[Var, ...]]:
    """(a-side operands, the weight, the epilogue's operands) of a Linear eqn."""
    na = form.a_operands
    if len(xs) < na + 1:
        raise ShapeError(f"Linear takes {na} a-side operands and a weight, got {len(xs)}")
    return tuple(xs[:na]), xs[na], tuple(xs[na + 1:])


def matmul_rows(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
    """Rows one matmul kernel computes: A's batch dims fold into rows when the weight has no
    batch (one matrix), else the per-batch M."""
    if all(d == 1 for d in b_shape[:-2]):
        rows = 1
        for d in a_shape[:-1]:
            rows *= d
        return rows
    return a_shape[-2]


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


def type_prologue(pro: LinearPrologue, ops: Sequence[Var]) -> tuple[tuple[int, ...], DType]:
    """The (shape, dtype) of ``a`` a prologue computes from ``ops``: a ``Fused`` eqn's type,
    or a ``FusedRow``'s over the last axis (whose op must then be given)."""
    from .fused import FUSED, FUSED_ROW
    from .graph import Params
    from .prims import type_eqn

    if pro.row is None:
        if pro.op is not None:
            raise ShapeError("an elementwise Linear prologue has no reduction op")
        (aval,) = type_eqn(FUSED, ops, Params(body=pro.body))
        return aval
    if pro.op is None:
        raise ShapeError("a row Linear prologue needs its reduction op")
    axis = len(pro.body.out.shape) - 1
    params = Params(body=pro.body, op=pro.op, axis=axis, epilogue=pro.row)
    (aval,) = type_eqn(FUSED_ROW, ops, params)
    return aval


def type_linear(form: LinearForm, xs: Sequence[Var]) -> tuple[tuple[int, ...], DType]:
    """The whole Linear shape rule: the prologue's ``a``, the matmul, then the epilogue,
    whose ``REDUCED`` leaf is the F32 matmul value and whose result has its shape."""
    from .fused import type_reading

    a_ops, w, extras = split_operands(form, xs)
    a = a_ops[0].shape, a_ops[0].dtype
    if form.prologue is not None:
        a = type_prologue(form.prologue, a_ops)
    elif len(a_ops) != 1:
        raise ShapeError(f"a Linear without a prologue reads one a, got {len(a_ops)}")
    out = check_linear_operands(form, a, (w.shape, w.dtype))
    if form.epilogue is None:
        if extras:
            raise ShapeError(f"a Linear without an epilogue has {len(extras)} extra operands")
        return out, F32
    (shape, dt), read = type_reading(form.epilogue, extras, (out, F32))
    if read != set(range(len(extras))):
        raise ShapeError(f"Linear epilogue reads operands {sorted(read)} of {len(extras)}")
    if shape != out or dt not in OUT_DTYPES:
        raise ShapeError(f"Linear epilogue gives {dt.value}{list(shape)}; the matmul is "
                         f"f32{list(out)} (a float of its shape is stored)")
    return shape, dt
