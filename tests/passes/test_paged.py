"""Paged keys in the tracer, the oracle and the attention rewrite (issue 11).

The traced chain (Gather + Transpose of the pools, then the dense chain) is checked against
an independent float64 reference over block tables (scattered blocks, a block shared by two
rows, a partial last block, lengths 1 and Lk); the rewrite forms the paged-key Attention
exactly when the read map's range proves every word a pool slot, with the oracle's answer
unchanged bit for bit; bad write and read maps are refused at bind.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pootvk.errors import BindError, ShapeError, SlotRangeError, WriteMapError
from pootvk.ir import BF16, F16, F32, I32, ForwardSlotMap, KeyLayout, SlotKind
from pootvk.ir import prims as P
from pootvk.ops import (
    Builder,
    attention_core,
    paged_attention,
    paged_view,
    paged_write,
    trace_attention,
    trace_paged_step,
)
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph
from tests.helpers import assert_close, reference_attention

BLOCK = 4  # tokens per block here (the engine's is 16): small tables, several blocks a row
POOL_BLOCKS = 6
S = POOL_BLOCKS * BLOCK  # pool slots
LK = 10  # logical keys a row: 2.5 blocks, so every row's last block is partial
#: per row, its pool blocks in logical order: scattered (row 0), block 5 shared by rows 0
#: and 1 (a common prefix), rows 1 and 2 sharing block 2 at different logical positions
TABLES = [[5, 1, 3], [5, 0, 2], [2, 4, 0]]


def read_map(tables=TABLES, lk=LK) -> np.ndarray:
    """Each row's logical position t -> its pool slot: block table[t // BLOCK], offset
    t % BLOCK (written from the definition, not from pootvk)."""
    return np.array([[tab[t // BLOCK] * BLOCK + t % BLOCK for t in range(lk)]
                     for tab in tables], np.int32)


def gather_ref(pool: np.ndarray, read: np.ndarray) -> np.ndarray:
    """The logical [B, Hkv, Lk, D] view of pool [S, Hkv, D], element by element in float64:
    key t of row b and head g is pool row read[b, t], head g."""
    b, lk = read.shape
    _, hkv, d = pool.shape
    out = np.empty((b, hkv, lk, d))
    for i in range(b):
        for t in range(lk):
            for g in range(hkv):
                out[i, g, t] = pool[read[i, t], g].astype(np.float64)
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def _inputs(g, rng, kv=F32, lengths=(1, LK, 7)):
    ins = {}
    for s in g.slots:
        if s.var.dtype.is_float:
            x = rng.standard_normal(s.var.shape)
            # the stored values (bf16 is bound as f32 and rounded at bind): the reference
            # reads the very values the pools hold
            store = {F16: np.float16, BF16: ml_dtypes.bfloat16}.get(s.var.dtype, np.float32)
            ins[s.name] = x.astype(store).astype(s.var.dtype.numpy)
    ins["read"] = read_map()
    if "lengths" in {s.name for s in g.slots}:
        ins["lengths"] = np.array(lengths, np.int32)
    return ins


@pytest.mark.parametrize("kv", [F32, F16, BF16])
@pytest.mark.parametrize("n_rep", [1, 2])
@pytest.mark.parametrize("variant", ["plain", "live", "mask+softcap", "live+mask"])
def test_paged_chain_matches_the_float64_reference(kv, n_rep, variant):
    """Block tables with scattered and shared blocks and a partial last block; lengths 1,
    Lk and one mid-block: the traced chain's oracle (and the compiled graph's, which holds
    the paged-key Attention) against the gather + softmax attention written from the
    definition."""
    hkv, d, dv, lq = 2, 8, 6, 2
    b = len(TABLES)
    live, masked = "live" in variant, "mask" in variant
    softcap = 2.5 if "softcap" in variant else None
    g = trace_attention((b, hkv * n_rep, lq, d), (b, hkv, LK, d), (b, hkv, LK, dv),
                        mask_shape=(b, 1, lq, LK) if masked else None, softcap=softcap,
                        kv_dtype=kv, lengths=live, pool_slots=S)
    rng = np.random.default_rng(n_rep * 7 + len(variant))
    ins = _inputs(g, rng, kv)
    if masked:  # a causal-looking mask with a -inf prefix hole and finite offsets
        ins["mask"] = np.where(rng.random((b, 1, lq, LK)) < 0.2, -np.inf,
                               rng.standard_normal((b, 1, lq, LK))).astype(np.float32)
        ins["mask"][:, :, :, -1] = 0.0  # every row sees its last key when not live
    k, v = gather_ref(ins["k"], ins["read"]), gather_ref(ins["v"], ins["read"])
    mask = np.zeros((b, 1, lq, LK)) if not masked else ins["mask"].astype(np.float64)
    if live:
        visible = np.arange(LK)[None, :] < ins["lengths"][:, None]  # [B, Lk]
        mask = mask + np.where(visible, 0.0, -np.inf)[:, None, None, :]
    ref = reference_attention(ins["q"], k, v, mask, softcap=softcap)
    traced = evaluate(g, ins)["out"]
    assert_close(traced, ref, 1e-10)
    c = compile_graph(g)
    (att,) = [e for e in c.eqns if e.prim is P.ATTENTION]
    form = att.params["form"]
    assert form.keys is KeyLayout.PAGED and form.live is live and form.kv_dtype is kv
    assert form.roles[-1] == "read" and att.inputs[-1] is g.slot("read").var
    assert att.inputs[1] is g.slot("k").var and att.inputs[2] is g.slot("v").var
    assert c.count(P.GATHER) == 0 and c.count(P.TRANSPOSE) == 0  # no view is built
    assert str(c).count("keys=paged") == 1
    assert same(evaluate(g, ins), evaluate(c, ins))  # the fused oracle: bit-identical


def _read_graph(read_kind: str, kv=F32, v_slots=S, live=False):
    """q [2,4,1,8] over pools k [S,2,8], v [v_slots,2,8] through a read map bound as
    ``read_kind``: slotmap (declared [0, S-1]), wide (declared [0, S]), negative (declared
    [-1, S-1]), unknown (an i32 input, no range), sliced (a slot map of 12 columns, the
    attention reading the first 10 of them: the range carries through the Slice)."""
    b = Builder()
    q = b.input("q", (2, 4, 1, 8))
    k = b.input("k", (S, 2, 8), kv)
    v = b.input("v", (v_slots, 2, 8), kv)
    if read_kind == "slotmap":
        read = b.slotmap("read", (2, LK), S)
    elif read_kind == "wide":
        read = b.slot("read", SlotKind.SLOTMAP, (2, LK), I32, (0, S))
    elif read_kind == "negative":
        read = b.slot("read", SlotKind.SLOTMAP, (2, LK), I32, (-1, S - 1))
    elif read_kind == "unknown":
        read = b.input("read", (2, LK), I32)
    else:
        read = b.slice(b.slotmap("read", (2, LK + 2), S), (0, 0), (2, LK))
    n = b.slot("len", SlotKind.LEN, (2,), I32, (1, LK)) if live else None
    b.export("out", paged_attention(b, q, k, v, read, length=n))
    return b.build()


@pytest.mark.parametrize("kv", [F32, F16])
@pytest.mark.parametrize("live", [False, True])
@pytest.mark.parametrize("read_kind, paged", [
    ("slotmap", True), ("sliced", True),
    ("wide", False), ("negative", False), ("unknown", False),
])
def test_rewrite_forms_the_paged_key_only_when_the_range_proves_it(read_kind, paged, kv,
                                                                     live):
    g = _read_graph(read_kind, kv, live=live)
    c = compile_graph(g)
    (att,) = [e for e in c.eqns if e.prim is P.ATTENTION]
    form = att.params["form"]
    assert form.live is live and form.kv_dtype is kv
    if paged:
        assert form.keys is KeyLayout.PAGED
        assert form.roles == ("q", "k", "v", *(("len",) if live else ()), "read")
        assert [x.shape for x in att.inputs[:3]] == [(2, 4, 1, 8), (S, 2, 8), (S, 2, 8)]
        assert c.count(P.GATHER) == 0 and len(c.eqns) == 1 + (read_kind == "sliced")
    else:  # the attention stays over the gathered view: dense, K/V [B, Hkv, Lk, D]
        assert form.keys is KeyLayout.DENSE
        assert [x.shape for x in att.inputs[1:3]] == [(2, 2, LK, 8)] * 2
        assert "Gather" in str(c)
    rng = np.random.default_rng(5)
    ins = {"q": rng.standard_normal((2, 4, 1, 8)).astype(np.float32),
           "k": rng.standard_normal((S, 2, 8)).astype(kv.numpy),
           "v": rng.standard_normal((S, 2, 8)).astype(kv.numpy)}
    reads = [read_map(TABLES[:2], LK + 2 if read_kind == "sliced" else LK)]
    if read_kind in ("wide", "unknown"):  # words the pool lacks bind: Gather clamps them,
        r = reads[0].copy()  # in the compiled graph as in the traced one
        r[0, 3], r[1, 0] = S, S if read_kind == "wide" else S + 7
        reads.append(r)
    for r in reads:
        ins["read"] = r
        if live:
            ins["len"] = np.array([3, LK], np.int32)
        # (the traced graph's guard on len, proven by the LEN slot's range, is elided)
        assert np.array_equal(evaluate(g, ins)["out"], evaluate(c, ins)["out"])


def test_pools_the_op_cannot_type_stay_over_the_gathered_view():
    # pools of different slot counts (v has 20): the paged form does not type, the dense
    # form over the gathered view does; same answer
    b = Builder()
    q, read = b.input("q", (2, 4, 1, 8)), b.slotmap("read", (2, LK + 2), 20)
    k, v = b.input("k", (S, 2, 8)), b.input("v", (20, 2, 8))
    b.export("out", attention_core(b, q, paged_view(b, k, read), paged_view(b, v, read)))
    g = b.build()
    c = compile_graph(g)
    (att,) = [e for e in c.eqns if e.prim is P.ATTENTION]
    assert att.params["form"].keys is KeyLayout.DENSE
    rng = np.random.default_rng(2)
    ins = {"q": rng.standard_normal((2, 4, 1, 8)).astype(np.float32),
           "k": rng.standard_normal((S, 2, 8)).astype(np.float32),
           "v": rng.standard_normal((20, 2, 8)).astype(np.float32),
           "read": read_map([[4, 1, 3], [2, 0, 1]], LK + 2)}  # slots of both pools
    assert same(evaluate(g, ins), evaluate(c, ins))


@pytest.mark.parametrize("tokens", [1, 2])  # a decode step (live) and a prefill chunk (mask)
def test_paged_step_writes_then_reads_its_new_rows(tokens):
    """trace_paged_step: the new rows written through ``write`` (a padding row's -1 writes
    nothing) are read by the same step's attention through ``read``; the pools after the
    step and the output against the definition. Decode: live lengths; a chunk of two tokens
    a row: the causal mask over each row's block table."""
    bsz, hq, hkv, d = 3, 4, 2, 8
    live = tokens == 1
    g = trace_paged_step(bsz, hq, hkv, d, S, LK, tokens=tokens, live=live)
    c = compile_graph(g)
    assert [e.prim for e in c.eqns] == [P.SCATTER_UPDATE, P.SCATTER_UPDATE, P.ATTENTION]
    assert c.eqns[2].params["form"].keys is KeyLayout.PAGED
    assert c.eqns[2].inputs[1] is c.eqns[0].out  # the attention reads the written pool
    rng = np.random.default_rng(11)
    read = read_map()
    # row b's new tokens go to its logical positions pos[b] .. pos[b] + tokens - 1; row 2
    # is padding (writes nothing; with a length of 1 it reads its slot 0)
    pos = np.array([2, LK - tokens, 0])
    write = np.array([read[b, pos[b] + i] if b < 2 else -1
                      for b in range(bsz) for i in range(tokens)], np.int32)
    n = bsz * tokens
    ins = {"q": rng.standard_normal((bsz, hq, tokens, d)).astype(np.float32),
           "k_new": rng.standard_normal((n, hkv, d)).astype(np.float32),
           "v_new": rng.standard_normal((n, hkv, d)).astype(np.float32),
           "k_pool": rng.standard_normal((S, hkv, d)).astype(np.float32),
           "v_pool": rng.standard_normal((S, hkv, d)).astype(np.float32),
           "write": write, "read": read}
    kp, vp = ins["k_pool"].copy(), ins["v_pool"].copy()
    for i, slot in enumerate(write):
        if slot >= 0:
            kp[slot], vp[slot] = ins["k_new"][i], ins["v_new"][i]
    # query i of row b sees logical keys t <= pos[b] + i
    visible = np.arange(LK)[None, None, :] <= (pos[:, None] + np.arange(tokens))[:, :, None]
    mask = np.where(visible, 0.0, -np.inf)[:, None]  # [B, 1, T, Lk]
    if live:
        ins["len"] = (pos + 1).astype(np.int32)
    else:
        ins["mask"] = mask.astype(np.float32)
    ref = reference_attention(ins["q"], gather_ref(kp, read), gather_ref(vp, read), mask)
    for graph in (g, c):
        out = evaluate(graph, ins)
        np.testing.assert_array_equal(out["k_pool"], kp)
        np.testing.assert_array_equal(out["v_pool"], vp)
        assert_close(out["out"], ref, 1e-10)
    a, b = evaluate(g, ins), evaluate(c, ins)
    if live:
        assert a.pop("len").tolist() == [0, 0]  # the guard the LEN slot's range proves
    assert same(a, b)


# --- the maps at bind --------------------------------------------------------------------


def _step_inputs(g, rng):
    ins = {s.name: rng.standard_normal(s.var.shape).astype(np.float32)
           for s in g.slots if s.var.dtype.is_float}
    ins["read"] = read_map()
    ins["write"] = np.array([1, 2, -1], np.int32)
    ins["len"] = np.array([1, 2, 3], np.int32)
    return ins


@pytest.mark.parametrize("write, index, value, why", [
    ([1, S, -1], 1, S, "not a slot of the pool"),
    ([-2, 0, 1], 0, -2, "not a slot of the pool"),
    ([7, 3, 7], 2, 7, "slot named twice (first at word 0)"),
    ([-1, 4, 4], 2, 4, "slot named twice (first at word 1)"),
])
def test_write_map_refusals_are_typed_and_name_the_word(write, index, value, why):
    g = trace_paged_step(3, 4, 2, 8, S, LK, live=True)
    ins = _step_inputs(g, np.random.default_rng(0))
    for bad in (np.array(write, np.int32), np.array(write, np.int64), list(write)):
        ins["write"] = bad
        with pytest.raises(WriteMapError) as err:
            evaluate(g, ins)
        e = err.value
        assert (e.slot, e.index, e.value, e.pool_slots, e.why) == ("write", index, value, S, why)
        assert f"word {index} = {value}" in str(e) and "'write'" in str(e)
    with pytest.raises(WriteMapError):  # the checked map itself refuses to be built
        ForwardSlotMap(write, S)


def test_a_checked_write_map_binds_and_repeats_of_minus_one_are_padding():
    g = trace_paged_step(3, 4, 2, 8, S, LK, live=True)
    ins = _step_inputs(g, np.random.default_rng(1))
    ins["write"] = np.array([-1, 5, -1], np.int32)
    plain = evaluate(g, ins)
    ins["write"] = ForwardSlotMap([-1, 5, -1], S)
    assert same(evaluate(g, ins), plain)
    m = ForwardSlotMap(np.array([3, -1, 0]), S)
    assert np.asarray(m).dtype == np.int32 and not np.asarray(m).flags.writeable
    # a map checked against another pool is checked again against the slot's at bind
    ins["write"] = ForwardSlotMap([1, 2, 3], S + 8)
    evaluate(g, ins)
    ins["write"] = ForwardSlotMap([1, 2, S + 3], S + 8)
    with pytest.raises(WriteMapError, match=f"word 2 = {S + 3}"):
        evaluate(g, ins)
    ins["write"] = np.array([1, 2], np.int32)
    with pytest.raises(BindError, match="'write'"):
        evaluate(g, ins)


def test_read_map_words_outside_the_pool_are_refused_at_bind():
    g = trace_paged_step(3, 4, 2, 8, S, LK, live=True)
    ins = _step_inputs(g, np.random.default_rng(2))
    for word in (S, -1):
        ins["read"] = read_map()
        ins["read"][2, 9] = word
        with pytest.raises(SlotRangeError) as err:
            evaluate(g, ins)
        assert (err.value.slot, err.value.value, err.value.lo, err.value.hi) == \
            ("read", word, 0, S - 1)
    ins["read"] = read_map()
    ins["read"][0, 0] = ins["read"][1, 0]  # a repeated read slot is legal (shared blocks)
    evaluate(g, ins)


def test_map_declarations_are_checked():
    b = Builder()
    with pytest.raises(ShapeError, match="write map 'w'"):
        b.slot("w", SlotKind.WRITEMAP, (4,), I32, (0, 7))  # -1 must be allowed
    with pytest.raises(ShapeError, match="write map 'w2'"):
        b.slot("w2", SlotKind.WRITEMAP, (2, 2), I32, (-1, 7))
    with pytest.raises(ShapeError, match="read map 'r'"):
        b.slot("r", SlotKind.SLOTMAP, (2, 4), F32)
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ShapeError, match="at least one slot"):
            b.slotmap("r0", (1, 2), bad)
        with pytest.raises(ShapeError, match="at least one slot"):
            b.writemap("w0", 2, bad)
    pool = b.state("pool", (8, 2, 4))
    with pytest.raises(ShapeError, match="paged write"):
        paged_write(b, pool, b.input("rows", (3, 2, 4)), b.writemap("w3", 2, 8))
    with pytest.raises(ShapeError, match="pools differ"):
        paged_attention(b, b.input("q", (1, 2, 1, 4)), pool, b.input("v", (9, 2, 4)),
                        b.slotmap("r2", (1, 5), 8))


def test_printed_paged_graph():
    g = trace_attention((1, 2, 1, 4), (1, 1, 3, 4), (1, 1, 3, 4), pool_slots=8)
    assert str(compile_graph(g)) == """\
{ lambda
    a:f32[1,2,1,4] <- input q
    b:f32[8,1,4] <- input k
    c:f32[8,1,4] <- input v
    d:i32[1,3] <- slotmap read in [0, 7]
  let
    e:f32[1,2,1,4] = Attention[scale=0.5 n_rep=2 mask=none keys=paged] a b c d
  in ( out=e ) }"""


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3), hkv=st.integers(1, 2), n_rep=st.sampled_from([1, 3]),
    lq=st.sampled_from([1, 2]), lk=st.integers(1, 9), blocks=st.integers(1, 5),
    dv=st.sampled_from([4, 6]), mask=st.booleans(), live=st.booleans(),
    softcap=st.sampled_from([None, 3.0]), kv=st.sampled_from([F32, F16]),
    seed=st.integers(0, 10_000),
)
def test_paged_rewrite_random_block_tables(b, hkv, n_rep, lq, lk, blocks, dv, mask, live,
                                            softcap, kv, seed):
    """Random block tables (blocks of 2 slots drawn with repeats: shared blocks) over a pool
    of ``blocks`` blocks: the compiled paged form and the traced chain agree bit for bit,
    and both match the float64 reference."""
    rng = np.random.default_rng(seed)
    pool, d = 2 * blocks, 4
    g = trace_attention((b, hkv * n_rep, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv),
                        mask_shape=(1, hkv * n_rep, lq, lk) if mask else None,
                        softcap=softcap, kv_dtype=kv, lengths=live, pool_slots=pool)
    c = compile_graph(g)
    (att,) = [e for e in c.eqns if e.prim is P.ATTENTION]
    assert att.params["form"].keys is KeyLayout.PAGED
    tables = rng.integers(0, blocks, (b, (lk + 1) // 2))
    ins = {"q": rng.standard_normal((b, hkv * n_rep, lq, d)).astype(np.float32),
           "k": rng.standard_normal((pool, hkv, d)).astype(kv.numpy),
           "v": rng.standard_normal((pool, hkv, dv)).astype(kv.numpy),
           "read": (tables[:, np.arange(lk) // 2] * 2 + np.arange(lk) % 2).astype(np.int32)}
    full = np.zeros((1, hkv * n_rep, lq, lk))
    if mask:
        ins["mask"] = rng.standard_normal(full.shape).astype(np.float32)
        full = ins["mask"].astype(np.float64)
    if live:
        ins["lengths"] = rng.integers(1, lk + 1, b).astype(np.int32)
        full = full + np.where(np.arange(lk)[None, :] < ins["lengths"][:, None], 0.0,
                               -np.inf)[:, None, None, :]
    traced, fused = evaluate(g, ins), evaluate(c, ins)
    assert same(traced, fused)
    ref = reference_attention(ins["q"], gather_ref(ins["k"], ins["read"]),
                              gather_ref(ins["v"], ins["read"]), full, softcap=softcap)
    assert_close(fused["out"], ref, 1e-9)


def test_a_paged_write_under_an_unproven_length_is_refused_typed():
    """A live length the graph cannot prove keeps its index guard, and a guard's failure
    must leave the state unchanged; a ScatterUpdate takes no gates, so compile refuses the
    graph (UnsupportedPrimitive) rather than write a pool it could not undo. The same step
    with a LEN slot declared in [1, Lk] (``trace_paged_step``) needs no guard."""
    from pootvk.errors import UnsupportedPrimitive

    b = Builder()
    q = b.input("q", (2, 4, 1, 8))
    kp, vp = b.state("k_pool", (S, 2, 8)), b.state("v_pool", (S, 2, 8))
    w = b.writemap("write", 2, S)
    kp2 = paged_write(b, kp, b.input("k_new", (2, 2, 8)), w)
    vp2 = paged_write(b, vp, b.input("v_new", (2, 2, 8)), w)
    n = b.input("len", (2,), I32)  # no declared range
    b.export("out", paged_attention(b, q, kp2, vp2, b.slotmap("read", (2, LK), S), length=n))
    b.set_state("k_pool", kp2)
    b.set_state("v_pool", vp2)
    with pytest.raises(UnsupportedPrimitive, match="k_pool"):
        compile_graph(b.build())
    assert compile_graph(trace_paged_step(2, 4, 2, 8, S, LK, live=True)).validations == {}
