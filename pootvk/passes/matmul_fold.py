"""The matmul fold: ``MatMul(a, [Transpose] [Convert] w)`` becomes one ``Linear`` eqn.

A model multiplies by weights stored as PyTorch/GGUF ``Linear`` does (``W[N, K]``, traced as
``Transpose(W)`` with the last two axes swapped) and often in 16 bits (traced as
``Convert(W16 -> F32)``). Run as traced, each step would first write a transposed or widened
copy of the whole weight and then read it again: three times the bytes of the one read the
matmul needs. Folded, the Linear kernel reads ``W`` in its stored layout and dtype.

Matched, innermost producer last: ``w`` is an F32 Transpose (perm swapping only the last two
axes) and/or a Convert from F16/BF16 to F32, in either order, at most one of each; ``a`` must
be F32. The fold does not need the Transpose or Convert to be private: another user keeps
its own kernel, and dead-code elimination drops them when nothing else reads them. The
fused eqn reuses the MatMul's output Var, so nothing downstream is renamed.
"""

from __future__ import annotations

from ..ir import BF16, F16, F32, Eqn, Graph, LinearForm, Params, Var
from ..ir.prims import CONVERT, LINEAR, MATMUL, TRANSPOSE
from .canonicalize import dead_code_elimination


def _swaps_last_two(perm: tuple[int, ...]) -> bool:
    r = len(perm)
    return r >= 2 and tuple(perm) == (*range(r - 2), r - 1, r - 2)


def _peel(w: Var, producer: dict[Var, Eqn]) -> tuple[Var, bool, object]:
    """(stored weight, transposed?, storage dtype) behind ``w``."""
    transpose, dtype = False, F32
    for _ in range(2):
        e = producer.get(w)
        if e is None:
            break
        if e.prim is TRANSPOSE and not transpose and _swaps_last_two(e.params["perm"]):
            transpose, w = True, e.inputs[0]
        elif (e.prim is CONVERT and dtype is F32 and e.params["dtype"] is F32
              and e.inputs[0].dtype in (F16, BF16)):
            dtype, w = e.inputs[0].dtype, e.inputs[0]
        else:
            break
    return w, transpose, dtype


def matmul_fold(g: Graph) -> Graph:
    """Replace every MatMul whose weight is a foldable Transpose/Convert of a stored one."""
    producer = {o: e for e in g.eqns for o in e.outputs}
    eqns: list[Eqn] = []
    for e in g.eqns:
        if e.prim is MATMUL and e.inputs[0].dtype is F32:
            a, w = e.inputs
            src, transpose, dtype = _peel(w, producer)
            if src is not w:
                form = LinearForm(transpose_b=transpose, b_dtype=dtype)
                e = Eqn(LINEAR, (a, src), e.outputs, Params(form=form))
        eqns.append(e)
    return dead_code_elimination(g.replace(eqns))
