import pytest

from pootvk.errors import ShapeError
from pootvk.ir import prims as P
from pootvk.ops import Builder, attention_core, trace_attention, trace_decode_step

SEED_CHAIN = [
    "DynamicUpdateSlice", "DynamicUpdateSlice",          # k/v written at pos
    "Iota", "Compare", "Select",                          # causal mask from Iota vs pos
    "Reshape", "Broadcast", "Reshape",                    # repeat_kv(k)
    "Reshape", "Broadcast", "Reshape",                    # repeat_kv(v)
    "Transpose", "MatMul", "Mul", "Add",                  # scores, scale, mask
    "Reduce", "Sub", "Unary", "Reduce", "Div",            # max-subtracted softmax
    "MatMul",
]


def prims(g):
    return [e.prim.name for e in g.eqns]


def test_decode_step_is_exactly_the_seed_chain():
    g = trace_decode_step(1, 8, 2, 64, 32)
    assert prims(g) == SEED_CHAIN
    red = [e.params["op"].value for e in g.eqns if e.prim is P.REDUCE]
    assert red == ["Max", "Sum"]
    assert [e.params["op"].value for e in g.eqns if e.prim is P.UNARY] == ["Exp"]
    assert set(g.states) == {"k_cache", "v_cache"}
    assert g.slot("pos").range == (0, 31)


def test_no_repeat_when_heads_match():
    g = trace_decode_step(2, 4, 4, 16, 8)
    assert "Broadcast" not in prims(g)


def test_softcap_and_alibi_chain():
    g = trace_decode_step(1, 4, 2, 16, 8, softcap=30.0, alibi=True)
    p = prims(g)
    i = p.index("Mul")
    assert p[i : i + 5] == ["Mul", "Div", "Unary", "Mul", "Add"]
    assert g.slot("alibi").var.shape == (1, 4, 1, 8)


def test_prefill_causal_mask_uses_row_iota():
    g = trace_decode_step(1, 2, 2, 8, 16, q_rows=5)
    iotas = [e.params["axis"] for e in g.eqns if e.prim is P.IOTA]
    assert iotas == [3, 2]
    assert g.slot("pos").range == (0, 11)


def test_value_width_may_differ():
    g = trace_attention((1, 4, 3, 40), (1, 2, 9, 40), (1, 2, 9, 72))
    assert g.exports["out"].shape == (1, 4, 3, 72)


def test_bad_attention_shapes():
    b = Builder()
    q = b.input("q", (1, 6, 1, 8))
    k = b.input("k", (1, 4, 5, 8))
    with pytest.raises(ShapeError, match="multiple"):
        attention_core(b, q, k, k)
    with pytest.raises(ShapeError, match="softcap"):
        attention_core(b, q, b.input("k2", (1, 3, 5, 8)), b.input("v2", (1, 3, 5, 8)),
                       softcap=0.0)
    with pytest.raises(ShapeError, match="decode"):
        from pootvk.ops import attention_masked

        kc = b.state("kc", (1, 3, 9, 8))
        attention_masked(b, b.input("q3", (1, 3, 2, 8)), b.input("kn", (1, 3, 2, 8)),
                         b.input("vn", (1, 3, 2, 8)), kc, kc, b.pos("p", 0, 7))


def test_decode_step_dimensions_are_checked():
    with pytest.raises(ShapeError, match="capacity"):
        trace_decode_step(1, 4, 2, 8, 0)
    with pytest.raises(ShapeError, match="multiple"):
        trace_decode_step(1, 6, 4, 8, 16)
    with pytest.raises(ShapeError, match="fit"):
        trace_decode_step(1, 4, 2, 8, 4, q_rows=5)
