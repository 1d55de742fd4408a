"""Block-sparse attention without a device: the traced chains against an independent float64
reference, TopK's order contract, the selection pass forming BlockTopK and SelectedAttention
(and refusing what it cannot prove), and the fused oracle rules bit for bit against the
chains they replace."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.errors import ShapeError
from pootvk.ir import BF16, F16, F32, I32, Eqn, Literal, new_eqn
from pootvk.ir import prims as P
from pootvk.ops import Builder, attention_block_sparse, block_topk, selected_attention
from pootvk.oracle import evaluate
from pootvk.oracle.sparse import topk_indices
from pootvk.passes import compile_graph, selection
from tests.helpers import assert_close
from tests.sparse_ref import ref_attend, ref_select


def _graph(b=2, hq=4, hkv=2, lq=1, d=16, lk=256, bs=16, k=4, hs=None, kv=F32,
           scores=True, softcap=None, guard=True):
    """attention_block_sparse (or, ``guard=False``, its two chains over raw positions)."""
    bb = Builder()
    q = bb.input("q", (b, hq, lq, d))
    kk = bb.input("k", (b, hkv, lk, d), kv)
    vv = bb.input("v", (b, hkv, lk, d), kv)
    qp = bb.input("qpos", (b, lq), I32)
    sc = bb.input("scores", (b, hs or hkv, lq, lk // bs)) if scores else None
    if guard:
        out = attention_block_sparse(bb, q, kk, vv, qp, block_size=bs, top_k=k,
                                     block_scores=sc, softcap=softcap)
    else:
        ids = block_topk(bb, sc, qp, bs, k)
        out = selected_attention(bb, q, kk, vv, ids, qp, bs, softcap=softcap)
    bb.export("out", out)
    return bb.build()


def _inputs(g, rng, qpos, ties=False):
    x = {}
    for s in g.slots:
        shape, dt = s.var.shape, s.var.dtype
        if s.name == "qpos":
            x[s.name] = np.asarray(qpos, np.int32).reshape(shape)
        elif s.name == "scores" and ties:
            x[s.name] = rng.integers(0, 3, shape).astype(np.float32)  # many ties
        else:
            x[s.name] = rng.standard_normal(shape).astype(dt.numpy)
    return x


def test_topk_order_contract():
    x = np.array([[1.0, np.nan, 3.0, 3.0, -0.0, 0.0, -np.inf, 3.0]], np.float32)
    assert topk_indices(x, 3).tolist() == [[2, 3, 7]]  # ties to the lower index
    assert topk_indices(x, 5).tolist() == [[0, 2, 3, 4, 7]]  # -0 == +0: the lower first
    assert topk_indices(x, 7).tolist() == [[0, 2, 3, 4, 5, 6, 7]]  # NaN below -inf
    assert topk_indices(x, 8).tolist() == [list(range(8))]
    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, (5, 3, 50)).astype(np.float32)
    got = topk_indices(y, 7)
    for idx in np.ndindex(y.shape[:-1]):  # against a plain sort by (-value, index)
        want = sorted(sorted(range(50), key=lambda j: (-y[idx][j], j))[:7])
        assert got[idx].tolist() == want


@pytest.mark.parametrize("bs,k", [(16, 1), (16, 4), (64, 4), (16, 16)])
def test_chain_matches_reference(bs, k):
    """The traced chain (the definition) against the loop-by-loop float64 reference,
    with tied scores, a NaN score and rows whose own block is the only one."""
    rng = np.random.default_rng(bs + k)
    lk = 1024
    qpos = [[0], [bs - 1]] if k == 1 else [[bs * 5 + 3], [lk - 1]]
    g = _graph(lk=lk, bs=bs, k=k)
    x = _inputs(g, rng, qpos, ties=True)
    x["scores"][0, 0, 0, 1] = np.nan
    out = evaluate(g, x)["out"]
    ids = ref_select(x["scores"], x["qpos"], bs, k)
    assert_close(out, ref_attend(x["q"], x["k"], x["v"], ids, x["qpos"], bs, 16 ** -0.5),
                 1e-10)


@pytest.mark.parametrize("kw", [
    {}, {"scores": False}, {"kv": F16, "softcap": 20.0}, {"kv": BF16, "hs": 1},
    {"hq": 8, "hkv": 1, "lq": 3}, {"bs": 64, "k": 16, "lk": 2048},
])
def test_pass_forms_both_and_keeps_the_answer(kw):
    g = _graph(**kw)
    c = compile_graph(g)
    assert c.count(P.BLOCK_TOPK) == 1 and c.count(P.SELECTED_ATTENTION) == 1
    assert c.count(P.TOPK) == 0 and c.count(P.GATHER) == 0
    rng = np.random.default_rng(3)
    lk, lq = kw.get("lk", 256), kw.get("lq", 1)
    qpos = rng.integers(0, lk, (2, lq))
    qpos[0, 0] = 3  # a row whose own block is the only one
    x = _inputs(g, rng, qpos, ties=True)
    np.testing.assert_array_equal(evaluate(c, x)["out"], evaluate(g, x)["out"])


def test_unproven_positions_keep_the_attention_primitive():
    """Positions nobody bounds: BlockTopK forms (its semantics hold for any position), the
    attention does not (its kernel reads inside the cache only); same answer."""
    g = _graph(guard=False)
    c = compile_graph(g)
    assert c.count(P.BLOCK_TOPK) == 1 and c.count(P.SELECTED_ATTENTION) == 0
    rng = np.random.default_rng(4)
    x = _inputs(g, rng, [[300], [-5]])  # out of the cache: the chain's own clamp answers
    np.testing.assert_array_equal(evaluate(c, x)["out"], evaluate(g, x)["out"])


def test_ids_of_another_selection_are_not_fused():
    """SelectedAttention's kernel assumes BlockTopK's ids of the same block size."""
    bb = Builder()
    q, kk, vv = (bb.input(n, (1, 2, 1, 8)) if n == "q" else bb.input(n, (1, 2, 128, 8))
                 for n in ("q", "k", "v"))
    qp = bb.index_guard(bb.input("qpos", (1, 1), I32), 0, 127, "qpos")
    sc = bb.input("scores", (1, 2, 1, 8))
    ids = block_topk(bb, sc, qp, 16, 2)
    bb.export("out", selected_attention(bb, q, kk, vv, ids, qp, 32))  # blocks of 32
    g = bb.build()
    c = compile_graph(g)
    assert c.count(P.BLOCK_TOPK) == 1 and c.count(P.SELECTED_ATTENTION) == 0
    x = _inputs(g, np.random.default_rng(5), [[100]])
    np.testing.assert_array_equal(evaluate(c, x)["out"], evaluate(g, x)["out"])


def test_a_changed_chain_keeps_its_primitives():
    """One literal of the chain changed (a masked score at -1e30 instead of -inf): it is no
    longer the definition, so nothing is formed from it and the answer is the chain's."""
    g = _graph()
    eqns = list(g.eqns)
    for i, e in enumerate(eqns):
        if e.prim is P.SELECT and e.out.ndim == 5 and isinstance(e.inputs[2], Literal) \
                and e.inputs[2].value == float("-inf"):
            eqns[i] = Eqn(P.SELECT, (*e.inputs[:2], Literal(-1e30, F32)), e.outputs, e.params)
            break
    else:
        raise AssertionError("no masked-score select in the chain")
    changed = g.replace(eqns)
    out = selection(changed)
    assert out.count(P.SELECTED_ATTENTION) == 0 and out.count(P.BLOCK_TOPK) == 1
    x = _inputs(g, np.random.default_rng(6), [[200], [7]])
    np.testing.assert_array_equal(evaluate(compile_graph(changed), x)["out"],
                                  evaluate(changed, x)["out"])


def test_shape_rules_refuse_with_the_numbers():
    bb = Builder()
    s = bb.input("s", (1, 2, 1, 8))
    qp = bb.input("qp", (1, 1), I32)
    with pytest.raises(ShapeError, match=r"top_k=9 is not in \[1, 8\]"):
        new_eqn(P.BLOCK_TOPK, [s, qp], block_size=16, top_k=9)
    with pytest.raises(ShapeError, match="TopK k=0"):
        bb.topk(s, 0)
    q, k = bb.input("q", (1, 4, 1, 8)), bb.input("k", (1, 2, 100, 8))
    ids = bb.input("ids", (1, 2, 1, 2), I32)
    with pytest.raises(ShapeError, match="key length 100 is not a multiple of the block size 16"):
        selected_attention(bb, q, k, k, ids, qp, 16)
    k3 = bb.input("k3", (1, 2, 128, 8))
    bad = bb.input("bad", (1, 3, 1, 2), I32)
    with pytest.raises(ShapeError, match=r"selected ids \(1, 3, 1, 2\)"):
        selected_attention(bb, q, k3, k3, bad, qp, 16)
    with pytest.raises(ShapeError, match="multiple of the block size 48"):
        attention_block_sparse(bb, q, k3, k3, qp, block_size=48, top_k=1)


@pytest.mark.parametrize("scores", [True, False])
def test_split_key_forms_selected_attention_with_k_shared(scores):
    """Latent attention's split key (k + k_shared, ``ops.split_key``'s semantics) made
    block-sparse: SelectedAttention takes k_shared as its sixth operand; with the in-graph
    indexer the shared channels score too. Same answer as the chain, bit for bit."""
    from pootvk.ops import trace_block_sparse

    b, hq, dn, s, dv, lk, bs = 2, 4, 24, 8, 16, 256, 16
    g = trace_block_sparse((b, hq, 1, dn + s), (b, 1, lk, dn), (b, 1, lk, dv), block_size=bs,
                           top_k=3, scores_shape=(b, 1, 1, lk // bs) if scores else None,
                           kv_dtype=F16, k_shared_shape=(b, 1, lk, s))
    c = compile_graph(g)
    (att,) = [e for e in c.eqns if e.prim is P.SELECTED_ATTENTION]
    assert len(att.inputs) == 6 and att.params["form"].shared_width == s
    assert "keys=split[8]" in str(c)
    rng = np.random.default_rng(8)
    x = _inputs(g, rng, [])
    x["positions"] = np.array([[200], [5]], np.int32)  # the API's name for the positions
    np.testing.assert_array_equal(evaluate(c, x)["out"], evaluate(g, x)["out"])
