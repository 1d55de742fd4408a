"""The matmul fold: MatMul(x, [Transpose] [Convert] W) becomes one Linear eqn that reads W
in its stored layout and dtype, with the oracle's answer unchanged bit for bit; what it must
not fold stays as traced."""

import numpy as np
import pytest

from pootvk.errors import ShapeError
from pootvk.ir import BF16, F16, F32, I32, LinearForm, check_graph, new_eqn
from pootvk.ir import prims as P
from pootvk.ir.printing import format_graph
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph, matmul_fold
from tests.helpers import random_inputs


def _graph(dt, order="convert_first", export_t=False, perm=(1, 0)):
    b = Builder()
    x = b.input("x", (3, 24))
    w = b.param("w", (16, 24), dt)
    if order == "convert_first":
        t = b.transpose(b.convert(w, F32) if dt is not F32 else w, perm)
    else:
        t = b.transpose(w, perm)
        t = b.convert(t, F32) if dt is not F32 else t
    b.export("y", b.matmul(x, t))
    if export_t:
        b.export("t", t)
    return b.build()


@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=lambda d: d.value)
@pytest.mark.parametrize("order", ["convert_first", "transpose_first"])
def test_fold_makes_one_linear_with_the_oracles_answer(dt, order):
    g = _graph(dt, order)
    c = compile_graph(g)
    assert [e.prim for e in c.eqns] == [P.LINEAR]
    assert c.eqns[0].params["form"] == LinearForm(transpose_b=True, b_dtype=dt)
    assert c.eqns[0].inputs[1] is g.slot("w").var  # the stored weight itself
    ins = random_inputs(g, np.random.default_rng(1))
    want, got = evaluate(g, ins)["y"], evaluate(c, ins)["y"]
    np.testing.assert_array_equal(got, want)  # bit for bit


def test_fold_prints():
    c = compile_graph(_graph(F16))
    assert "= Linear[form=linear(b^T:f16)] a b" in format_graph(c)


def test_a_convert_alone_folds_untransposed():
    b = Builder()
    x, w = b.input("x", (1, 8)), b.param("w", (8, 5), BF16)
    b.export("y", b.matmul(x, b.convert(w, F32)))
    c = compile_graph(b.build())
    assert [e.prim for e in c.eqns] == [P.LINEAR]
    assert c.eqns[0].params["form"] == LinearForm(transpose_b=False, b_dtype=BF16)


def test_a_transpose_used_elsewhere_keeps_its_kernel_but_the_matmul_reads_the_source():
    c = compile_graph(_graph(F16, export_t=True))
    assert c.count(P.LINEAR) == 1 and c.count(P.MATMUL) == 0
    # the exported value still needs its kernel: the widening and the transpose, one Fused
    (t,) = [e for e in c.eqns if e.prim is not P.LINEAR]
    assert str(t.params["body"]) == "Transpose[(1, 0)](Convert[f32](x0))"


def test_what_must_not_fold_stays():
    # a rank-3 transpose that moves the batch axis, not only the last two
    b = Builder()
    x, w = b.input("x", (2, 3, 4)), b.param("w", (4, 2, 5))
    b.export("y", b.matmul(x, b.transpose(w, (1, 0, 2))))
    c = matmul_fold(b.build())
    assert c.count(P.MATMUL) == 1 and c.count(P.LINEAR) == 0
    # an integer weight converted to F32 is not a 16-bit storage read
    b = Builder()
    x, w = b.input("x", (2, 4)), b.param("w", (4, 5), I32)
    b.export("y", b.matmul(x, b.convert(w, F32)))
    assert matmul_fold(b.build()).count(P.LINEAR) == 0
    # two transposes: only the outer is folded, the inner stays a kernel
    b = Builder()
    x, w = b.input("x", (2, 4)), b.param("w", (4, 5))
    b.export("y", b.matmul(x, b.transpose(b.transpose(w, (1, 0)), (1, 0))))
    g = matmul_fold(b.build())
    check_graph(g)


def test_linear_shape_rule():
    b = Builder()
    x, w16 = b.input("x", (2, 3, 8)), b.param("w", (5, 8), F16)
    e = new_eqn(P.LINEAR, [x, w16], form=LinearForm(True, F16))
    assert e.out.shape == (2, 3, 5) and e.out.dtype is F32
    with pytest.raises(ShapeError, match="operands"):
        new_eqn(P.LINEAR, [x, w16], form=LinearForm(True, BF16))
    with pytest.raises(ShapeError, match="contraction"):
        new_eqn(P.LINEAR, [x, w16], form=LinearForm(False, F16))
