"""The paged-key Attention form (issue 11) on the live device: a fused eqn whose k and v are
pools [S, Hkv, D] read through an i32 map read [B, Lk] (key t of row b, KV head g is pool
row read[b, t] * Hkv + g), planned on every schedule and run against the float64 reference
over the gathered [B, Hkv, Lk, D] view, and bit for bit against the dense kernel of the same
schedule over that view (only the address differs). Block tables: scattered blocks, blocks
shared by two rows, a partial last block, words pointing anywhere in the pool; pool rows no
active key names hold NaN, so a wrong address cannot go unseen."""

from __future__ import annotations

import zlib
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pootvk.errors import DtypeLowering
from pootvk.ir import F32, I32, AttentionForm, DType, KeyLayout, MaskKind, new_eqn
from pootvk.ir import prims as P
from pootvk.ir.attention_form import mask_bcast
from pootvk.ops import Builder
from pootvk.plan import (
    AttentionRequest,
    DecodeCombineRequest,
    DecodeRequest,
    forced_schedule,
    plan_graph,
)
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan
from tests.helpers import assert_close, examples, reference_attention
from tests.vk.test_vk_attention import SCHEDULES as DENSE_SCHEDULES

BLOCK = 16
#: every schedule, forced: the dense suite's, a grouped kernel with splits forced to 1, and
#: the grouped kernel without the software prefetch (the paged lookup without look-ahead)
SCHEDULES = {**DENSE_SCHEDULES, "split1": {"schedule": "grouped", "splits": 1},
             "no_prefetch": {"schedule": "grouped", "splits": 2, "prefetch": False}}
NP_DTYPE = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
TABLES = ("scattered", "shared", "anywhere")


def block_table_map(rng: np.random.Generator, b: int, lk: int, slots: int,
                    kind: str) -> np.ndarray:
    """read [B, Lk] i32 of a block table: ``scattered`` rows own distinct blocks in random
    pool order; ``shared``: row 1 also reads row 0's first blocks (a shared prefix, its
    last shared block partial in row 0's view when Lk is not a multiple of 16); ``anywhere``:
    every word an independent slot of the pool (repeats allowed)."""
    if kind == "anywhere":
        return rng.integers(0, slots, (b, lk)).astype(np.int32)
    nblk = -(-lk // BLOCK)
    if b * nblk > slots // BLOCK:
        raise ValueError(f"a pool of {slots} slots holds no {b} x {nblk} blocks")
    table = rng.permutation(slots // BLOCK)[: b * nblk].reshape(b, nblk)
    if kind == "shared" and b > 1:
        table[1, : nblk // 2 + 1] = table[0, : nblk // 2 + 1]
    read = (table[:, :, None] * BLOCK + np.arange(BLOCK)).reshape(b, nblk * BLOCK)
    return read[:, :lk].astype(np.int32)


def paged_case(rng: np.random.Generator, *, b: int, hq: int, hkv: int, lk: int, dk: int,
               dv: int, slots: int, kv: str, table: str, lq: int = 1,
               lengths: np.ndarray | None = None, mask: str | None = None,
               softcap: float | None = None):
    """(graph, inputs, reference): a fused paged Attention eqn, its bound values and the
    float64 reference over the gathered view. Pool rows no active key reads are NaN, and a
    live row's words past its length name a NaN slot."""
    read = block_table_map(rng, b, lk, slots, table)
    active = np.ones((b, lk), bool) if lengths is None else \
        np.arange(lk)[None, :] < lengths[:, None]
    used = np.zeros(slots, bool)
    used[read[active]] = True
    if lengths is not None and not used.all():  # a poison slot for the inactive words
        read = np.where(active, read, np.flatnonzero(~used)[0]).astype(np.int32)
    dt = NP_DTYPE[kv]
    k = rng.standard_normal((slots, hkv, dk), dtype=np.float32)
    v = rng.standard_normal((slots, hkv, dv), dtype=np.float32)
    k[~used], v[~used] = np.nan, np.nan
    k, v = k.astype(dt), v.astype(dt)
    q = rng.standard_normal((b, hq, lq, dk), dtype=np.float32)
    m = None
    if mask == "alibi":  # per head
        slopes = 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)
        m = slopes[:, None, None] * (np.arange(lk) - lk + 1)[None, None, :]
        m = np.broadcast_to(m[None], (1, hq, lq, lk)).astype(np.float32)
    elif mask == "causal":  # per batch row, one for every head
        m = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq - 5, 0.0,
                     -np.inf)
        m = np.broadcast_to(m, (b, 1, lq, lk)).astype(np.float32)

    bb = Builder()
    ops = [bb.input("q", q.shape), bb.input("k", k.shape, DType(kv)),
           bb.input("v", v.shape, DType(kv))]
    ins = {"q": q, "k": k, "v": v}
    if m is not None:
        ops.append(bb.input("mask", m.shape))
        ins["mask"] = m
    if lengths is not None:
        ops.append(bb.input("len", (b,), I32))
        ins["len"] = lengths.astype(np.int32)
    ops.append(bb.input("read", read.shape, I32))
    ins["read"] = read
    form = AttentionForm(
        scale=dk ** -0.5, softcap=softcap, n_rep=hq // hkv,
        mask=MaskKind.NONE if m is None else MaskKind.ADDITIVE,
        mask_bcast=None if m is None else mask_bcast(m.shape), keys=KeyLayout.PAGED,
        kv_dtype=DType(kv), live=lengths is not None,
    )
    e = new_eqn(P.ATTENTION, ops, form=form)
    bb.eqns.append(e)
    bb.export("out", e.out)

    kg, vg = gathered(k, v, read)
    live_mask = np.where(active, 0.0, -np.inf)[:, None, None, :]
    full = live_mask if m is None else m + live_mask
    ref = reference_attention(q, np.nan_to_num(kg.astype(np.float32)),
                              np.nan_to_num(vg.astype(np.float32)), full, softcap=softcap)
    return bb.build(), ins, ref


def gathered(k: np.ndarray, v: np.ndarray, read: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The [B, Hkv, Lk, D] view the pools stand for (in numpy, never by pootvk)."""
    return k[read].transpose(0, 2, 1, 3), v[read].transpose(0, 2, 1, 3)


def dense_graph(g, ins):
    """The same attention over the gathered view, the dense form (for the bit-for-bit
    comparison); its inputs."""
    (e,) = g.eqns
    form = e.params["form"]
    kg, vg = gathered(ins["k"], ins["v"], ins["read"])
    bb = Builder()
    ops = [bb.input("q", ins["q"].shape), bb.input("k", kg.shape, form.kv_dtype),
           bb.input("v", vg.shape, form.kv_dtype)]
    dins = {"q": ins["q"], "k": np.ascontiguousarray(kg), "v": np.ascontiguousarray(vg)}
    for role in ("mask", "len"):
        if role in ins:
            ops.append(bb.input(role, ins[role].shape, F32 if role == "mask" else I32))
            dins[role] = ins[role]
    d = new_eqn(P.ATTENTION, ops, form=replace(form, keys=KeyLayout.DENSE))
    bb.eqns.append(d)
    bb.export("out", d.out)
    return bb.build(), dins


def run(device, g, ins, schedule: str):
    """Plan under the forced schedule and run once; the output and the attention request
    (a separate combine checked to follow it)."""
    with forced_schedule(**SCHEDULES[schedule]):
        plan = plan_graph(g, device.profile)
    with Replay(device, plan, compile_plan(plan)) as rp:
        out = rp.step(ins)["out"]
    reqs = [k.request for k in plan.kernels]
    if SCHEDULES[schedule].get("fused_combine") is False:
        assert isinstance(reqs[1], DecodeCombineRequest) and reqs[1].partial is reqs[0]
    return out, reqs[0]


def check_request(req, schedule: str, *, slots: int) -> None:
    """The planned request is the forced schedule's, paged over the pools."""
    forced = SCHEDULES[schedule]
    if forced["schedule"] == "streaming":
        assert isinstance(req, AttentionRequest)
    else:
        assert isinstance(req, DecodeRequest)
        if "splits" in forced:
            assert req.splits == forced["splits"]
        for field, value in forced.items():  # every forced override reached the request
            if field not in ("schedule", "splits"):
                assert getattr(req, field) == value, field
    assert req.paged and req.pool_slots == slots
    assert req.push_constants() == (req.lk, slots)
    assert [b.dtype for b in req.bindings() if b.name == "read"] == [I32]
    assert f"paged[S={slots}]" in req.describe()


#: batch rows at the live lengths the issue names (1, 2, around a 128-key tile, all of Lk)
LK = 300  # 18 blocks and a partial one of 12 keys
LENGTHS = np.array([1, 2, 127, 128, 129, LK])


@pytest.mark.parametrize("kv", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_paged_live_on_every_schedule(device, schedule, kv):
    """Scattered blocks (row 1 sharing row 0's prefix), a partial last block, the live
    lengths {1, 2, 127, 128, 129, Lk}, GQA n_rep 4, every schedule and pool dtype: the
    reference, and the dense kernel of the same schedule bit for bit."""
    rng = np.random.default_rng(zlib.crc32(f"{schedule} {kv}".encode()))
    slots = (len(LENGTHS) * 19 + 5) * BLOCK
    g, ins, ref = paged_case(rng, b=len(LENGTHS), hq=8, hkv=2, lk=LK, dk=64, dv=64,
                             slots=slots, kv=kv, table="shared", lengths=LENGTHS)
    if kv != "f32" and schedule == "streaming":
        with pytest.raises(DtypeLowering), forced_schedule(**SCHEDULES[schedule]):
            plan_graph(g, device.profile)  # the streaming kernel is F32 only
        return
    got, req = run(device, g, ins, schedule)
    check_request(req, schedule, slots=slots)
    assert np.isfinite(got).all()  # no NaN pool row (unused, or past a length) was read
    assert_close(got, ref, tol=1e-10 if kv == "f32" else 5e-4)
    dg, dins = dense_graph(g, ins)
    dense, dreq = run(device, dg, dins, schedule)
    assert not dreq.paged
    if getattr(dreq, "matrix_feed", None) == "registers":
        # the dense key took the register-fed matrix kernel, which paged keys do not
        assert_close(dense, ref, tol=5e-4)
    else:
        np.testing.assert_array_equal(got, dense)  # only the address differs


@settings(max_examples=examples(10), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    table=st.sampled_from(TABLES), n_rep=st.sampled_from([1, 4]), hkv=st.integers(1, 2),
    lk=st.sampled_from([16, 100, 129, 160]), widths=st.sampled_from([(64, 64), (128, 128),
                                                                      (64, 128)]),
    kv=st.sampled_from(["f32", "f16", "bf16"]), schedule=st.sampled_from(sorted(SCHEDULES)),
    b=st.integers(1, 3), live=st.booleans(), seed=st.integers(0, 2**16),
)
def test_paged_sweep(device, table, n_rep, hkv, lk, widths, kv, schedule, b, live, seed):
    """Random block tables of every kind over the schedules, dtypes, widths and GQA."""
    if kv != "f32" and schedule == "streaming":
        schedule = "grouped"
    rng = np.random.default_rng(seed)
    slots = (b * -(-lk // BLOCK) + 3) * BLOCK
    lengths = rng.integers(1, lk + 1, b) if live else None
    dk, dv = widths
    g, ins, ref = paged_case(rng, b=b, hq=hkv * n_rep, hkv=hkv, lk=lk, dk=dk, dv=dv,
                             slots=slots, kv=kv, table=table, lengths=lengths)
    got, req = run(device, g, ins, schedule)
    check_request(req, schedule, slots=slots)
    assert_close(got, ref, tol=1e-9 if kv == "f32" else 5e-4)


@pytest.mark.parametrize(("schedule", "kv", "mask", "softcap", "lq"), [
    ("streaming", "f32", "alibi", None, 1),
    ("split7", "f16", "alibi", None, 1),
    ("split7_two_launches", "bf16", None, 8.0, 1),
    ("streaming", "f32", "causal", 8.0, 3),
    ("grouped", "f32", "causal", None, 3),
])
def test_paged_with_a_mask_softcap_and_query_rows(device, schedule, kv, mask, softcap, lq):
    """An additive mask (per head, per batch row), a softcap, several query rows."""
    rng = np.random.default_rng(3)
    b, lk = 2, 150
    g, ins, ref = paged_case(rng, b=b, hq=8, hkv=2, lk=lk, dk=64, dv=64, slots=24 * BLOCK,
                             kv=kv, table="shared", lq=lq, mask=mask, softcap=softcap)
    got, req = run(device, g, ins, schedule)
    check_request(req, schedule, slots=24 * BLOCK)
    assert_close(got, ref, tol=1e-9 if kv == "f32" else 5e-4)


@pytest.mark.parametrize("schedule", ["streaming", "split1", "split7", "no_prefetch"])
def test_read_words_outside_the_pool_are_clamped(device, schedule):
    """The bind refuses a map word outside [0, S); a kernel bound to one anyway reads the
    nearest pool slot (clamped), never outside the pools' bindings."""
    rng = np.random.default_rng(9)
    slots, lk = 4 * BLOCK, 40
    g, ins, _ = paged_case(rng, b=2, hq=4, hkv=1, lk=lk, dk=64, dv=64, slots=slots,
                           kv="f32", table="anywhere")
    ins["k"] = rng.standard_normal(ins["k"].shape, dtype=np.float32)  # no NaN slot
    ins["v"] = rng.standard_normal(ins["v"].shape, dtype=np.float32)
    read = ins["read"].copy()
    read[0, ::3] = -7
    read[1, ::4] = slots + 100
    read[1, 1] = 2**31 - 1
    ins["read"] = read
    kg, vg = gathered(ins["k"], ins["v"], np.clip(read, 0, slots - 1))
    ref = reference_attention(ins["q"], kg, vg)
    got, _ = run(device, g, ins, schedule)
    assert_close(got, ref, tol=1e-9)


@pytest.mark.parametrize("schedule", ["streaming", "split1", "split7"])
def test_paged_scalar_widths(device, schedule):
    """Widths that are not multiples of 4 (Dk 14, Dv 10): the scalar loads, Dv != Dk."""
    rng = np.random.default_rng(4)
    g, ins, ref = paged_case(rng, b=2, hq=4, hkv=2, lk=100, dk=14, dv=10, slots=16 * BLOCK,
                             kv="f32", table="scattered", lengths=np.array([37, 100]))
    got, req = run(device, g, ins, schedule)
    check_request(req, schedule, slots=16 * BLOCK)
    assert req.vec == 1
    assert_close(got, ref, tol=1e-9)
