"""The layouts the plan chooses for Reduce (and when it splits) on recorded profiles."""

import pytest

from pootvk.ir import BF16, F32
from pootvk.ops import Builder
from pootvk.plan import ReduceRequest, plan_graph, recorded_profile, recorded_profiles

H200 = recorded_profile("nvidia_h200")


def reduce_plan(shape, axis, dt=F32, profile=H200):
    b = Builder()
    b.export("y", b.reduce("Sum", b.input("x", shape, dt), axis, keepdim=False))
    return plan_graph(b.build(), profile)


def layout(req):
    return req.outer, req.n, req.inner, req.cols, req.lanes, req.vec


def test_rows_take_a_full_workgroup_with_vector_loads():
    (k,) = reduce_plan((4096, 4096), 1).kernels
    assert layout(k.request) == (4096, 4096, 1, 1, 256, 4)
    assert k.request.subgroup and k.request.workgroups == 4096


def test_columns_are_read_side_by_side():
    """32 columns per workgroup (one 128-byte line per row); 128 such workgroups are too
    few for 132 SMs, so the 4096 rows are split in two halves first."""
    first, second = (k.request for k in reduce_plan((4096, 4096), 0).kernels)
    assert layout(first) == (2, 2048, 4096, 32, 8, 1) and first.workgroups == 256
    assert layout(second) == (1, 2, 4096, 128, 2, 1)  # short rows: 128 outputs a group
    (k,) = reduce_plan((4096, 4096), 0, profile=H200.with_(compute_units=64)).kernels
    assert layout(k.request) == (1, 4096, 4096, 32, 8, 1) and k.request.workgroups == 128


def test_short_rows_share_a_workgroup():
    (k,) = reduce_plan((10000, 6), 1).kernels
    assert layout(k.request) == (10000, 6, 1, 32, 8, 1) and k.request.local_size == 256


def test_few_long_rows_split_into_two_passes():
    kernels = reduce_plan((1, 1 << 22), 1, BF16).kernels
    first, second = (k.request for k in kernels)
    assert first.outer * first.n == 1 << 22 and first.workgroups >= 2 * H200.compute_units
    assert (first.dtype, first.stored, second.dtype, second.stored) == (BF16, F32, F32, BF16)
    assert second.n == first.outer and second.outer == 1
    scratch = kernels[0].bindings[1]
    assert scratch.location == kernels[1].bindings[0].location  # the partials, coloured


def test_a_small_reduction_never_splits():
    (k,) = reduce_plan((1, 4096), 1).kernels  # a decode row: one workgroup is enough
    assert layout(k.request) == (1, 4096, 1, 1, 256, 4)


@pytest.mark.parametrize("name", sorted(recorded_profiles()))
def test_every_profile_gets_a_workgroup_it_can_run(name):
    p = recorded_profile(name)
    for shape, axis in (((4096, 4096), 1), ((4096, 4096), 0), ((7, 3), 1)):
        for k in reduce_plan(shape, axis, profile=p).kernels:
            r = k.request
            assert isinstance(r, ReduceRequest) and r.local_size <= p.max_invocations
            assert r.subgroup == p.subgroup_shuffle
