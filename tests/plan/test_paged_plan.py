"""The paged-key Attention form's plan (issue 11): the schedule is the dense one of its
logical [B, Hkv, Lk, D] shapes on every recorded profile; the request records the pools'
slot count, binds the pools as k/v and the read map as one more i32 binding; the forced
schedules reach each kernel; the generated sources compile with no private array. No
device needed."""

from __future__ import annotations

import dataclasses

import pytest

from pootvk.errors import DtypeLowering, PootvkError, ShapeError
from pootvk.ir import BF16, F16, F32, I32, AttentionForm, DType, KeyLayout, new_eqn
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.plan import (
    AttentionRequest,
    DecodeCombineRequest,
    DecodeRequest,
    forced_schedule,
    plan_graph,
    recorded_profile,
    recorded_profiles,
)
from pootvk.shaders.compiler import compile_glsl
from pootvk.shaders.generate import generate
from tests.helpers import without_regfed
from tests.shaders.test_generated import PRIVATE_ARRAY

#: decode shapes (B, Hq, Hkv, Lk, D): the BENCH shapes of test_schedules, SmolLM2's
SHAPES = [(1, 32, 8, 4096, 128), (8, 32, 8, 8192, 128), (1, 8, 1, 65536, 128),
          (32, 32, 8, 2048, 128), (1, 9, 3, 4160, 64)]


def attention_graph(b, hq, hkv, lk, d, *, kv=F32, slots=0, lq=1, live=False, dv=None):
    """One fused Attention eqn: paged over pools of ``slots`` slots, or dense (slots 0)."""
    dv = dv or d
    bb = Builder()
    q = bb.input("q", (b, hq, lq, d))
    if slots:
        k, v = bb.input("k", (slots, hkv, d), kv), bb.input("v", (slots, hkv, dv), kv)
    else:
        k, v = bb.input("k", (b, hkv, lk, d), kv), bb.input("v", (b, hkv, lk, dv), kv)
    ops = [q, k, v]
    if live:
        ops.append(bb.input("len", (b,), I32))
    if slots:
        ops.append(bb.input("read", (b, lk), I32))
    form = AttentionForm(scale=d ** -0.5, n_rep=hq // hkv, kv_dtype=kv, live=live,
                         keys=KeyLayout.PAGED if slots else KeyLayout.DENSE)
    e = new_eqn(P.ATTENTION, ops, form=form)
    bb.eqns.append(e)
    bb.export("out", e.out)
    return bb.build()


def requests(g, profile):
    return [k.request for k in plan_graph(g, profile).kernels]


@pytest.mark.parametrize("name", sorted(recorded_profiles()))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kv", [F32, F16])
def test_paged_plans_the_dense_schedule_of_its_logical_shapes(name, shape, kv):
    """Every recorded profile: the paged request is the dense one with the slot count
    recorded (same split count, lanes, rows, combine); its combine launch likewise."""
    prof = recorded_profile(name)
    b, hq, hkv, lk, d = shape
    slots = b * lk + 64  # pool bytes stay within one binding where the dense K does
    if kv is F16 and not prof.extra.get("storage_buffer_16bit"):
        return
    if slots * hkv * d * kv.device_itemsize > prof.max_storage_buffer_range:
        return
    try:
        dense = requests(attention_graph(b, hq, hkv, lk, d, kv=kv), prof)
    except PootvkError as e:  # the paged form is refused the same way
        with pytest.raises(type(e)):
            requests(attention_graph(b, hq, hkv, lk, d, kv=kv, slots=slots), prof)
        return
    paged = requests(attention_graph(b, hq, hkv, lk, d, kv=kv, slots=slots), prof)
    if getattr(dense[0], "matrix_feed", None) == "registers":
        # the register-fed kernel reads dense keys: a paged key takes what the profile
        # plans without it
        dense = requests(attention_graph(b, hq, hkv, lk, d, kv=kv), without_regfed(prof))
    assert len(paged) == len(dense)
    assert paged[0] == dataclasses.replace(dense[0], pool_slots=slots)
    assert paged[0].paged and not dense[0].paged
    assert paged[0].push_constants() == (lk, slots) and dense[0].push_constants() == (lk,)
    if len(dense) == 2:
        assert isinstance(paged[1], DecodeCombineRequest)
        assert generate(paged[1]) == generate(dense[1])  # the combine never reads K/V


def test_the_read_map_is_bound_after_the_length_and_the_pools_as_k_and_v():
    prof = recorded_profile("nvidia_h200")
    g = attention_graph(2, 8, 2, 300, 64, kv=BF16, slots=80, live=True)
    plan = plan_graph(g, prof)
    (kern,) = [k for k in plan.kernels if isinstance(k.request, DecodeRequest)]
    names = [b.binding.name for b in kern.bindings]
    assert names[:5] == ["q", "k", "v", "len", "read"]
    by_name = {b.binding.name: b for b in kern.bindings}
    assert by_name["read"].binding.dtype is I32
    assert by_name["k"].binding.dtype is BF16
    for role in ("k", "v", "read", "len"):  # each operand at its slot's own storage
        assert by_name[role].location == plan.locations[g.slot(role).var]
    assert by_name["k"].location.nbytes == 80 * 2 * 64 * 2  # the pool, not a gathered view
    assert "paged[S=80]" in kern.request.describe()


@pytest.mark.parametrize(("forced", "kind", "splits", "launches"), [
    ({"schedule": "streaming"}, AttentionRequest, None, 1),
    ({"schedule": "grouped", "splits": 1}, DecodeRequest, 1, 1),
    ({"schedule": "grouped", "splits": 7, "fused_combine": True}, DecodeRequest, 7, 1),
    ({"schedule": "grouped", "splits": 16, "fused_combine": False}, DecodeRequest, 16, 2),
])
def test_forced_schedules_reach_every_paged_kernel(forced, kind, splits, launches):
    prof = recorded_profile("lavapipe")
    g = attention_graph(2, 8, 2, 300, 64, slots=48, live=True)
    with forced_schedule(**forced):
        reqs = requests(g, prof)
    assert len(reqs) == launches and isinstance(reqs[0], kind) and reqs[0].pool_slots == 48
    if splits is not None:
        assert reqs[0].splits == splits
    src = generate(reqs[0])
    assert "rmap[" in src or "read[" in src
    assert "uint slots; } pc" in src
    assert not PRIVATE_ARRAY.findall(src)
    assert compile_glsl(src)


def test_16bit_pools_refuse_the_streaming_schedule():
    g = attention_graph(1, 8, 2, 100, 64, kv=F16, slots=32)
    with forced_schedule("streaming"), pytest.raises(DtypeLowering):
        plan_graph(g, recorded_profile("nvidia_h200"))


@pytest.mark.parametrize("kv", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("over", [{}, {"prefetch": False}, {"subgroup": False},
                                  {"dot_reduce": "scatter", "lazy_rescale": True}])
def test_paged_sources_compile_on_the_h200_profile(kv, over):
    """The H200's paged kernels (8-row blocks, 16-byte loads, subgroup reductions) compile
    with no private array; only lavapipe runs them in this suite."""
    prof = recorded_profile("nvidia_h200")
    g = attention_graph(1, 32, 8, 4096, 128, kv=DType(kv), slots=4096 + 64, live=True)
    with forced_schedule("grouped", 4, **over):
        (r,) = requests(g, prof)
    src = generate(r)
    assert r.paged and not PRIVATE_ARRAY.findall(src)
    assert compile_glsl(src)


def test_a_key_is_dense_split_or_paged():
    with pytest.raises(ShapeError, match="dense, split or paged"):
        AttentionRequest(b=1, hq=1, hkv=1, lq=1, lk=4, dk=8, dv=8, scale=1.0, softcap=None,
                         mask=None, lanes=4, vec=4, grid=(1, 1), dk_shared=4, pool_slots=4)
