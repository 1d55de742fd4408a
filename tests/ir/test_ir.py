import numpy as np
import pytest

from pootvk.errors import BindError, ShapeError, SlotRangeError
from pootvk.ir import F32, I32, Eqn, Params, SlotKind, check_graph
from pootvk.ir import prims as P
from pootvk.ir.bind import check_bind
from pootvk.ops import Builder, trace_decode_step

GOLDEN_DECODE = """\
{ lambda
    a:f32[1,2,1,4] <- input q
    b:f32[1,2,1,4] <- input k_new
    c:f32[1,2,1,4] <- input v_new
    d:f32[1,2,8,4] <- state k_cache
    e:f32[1,2,8,4] <- state v_cache
    f:i32[] <- pos pos in [0, 7]
  let
    g:f32[1,2,8,4] = DynamicUpdateSlice d b 0:i32 0:i32 f 0:i32
    h:f32[1,2,8,4] = DynamicUpdateSlice e c 0:i32 0:i32 f 0:i32
    i:i32[1,1,1,8] = Iota[axis=3 dtype=i32 shape=(1, 1, 1, 8)]
    j:bool[1,1,1,8] = Compare[op=Le] i f
    k:f32[1,1,1,8] = Select j 0.0:f32 -inf:f32
    l:f32[1,2,4,8] = Transpose[perm=(0, 1, 3, 2)] g
    m:f32[1,2,1,8] = MatMul a l
    n:f32[1,2,1,8] = Mul m 0.5:f32
    o:f32[1,2,1,8] = Add n k
    p:f32[1,2,1,1] = Reduce[axis=3 keepdim=True op=Max] o
    q:f32[1,2,1,8] = Sub o p
    r:f32[1,2,1,8] = Unary[op=Exp] q
    s:f32[1,2,1,1] = Reduce[axis=3 keepdim=True op=Sum] r
    t:f32[1,2,1,8] = Div r s
    u:f32[1,2,1,4] = MatMul t h
  in ( out=u, state k_cache=g, state v_cache=h ) }"""


def test_print_graph_golden():
    assert str(trace_decode_step(1, 2, 2, 4, 8)) == GOLDEN_DECODE


def test_params_hashable_and_immutable():
    a, b = Params(x=1, y=(2, 3)), Params({"y": (2, 3), "x": 1})
    assert a == b and hash(a) == hash(b)
    assert dict(a) == {"x": 1, "y": (2, 3)}
    with pytest.raises(TypeError):
        a["x"] = 2  # type: ignore[index]


def test_type_errors_where_written():
    b = Builder()
    x = b.input("x", (2, 3))
    y = b.input("y", (4, 3))
    with pytest.raises(ShapeError, match="do not broadcast"):
        b.add(x, y)
    with pytest.raises(ShapeError, match="contraction"):
        b.matmul(x, y)
    with pytest.raises(ShapeError, match="changes the element count"):
        b.reshape(x, (5,))
    with pytest.raises(ShapeError, match="declared twice"):
        b.input("x", (1,))


def test_check_graph_catches_a_mistyped_eqn():
    g = trace_decode_step(1, 2, 2, 4, 8)
    check_graph(g)  # the untouched graph passes: the refusals below are the edits' doing
    e = g.eqns[-1]
    bad = Eqn(e.prim, e.inputs, e.outputs, Params(dict(e.params), extra=1))
    with pytest.raises(ShapeError, match="params"):  # undeclared params are refused
        check_graph(g.replace([*g.eqns[:-1], bad]))
    wrong = Eqn(P.RESHAPE, (e.inputs[0],), e.outputs, Params(shape=(1, 2, 1, 8)))
    with pytest.raises(ShapeError):
        check_graph(g.replace([*g.eqns[:-1], wrong]))


def test_bind_checks_shape_dtype_range_and_names():
    b = Builder()
    b.input("x", (2,), F32)
    b.pos("pos", 0, 9)
    g = b.build()
    ok = check_bind(g, {"x": np.zeros(2), "pos": 3})
    assert ok["x"].dtype == np.float32 and ok["pos"].dtype == np.int32
    with pytest.raises(BindError, match="'x'.*shape"):
        check_bind(g, {"x": np.zeros(3), "pos": 0})
    with pytest.raises(BindError, match="dtype"):
        check_bind(g, {"x": np.zeros(2, np.int32), "pos": 0})
    with pytest.raises(SlotRangeError) as e:
        check_bind(g, {"x": np.zeros(2), "pos": 10})
    assert (e.value.value, e.value.lo, e.value.hi) == (10, 0, 9)
    with pytest.raises(SlotRangeError):
        check_bind(g, {"x": np.zeros(2), "pos": -1})
    with pytest.raises(SlotRangeError):
        check_bind(g, {"x": np.zeros(2), "pos": 2**40})
    with pytest.raises(BindError, match="slot name"):
        check_bind(g, {"x": np.zeros(2), "pos": 0, "typo": 1})
    with pytest.raises(BindError, match="nothing"):
        check_bind(g, {"x": np.zeros(2)})


def test_integer_slots_only_carry_ranges():
    b = Builder()
    with pytest.raises(ShapeError):
        b.slot("f", SlotKind.LEN, (1,), F32, (0, 1))
    assert b.pos("p", 0, 3).dtype is I32


def test_count_takes_a_prim_not_a_name():
    g = trace_decode_step(1, 2, 2, 4, 8)
    assert g.count(P.DYNAMIC_UPDATE_SLICE) == 2
    with pytest.raises(TypeError, match="Prim"):
        g.count("DynamicUpdateSlice")  # a name would silently count nothing


def test_the_paged_key_form_types_its_pools_and_read_map():
    """A paged form's k/v are pools [S, Hkv, D] read through read [B, Lk] (i32): the shape
    rule checks them and the logical [B, Hkv, Lk, D] K/V they stand for."""
    from pootvk.errors import ShapeError
    from pootvk.ir import F16, F32, I32
    from pootvk.ir.attention_form import AttentionForm, KeyLayout, check_form_operands

    form = AttentionForm(scale=0.125, n_rep=4, keys=KeyLayout.PAGED, kv_dtype=F16, live=True)
    assert form.roles == ("q", "k", "v", "len", "read")
    shapes = [(2, 8, 1, 64), (96, 2, 64), (96, 2, 32), (2,), (2, 40)]
    dts = [F32, F16, F16, I32, I32]
    assert check_form_operands(form, shapes, dts) == ((2, 8, 1, 32), F32)
    with pytest.raises(ShapeError, match="read map must be i32"):
        check_form_operands(form, shapes, [F32, F16, F16, I32, F32])
    with pytest.raises(ShapeError, match="rows"):
        check_form_operands(form, shapes[:4] + [(3, 40)], dts)
    with pytest.raises(ShapeError, match="pools differ"):
        check_form_operands(form, [shapes[0], (96, 2, 64), (95, 2, 32), (2,), (2, 40)], dts)
