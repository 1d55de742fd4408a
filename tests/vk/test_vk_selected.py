"""The fused SelectedAttention op (``ir.sparse_form``) on the live device: graphs that emit it
directly (ids from ``ref_select`` over random block scores, positions as inputs), planned on
the grouped decode kernel (splits 1 and > 1, fused and two-launch combine, the shared-memory
reduction) and the streaming kernel, against the oracle (the primitive chain) and the
independent float64 ``ref_attend``. Rows whose own block is the only one, fewer valid ids
than K, positions at a block's first and last key, GQA with a per-group or shared selection,
MQA, F32/F16/BF16 K/V, softcap, several batch rows at different positions, prefill rows, and
NaN planted in K/V rows no row visits (the kernels never read them). Plan-level checks (no
device): the split count follows the logical length (K + 1) * bs, the matrix kernel is never
planned, and the refusals are typed."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from pootvk.errors import DtypeLowering, ShapeError
from pootvk.ir import BF16, F16, F32, I32, DType, SelectedForm
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.plan import (
    AttentionRequest,
    DecodeCombineRequest,
    DecodeRequest,
    forced_schedule,
    plan_graph,
    recorded_profile,
    recorded_profiles,
)
from pootvk.plan.decode_schedule import (
    DecodeProblem,
    check_request,
    choose_decode_schedule,
    chunk_for,
    matrix_supported,
)
from pootvk.runtime import build_replay
from pootvk.shaders.compiler import compile_glsl
from pootvk.shaders.generate import generate
from tests.helpers import assert_close
from tests.sparse_ref import ref_attend, ref_select

KV = {"f32": (F32, np.float32), "f16": (F16, np.float16), "bf16": (BF16, ml_dtypes.bfloat16)}


def selected_graph(b: int, hq: int, hkv: int, lq: int, lk: int, dk: int, dv: int, hs: int,
                   top: int, form: SelectedForm):
    """A graph of one SelectedAttention eqn over inputs q, k, v, ids, qpos -> out."""
    bld = Builder()
    kv = form.kv_dtype
    q = bld.input("q", (b, hq, lq, dk))
    k = bld.input("k", (b, hkv, lk, dk), kv)
    v = bld.input("v", (b, hkv, lk, dv), kv)
    ids = bld.input("ids", (b, hs, lq, top), I32)
    qpos = bld.input("qpos", (b, lq), I32)
    bld.export("out", bld.emit(P.SELECTED_ATTENTION, [q, k, v, ids, qpos], form=form))
    return bld.build()


def run_case(device, *, qpos, hq=8, hkv=2, hs=2, lk=1024, dk=64, dv=64, bs=16, top=4,
             kv="f32", softcap=None, scale=None, seed=0, nan_rows=(), schedule=None):
    """Build, plan (``schedule``: forced_schedule's arguments), run once and check against
    the oracle and ``ref_attend``; returns the plan's requests. ``nan_rows``: (b, g, t) K/V
    rows set to NaN (rows no query row may visit)."""
    rng = np.random.default_rng(seed)
    qpos = np.asarray(qpos, np.int32)
    b, lq = qpos.shape
    dt, npdt = KV[kv]
    form = SelectedForm(scale=1.0 / math.sqrt(dk) if scale is None else scale, block_size=bs,
                        softcap=softcap, n_rep=hq // hkv, kv_dtype=dt)
    g = selected_graph(b, hq, hkv, lq, lk, dk, dv, hs, top, form)
    scores = rng.standard_normal((b, hs, lq, lk // bs)).astype(np.float32)
    k = rng.standard_normal((b, hkv, lk, dk), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32)
    for (bi, gi, t) in nan_rows:
        k[bi, gi, t, 1] = np.nan
        v[bi, gi, t, 2] = np.nan
    ins = {"q": rng.standard_normal((b, hq, lq, dk), dtype=np.float32),
           "k": k.astype(npdt), "v": v.astype(npdt),
           "ids": ref_select(scores, qpos, bs, top), "qpos": qpos}
    ref = ref_attend(ins["q"], ins["k"].astype(np.float32), ins["v"].astype(np.float32),
                     ins["ids"], qpos, bs, form.scale, softcap)
    with forced_schedule(**(schedule or {})), build_replay(g, device) as rp:
        reqs = [kern.request for kern in rp.plan.kernels]
        out = rp.step(ins)["out"]
    assert out.dtype == np.float32 and np.isfinite(out).all()
    assert_close(out, ref)
    assert_close(out, evaluate(g, ins)["out"])
    return reqs


def _decode(reqs) -> DecodeRequest:
    (r,) = [x for x in reqs if isinstance(x, DecodeRequest)]
    return r


# --- decode (Lq = 1): the grouped split-KV kernel --------------------------------------------

#: (name, case kwargs, forced schedule, expected splits: None = the planner's). The forced
#: schedules serve the 4 query heads of a KV group in one workgroup (each selected block is
#: read once per group), whatever the device would pick for so few keys.
GROUP = {"schedule": "grouped", "rows_per_wg": 4}
DECODE = [
    # GQA, a selection per KV group, the planner's schedule (lavapipe: unsplit)
    ("gqa_hs2_bs16_k4", dict(qpos=[[700], [333]], bs=16, top=4), {}, None),
    # a selection shared by all heads, one block a row, F16, softcap, split in 3 (fused)
    ("gqa_hs1_bs64_k1_f16_cap", dict(qpos=[[1000], [130]], hs=1, bs=64, top=1, kv="f16",
                                     softcap=5.0, seed=1), {**GROUP, "splits": 3}, 3),
    # 16 blocks, BF16, two launches (partials + combine)
    ("gqa_hs2_bs16_k16_bf16_two_launches", dict(qpos=[[1023], [400]], top=16, kv="bf16",
                                                seed=2),
     {**GROUP, "splits": 2, "fused_combine": False}, 2),
    # MQA, dots reduced through workgroup memory (no subgroup operations)
    ("mqa_shared_reduce", dict(qpos=[[900], [64]], hq=4, hkv=1, hs=1, bs=64, top=4, seed=3),
     {**GROUP, "splits": 2, "subgroup": False}, 2),
    # the splits take the logical length's tiles in turn
    ("gqa_hs2_bs16_k8_interleaved", dict(qpos=[[1023], [300]], top=8, seed=6),
     {**GROUP, "splits": 5, "interleave": True}, 5),
    # without the software prefetch (the loads through the table in the loop)
    ("no_prefetch_split1", dict(qpos=[[515], [77]], top=4, seed=4, scale=0.3),
     {**GROUP, "splits": 1, "prefetch": False}, 1),
]


@pytest.mark.parametrize(("case", "sched", "splits"), [c[1:] for c in DECODE],
                         ids=[c[0] for c in DECODE])
def test_decode_matches_the_oracle_and_the_reference(device, case, sched, splits):
    r = _decode(run_case(device, schedule=sched, **case))
    assert r.select_block == case.get("bs", 16) and not r.matrix
    if splits is not None:
        assert r.splits == splits and r.rows_per_wg == 4  # a whole group per workgroup


def test_decode_long_cache(device):
    """Lk = 32768: the kernel reads (K + 1) * bs keys per row; split over those keys."""
    reqs = run_case(device, qpos=[[32767], [20000]], lk=32768, bs=64, top=16, kv="f16",
                    seed=5, schedule={"schedule": "grouped", "splits": 4})
    r = _decode(reqs)
    assert r.lk == 32768 and r.splits == 4 and r.chunk == chunk_for(17 * 64, 4, r.tile)


def test_positions_at_block_edges(device):
    """Four batch rows: p < bs (the own block only), the last key of a block with fewer
    complete blocks than K, the first key of a block, the last position of the cache."""
    bs, lk = 16, 512
    qpos = [[bs // 2], [3 * bs - 1], [5 * bs], [lk - 1]]
    for sched in ({"schedule": "grouped", "splits": 1}, {"schedule": "grouped", "splits": 2},
                  {"schedule": "streaming"}):
        run_case(device, qpos=qpos, lk=lk, bs=bs, top=4, seed=6, schedule=sched)


def test_unvisited_nan_rows_are_never_read(device):
    """NaN in K/V rows of an unselected complete block, of the row's own block past its
    position, and of a block past it: the result is finite and equals the reference (the
    oracle's gather zeroes them too)."""
    bs, lk, p = 16, 256, 100  # own block 6 (keys 96..111), complete blocks 0..5
    rng = np.random.default_rng(7)
    scores = rng.standard_normal((1, 1, 1, lk // bs)).astype(np.float32)
    picked = set(ref_select(scores, np.array([[p]], np.int32), bs, 2)[0, 0, 0].tolist())
    skipped = next(c for c in range(6) if c not in picked)
    nan_rows = [(0, 0, skipped * bs + 3), (0, 0, p + 1), (0, 0, 111), (0, 0, 200),
                (0, 1, skipped * bs + 5)]
    for sched in ({"schedule": "grouped", "splits": 1}, {"schedule": "grouped", "splits": 3},
                  {"schedule": "grouped", "subgroup": False}, {"schedule": "streaming"}):
        run_case(device, qpos=[[p]], hq=4, hkv=2, hs=1, lk=lk, bs=bs, top=2, seed=7,
                 nan_rows=nan_rows, schedule=sched)


@pytest.mark.parametrize("schedule", ["grouped", "streaming"])
def test_inputs_outside_the_contract_stay_in_bounds(device, schedule):
    """Ids outside [0, own) (negative, the own block, past it, past the cache) are ignored
    and positions are clamped into [0, Lk - 1]: the kernels read nothing outside K/V and
    give the attention over the valid ids and the clamped positions."""
    bs, lk, top = 16, 128, 4
    qpos = np.array([[-7], [lk + 50], [40]], np.int32)
    # row 0 (p -> 0, own 0): no id is valid; row 1 (p -> 127, own 7): 7 is its own, 8 past
    # the cache; row 2 (p = 40, own 2): 2 is its own, 3 past it
    ids = np.array([[[[-5, 0, 2, 10**6]]], [[[3, 1, 7, 8]]], [[[0, 2, 3, -100]]]], np.int32)
    rng = np.random.default_rng(11)
    g = selected_graph(3, 2, 1, 1, lk, 16, 16, 1, top, SelectedForm(0.25, bs, n_rep=2))
    ins = {"q": rng.standard_normal((3, 2, 1, 16), dtype=np.float32),
           "k": rng.standard_normal((3, 1, lk, 16), dtype=np.float32),
           "v": rng.standard_normal((3, 1, lk, 16), dtype=np.float32), "ids": ids, "qpos": qpos}
    clamped = np.clip(qpos, 0, lk - 1)
    own = clamped[:, :, None, None] // bs
    valid = np.where((ids >= 0) & (ids < own), ids, -1)
    ref = ref_attend(ins["q"], ins["k"], ins["v"], valid, clamped, bs, 0.25)
    with forced_schedule(schedule), build_replay(g, device) as rp:
        out = rp.step(ins)["out"]
    assert_close(out, ref)


# --- prefill (Lq > 1) and the streaming fallback ---------------------------------------------

@pytest.mark.parametrize("hs", [1, 2])
def test_prefill_streaming(device, hs):
    reqs = run_case(device, qpos=[[98, 99, 100], [14, 15, 16]], hs=hs, lk=256, bs=16, top=4,
                    softcap=8.0, seed=8 + hs, schedule={"schedule": "streaming"})
    (r,) = reqs
    assert isinstance(r, AttentionRequest) and r.select_block == 16 and r.lq == 3


@pytest.mark.parametrize("kv", ["f16", "bf16"])
def test_prefill_16bit_on_the_grouped_kernel(device, kv):
    """16-bit K/V have only the grouped kernel; with Lq > 1 it serves one row a workgroup
    (each row has its own block table)."""
    r = _decode(run_case(device, qpos=[[63, 64, 65], [200, 201, 255]], lk=256, bs=64, top=1,
                         kv=kv, seed=10))
    assert r.rows_per_wg == 1 and r.lq == 3


def test_streaming_refuses_16bit_kv(device):
    g = selected_graph(1, 4, 2, 1, 64, 32, 32, 2, 1,
                       SelectedForm(0.2, 16, n_rep=2, kv_dtype=F16))
    with forced_schedule("streaming"), pytest.raises(DtypeLowering, match="f16"):
        plan_graph(g, device.profile)


# --- plan level: splits, refusals, the matrix kernel -----------------------------------------

def _problem(**kw) -> DecodeProblem:
    base = dict(b=1, hq=32, hkv=8, lq=1, lk=32768, dk=128, dv=128, scale=0.1, kv_dtype="f16",
                select_block=64, select_k=16, select_heads=8)
    return DecodeProblem(**{**base, **kw})


def test_split_count_follows_the_logical_length():
    prof = recorded_profile("nvidia_h200")
    sel = choose_decode_schedule(_problem(), prof, has_subgroup_shuffle=True)
    dense = choose_decode_schedule(_problem(select_block=0, select_k=0, select_heads=0), prof,
                                   has_subgroup_shuffle=True)
    keys = 17 * 64
    assert sel.keys == keys and dense.keys == 32768
    assert 1 < sel.splits <= keys // 128 < dense.splits  # chunks of >= 128 selected keys
    assert sel.chunk * (sel.splits - 1) < keys  # no split empty at the full logical length
    assert not sel.matrix


def test_the_planner_picks_the_matrix_kernel_for_a_wide_decode_only():
    """The H200 plans the tensor-core kernel for a wide group's selected decode as for its
    dense Attention (the staged copy reads each tile row through the block table); never at
    Lq > 1, where each row has its own table."""
    prof = recorded_profile("nvidia_h200")
    wide = dict(hq=128, hkv=1, dk=128, dv=128, select_heads=1)
    dense = choose_decode_schedule(_problem(select_block=0, select_k=0, select_heads=0,
                                            **{k: v for k, v in wide.items()
                                               if k != "select_heads"}),
                                   prof, has_subgroup_shuffle=True)
    assert dense.matrix  # the shape the matrix kernel serves
    sel = choose_decode_schedule(_problem(**wide), prof, has_subgroup_shuffle=True)
    assert sel.matrix and sel.select_block == 64 and sel.keys == 17 * 64
    check_request(sel)
    assert not matrix_supported(_problem(**wide, lq=2), prof, True)
    g = selected_graph(1, 128, 1, 1, 4096, 128, 128, 1, 4,
                       SelectedForm(0.1, 64, n_rep=128, kv_dtype=F16))
    plan = plan_graph(g, prof)
    assert any(isinstance(k.request, DecodeRequest) and k.request.select_block == 64
               and k.request.matrix for k in plan.kernels)


def test_check_request_refuses_other_key_forms():
    r = choose_decode_schedule(_problem(), recorded_profile("lavapipe"),
                               has_subgroup_shuffle=True)
    check_request(r)
    check_request(replace(r, dk_shared=64))  # a split key is read through the table too
    for bad in (dict(pool_slots=8), dict(live_len=True),
                dict(mask=(1, 1, 1)), dict(select_heads=3), dict(select_k=0),
                dict(lq=2, hq=8, hkv=2, select_heads=2, rows_per_wg=2)):
        with pytest.raises(ShapeError):
            check_request(replace(r, **bad))
    for bad in (dict(live_len=True), dict(mask=(1, 1, 1)), dict(lk=1000)):
        with pytest.raises(ShapeError):
            _problem(**bad)


def test_plan_rule_binds_operands_by_role():
    """The split plan's kernels bind q, k, v, ids, qpos by role, then the partials (and
    the combine launch reads them back)."""
    g = selected_graph(1, 8, 2, 1, 1024, 64, 64, 2, 4, SelectedForm(0.125, 16, n_rep=4))
    with forced_schedule("grouped", splits=3, fused_combine=False):
        plan = plan_graph(g, recorded_profile("lavapipe"))
    part, comb = (k.request for k in plan.kernels)
    assert isinstance(comb, DecodeCombineRequest) and comb.partial == part
    names = [b.name for b in part.bindings()]
    assert names == ["q", "k", "v", "ids", "qpos", "partial"]
    assert [b.dtype for b in part.bindings()][3:5] == [DType("i32"), DType("i32")]
    with forced_schedule("streaming"):
        (k,) = plan_graph(g, recorded_profile("lavapipe")).kernels
    assert [b.name for b in k.request.bindings()] == ["q", "k", "v", "ids", "qpos", "o"]


# a declaration of a non-shared array (tests/shaders/test_generated.py's scan)
PRIVATE_ARRAY = re.compile(
    r"^\s*(?:const\s+)?(?:float|int|uint|bool|[iu]?vec[234]|mat[234])\s+\w+\s*\[", re.M
)


def test_sources_compile_without_private_arrays():
    """Every selected kernel a recorded profile plans, and the forced variants on lavapipe,
    compiles and keeps its block table in workgroup memory (no private array)."""
    sources = set()
    for kv, hs, lq in (("f32", 2, 1), ("f16", 1, 1), ("bf16", 2, 3)):
        dt = KV[kv][0]
        g = selected_graph(2, 8, 2, lq, 2048, 64, 64, hs, 4,
                           SelectedForm(0.125, 64, softcap=4.0, n_rep=4, kv_dtype=dt))
        for name, prof in recorded_profiles().items():
            if kv != "f32" and not prof.extra.get("storage_buffer_16bit"):
                continue
            sched = [{}] + ([{"schedule": "streaming"}, {"schedule": "grouped", "splits": 5,
                                                          "subgroup": False}]
                            if name == "lavapipe" and kv == "f32" else [])
            for s in sched:
                with forced_schedule(**s):
                    sources |= {generate(k.request) for k in plan_graph(g, prof).kernels}
    assert len(sources) >= 6
    for src in sources:
        assert not PRIVATE_ARRAY.findall(src), src
        assert "shared uint s_blk[" in src or "combine" in src
        compile_glsl(src)
