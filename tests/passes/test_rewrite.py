import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pootvk.ir import BF16, F16, F32, KeyLayout, MaskKind
from pootvk.ir import prims as P
from pootvk.ir.fused import FUSED
from pootvk.ops import (
    Builder,
    attention_core,
    repeat_kv,
    softmax,
    trace_attention,
    trace_decode_step,
)
from pootvk.oracle import evaluate
from pootvk.passes import attention_rewrite, canonicalize, compile_graph
from tests.helpers import random_inputs

GOLDEN = """\
{ lambda
    a:f32[1,8,1,16] <- input q
    b:f32[1,2,1,16] <- input k_new
    c:f32[1,2,1,16] <- input v_new
    d:f32[1,2,32,16] <- state k_cache
    e:f32[1,2,32,16] <- state v_cache
    f:i32[] <- pos pos in [0, 31]
    g:i32[1,1,1,32] <- const const0
  let
    h:f32[1,2,32,16] = DynamicUpdateSlice d b 0:i32 0:i32 f 0:i32
    i:f32[1,2,32,16] = DynamicUpdateSlice e c 0:i32 0:i32 f 0:i32
    j:f32[1,1,1,32] = Fused[body=Select(Compare[Le](x0, x1), 0.0, -inf)] g f
    k:f32[1,8,1,16] = Attention[scale=0.25 n_rep=4 mask=additive[1,1,1]] a h i j
  in ( out=k, state k_cache=h, state v_cache=i ) }"""


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def test_decode_chain_becomes_exactly_one_attention_eqn():
    g = trace_decode_step(1, 8, 2, 16, 32)
    c = compile_graph(g)
    assert c.count(P.ATTENTION) == 1
    assert c.count(P.MATMUL) == 0 and c.count(P.REDUCE) == 0 and c.count(P.BROADCAST) == 0
    assert str(c) == GOLDEN


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2), hkv=st.integers(1, 2), n_rep=st.sampled_from([1, 4]),
    lq=st.sampled_from([1, 3]), lk=st.sampled_from([1, 7]), dk=st.sampled_from([4, 6]),
    dv=st.sampled_from([4, 10]), mask=st.sampled_from([None, "shared", "per_head"]),
    softcap=st.sampled_from([None, 3.0]), seed=st.integers(0, 1000),
)
def test_rewrite_keeps_the_oracle_answer_bit_for_bit(b, hkv, n_rep, lq, lk, dk, dv, mask,
                                                    softcap, seed):
    hq = hkv * n_rep
    m = None if mask is None else (b, 1 if mask == "shared" else hq, lq, lk)
    g = trace_attention((b, hq, lq, dk), (b, hkv, lk, dk), (b, hkv, lk, dv), m, softcap=softcap)
    c = compile_graph(g)
    assert c.count(P.ATTENTION) == 1 and len(c.eqns) == 1
    e = c.eqns[0]
    form = e.params["form"]
    assert form.n_rep == n_rep and form.softcap == softcap
    assert form.mask is (MaskKind.NONE if mask is None else MaskKind.ADDITIVE)
    ins = random_inputs(g, np.random.default_rng(seed))
    assert same(evaluate(g, ins), evaluate(c, ins))


def test_decode_and_prefill_graphs_keep_their_answers():
    for g in (trace_decode_step(2, 8, 2, 8, 12, softcap=20.0, alibi=True),
              trace_decode_step(1, 4, 1, 8, 12, q_rows=5)):
        c = compile_graph(g)
        assert c.count(P.ATTENTION) == 1
        for pos in (0, 3, 7):
            ins = random_inputs(g, np.random.default_rng(pos), pos=pos)
            assert same(evaluate(g, ins), evaluate(c, ins))


def _chain(dtype=F32, export_probs=False, scale_param=False, mask_rank3=False):
    b = Builder()
    q = b.input("q", (1, 2, 3, 4), dtype)
    k = b.input("k", (1, 2, 5, 4), dtype)
    v = b.input("v", (1, 2, 5, 4), dtype)
    s = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
    s = b.mul(s, b.input("scale", (), dtype) if scale_param else 0.5)
    if mask_rank3:
        s = b.add(s, b.input("mask", (2, 3, 5), dtype))
    p = softmax(b, s)
    b.export("out", b.matmul(p, v))
    if export_probs:
        b.export("probs", p)
    return b.build()


def test_unsupported_variants_keep_their_primitives():
    for g in (_chain(F16), _chain(export_probs=True), _chain(scale_param=True),
              _chain(mask_rank3=True)):
        c = compile_graph(g)
        assert c.count(P.ATTENTION) == 0
        # both matmuls stay; q @ Transpose(k) runs as a Linear reading k untransposed
        assert c.count(P.MATMUL) + c.count(P.LINEAR) == 2
        ins = random_inputs(g, np.random.default_rng(0))
        assert same(evaluate(g, ins), evaluate(c, ins))
    assert compile_graph(_chain()).count(P.ATTENTION) == 1


def test_chain_with_commuted_literal_is_canonicalized_then_fused():
    b = Builder()
    q, k, v = b.input("q", (1, 1, 2, 4)), b.input("k", (1, 1, 3, 4)), b.input("v", (1, 1, 3, 4))
    s = b.mul(0.5, b.matmul(q, b.transpose(k, (0, 1, 3, 2))))  # literal first
    b.export("out", b.matmul(softmax(b, s), v))
    g = b.build()
    assert attention_rewrite(g).count(P.ATTENTION) == 0  # the matcher wants canonical form
    c = compile_graph(g)
    assert c.count(P.ATTENTION) == 1 and c.eqns[0].params["form"].scale == 0.5
    ins = random_inputs(g, np.random.default_rng(1))
    assert same(evaluate(g, ins), evaluate(c, ins))


def test_canonicalize_drops_identities_and_dead_code():
    b = Builder()
    x = b.input("x", (2, 3))
    y = b.reshape(b.reshape(x, (3, 2)), (6,))
    b.exp(x)  # dead
    b.export("y", b.transpose(b.broadcast(y, (6,)), (0,)))
    c = canonicalize(b.build())
    assert [e.prim for e in c.eqns] == [P.RESHAPE]
    assert c.eqns[0].inputs[0] is x


def test_attention_core_scale_default():
    g = trace_attention((1, 1, 1, 64), (1, 1, 2, 64), (1, 1, 2, 64))
    assert compile_graph(g).eqns[0].params["form"].scale == 0.125
    b = Builder()
    q = b.input("q", (1, 1, 1, 4))
    b.export("out", attention_core(b, q, q, q, scale=2.0))
    assert compile_graph(b.build()).eqns[0].params["form"].scale == 2.0  # explicit wins


# --- split keys (latent attention) ----------------------------------------------------------


def _split_chain(hkv=2, kv=F32, shared=(2, 1, 7, 4), convert_parts=False, math=F32):
    """q [2,4,1,12] against concat(k [2,hkv,7,8], broadcast(k_shared)) on the last axis.
    ``math`` F16: the whole chain in F16 (no Convert), which the op cannot type."""
    b = Builder()
    q = b.input("q", (2, 4, 1, 12), math)
    k = b.input("k", (2, hkv, 7, 8), kv)
    ks = b.input("k_shared", shared, kv)
    v = b.input("v", (2, hkv, 7, 6), kv)
    if convert_parts:  # each part converted before the concat (instead of the whole key)
        k, ks, v = (b.convert(x, F32) for x in (k, ks, v))
    key = b.concat([k, b.broadcast(ks, (2, hkv, 7, 4))], axis=3)
    if math is F32:
        b.export("out", attention_core(b, q, key, v))
    else:
        s = b.mul(b.matmul(q, b.transpose(repeat_kv(b, key, 4 // hkv), (0, 1, 3, 2))), 0.5)
        b.export("out", b.matmul(softmax(b, s), repeat_kv(b, v, 4 // hkv)))
    return b.build()


@pytest.mark.parametrize("hkv", [1, 2])  # Hkv=1: canonicalize drops the identity broadcast
@pytest.mark.parametrize("kv", [F32, F16, BF16])
@pytest.mark.parametrize("convert_parts", [False, True])
def test_split_key_is_recognised_and_the_broadcast_key_never_built(hkv, kv, convert_parts):
    if convert_parts and kv is F32:
        return
    g = _split_chain(hkv, kv, convert_parts=convert_parts)
    c = compile_graph(g)
    assert [e.prim for e in c.eqns] == [P.ATTENTION], str(c)  # no Concat, no Broadcast
    e = c.eqns[0]
    form = e.params["form"]
    assert form.keys is KeyLayout.SPLIT and form.shared_width == 4 and form.kv_dtype is kv
    assert [x.shape for x in e.inputs] == [(2, 4, 1, 12), (2, hkv, 7, 8), (2, hkv, 7, 6),
                                           (2, 1, 7, 4)]
    assert e.inputs[1] is g.slot("k").var and e.inputs[3] is g.slot("k_shared").var
    assert form.scale == pytest.approx(12 ** -0.5, rel=1e-12)  # 1/sqrt(Dk), the whole key
    ins = random_inputs(g, np.random.default_rng(hkv))
    assert same(evaluate(g, ins), evaluate(c, ins))


def test_split_key_the_op_cannot_type_is_not_fused_as_split():
    # k_shared broadcast over the batch too ([1,1,Lk,s]): not a split key the op types; the
    # key is built by its primitives (the broadcast and the concat: one fused kernel) and
    # the rest fuses as dense attention
    g = _split_chain(shared=(1, 1, 7, 4))
    c = compile_graph(g)
    assert c.count(P.ATTENTION) == 1 and c.count(FUSED) == 1
    assert str(c.eqns[0].params["body"]) == "Concat[3](x0, Broadcast[(2, 2, 7, 4)](x1))"
    assert c.eqns[-1].params["form"].keys is KeyLayout.DENSE
    ins = random_inputs(g, np.random.default_rng(0))
    assert same(evaluate(g, ins), evaluate(c, ins))
    # a chain whose split key the op types but whose query it cannot (F16 q): primitives
    g = _split_chain(kv=F16, math=F16)
    c = compile_graph(g)
    assert c.count(P.ATTENTION) == 0 and c.count(P.MATMUL) == 2
    assert "Concat[3]" in str(c.eqns[0].params["body"])  # the key (and its GQA repeat)
    ins = random_inputs(g, np.random.default_rng(1))
    assert same(evaluate(g, ins), evaluate(c, ins))


def test_split_key_form_is_validated():
    from pootvk.errors import ShapeError
    from pootvk.ir import AttentionForm, attention_operands

    with pytest.raises(ShapeError, match="split key needs s >= 1"):
        AttentionForm(scale=1.0, keys=KeyLayout.SPLIT)
    with pytest.raises(ShapeError, match="shared_width=3"):
        AttentionForm(scale=1.0, shared_width=3)
    form = AttentionForm(scale=1.0, keys=KeyLayout.SPLIT, shared_width=4)
    assert form.roles == ("q", "k", "v", "k_shared") and "keys=split[4]" in form.describe()
    with pytest.raises(ShapeError, match="takes 4 operands"):
        attention_operands(form, (1, 2, 3))


def test_split_key_with_a_live_length_fuses_both():
    g = trace_attention((2, 4, 1, 12), (2, 2, 7, 8), (2, 2, 7, 6), k_shared_shape=(2, 1, 7, 4),
                        lengths=True, kv_dtype=F16)
    c = compile_graph(g)
    (att,) = [e for e in c.eqns if e.prim is P.ATTENTION]
    form = att.params["form"]
    assert form.live and form.keys is KeyLayout.SPLIT and form.kv_dtype is F16
    assert form.roles == ("q", "k", "v", "len", "k_shared")
    assert c.count(P.CONCAT) == 0 and c.count(P.BROADCAST) == 0
    ins = random_inputs(g, np.random.default_rng(3))
    ins["lengths"] = np.array([3, 7], np.int32)
    assert same(evaluate(g, ins), evaluate(c, ins))
