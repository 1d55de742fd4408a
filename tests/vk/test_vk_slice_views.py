"""A contiguous Slice is a view: no kernel, its operand's bytes at an offset (heads 9..11
of [1, 12, 1, 64]). Its operand lives until the view's last use; a slice that is not one
contiguous range, whose offset cannot be bound, or whose output has a home of its own is a
kernel; a view of a state read after the state's in-place update is refused."""

import numpy as np
import pytest

from pootvk.errors import UnsupportedPrimitive
from pootvk.ir import F16, F32
from pootvk.ops import Builder
from pootvk.plan import plan_graph, recorded_profile
from pootvk.plan.planner import slice_offset
from tests.vk.test_vk_reshape_views import check, overlaps


def test_which_slices_are_contiguous():
    shape = (1, 12, 1, 64)
    assert slice_offset(shape, (0, 9, 0, 0), (1, 12, 1, 64)) == 9 * 64
    assert slice_offset(shape, (0, 0, 0, 0), (1, 12, 1, 64)) == 0  # the whole value
    assert slice_offset(shape, (0, 3, 0, 8), (1, 4, 1, 40)) == 3 * 64 + 8  # in one row
    assert slice_offset(shape, (0, 3, 0, 8), (1, 5, 1, 40)) is None  # two rows, gaps
    assert slice_offset((4, 6), (1, 0), (3, 6)) == 6
    assert slice_offset((4, 6), (0, 1), (4, 3)) is None
    assert slice_offset((), (), ()) == 0


def graph(dt=F32, start=9, export_slice=False):
    """k = heads start.. of a computed [1, 12, 1, 64], read by a matmul (which no body can
    take), then three same-sized temporaries that would take qk's bytes if the view did not
    keep it alive."""
    b = Builder()
    qk = b.exp(b.input("x", (1, 12, 1, 64), dt))
    k = b.slice(qk, (0, start, 0, 0), (1, start + 3, 1, 64))
    t = b.add(b.input("c", (1, 12, 1, 64), dt), 1.0)
    t = b.mul(t, 2.0)
    b.export("t", b.sub(t, 3.0))
    b.export("m", b.matmul(b.reshape(k, (3, 64)), b.input("w", (64, 5), dt)))
    if export_slice:
        b.export("k", k)
    return b.build(), qk, k


@pytest.mark.parametrize("dt", [F32, F16], ids=lambda d: d.value)
def test_a_contiguous_slice_runs_no_kernel(device, dt):
    g, qk, k = graph(dt)
    plan = plan_graph(g, device.profile)
    assert "Slice" not in [kk.label for kk in plan.kernels]
    root, view = plan.locations[qk], plan.locations[k]
    assert (view.buffer, view.offset, view.nbytes) == (
        root.buffer, root.offset + 9 * 64 * dt.device_itemsize, 3 * 64 * dt.device_itemsize)
    assert "view [eqn 1] Slice" in str(plan)
    for i, e in enumerate(g.eqns):  # the temporaries made after qk never share its bytes
        if e.out is not qk and i not in plan.views and \
                plan.locations[e.out].buffer.startswith("arena"):
            assert not overlaps(plan.locations[e.out], root), e
    rng = np.random.default_rng(3)
    ins = {"x": rng.standard_normal((1, 12, 1, 64)).astype(dt.numpy),
           "c": rng.standard_normal((1, 12, 1, 64)).astype(dt.numpy),
           "w": rng.standard_normal((64, 5)).astype(dt.numpy)}
    check(device, g, ins, dt)


def test_slices_that_stay_kernels(device):
    lav = recorded_profile("lavapipe")
    # an offset of 9 heads of 64 floats (2304 bytes): not a multiple of 512, it cannot be
    # bound where descriptors need 512-byte alignment
    g, _, _ = graph()
    prof = lav.with_(min_storage_offset_alignment=512)
    assert "Slice" in [kk.label for kk in plan_graph(g, prof).kernels]
    assert "Slice" not in [kk.label for kk in plan_graph(g, lav).kernels]
    g, _, k = graph(export_slice=True)  # the export is a home of its own: a copy
    plan = plan_graph(g, lav)
    assert plan.locations[k].buffer == "out:k" and "Slice" in [kk.label for kk in plan.kernels]
    rng = np.random.default_rng(4)
    check(device, g, {"x": rng.standard_normal((1, 12, 1, 64)).astype(np.float32),
                      "c": rng.standard_normal((1, 12, 1, 64)).astype(np.float32),
                      "w": rng.standard_normal((64, 5)).astype(np.float32)})


def test_a_slice_view_of_a_state_read_after_its_update_is_refused():
    b = Builder()
    s = b.state("s", (4, 8))
    r = b.slice(s, (1, 0), (2, 8))  # a view of the old state
    b.set_state("s", b.dynamic_update_slice(s, b.input("u", (1, 8)), [b.pos("p", 0, 3), 0]))
    b.export("z", b.matmul(r, b.input("w", (8, 2))))  # read after the update
    with pytest.raises(UnsupportedPrimitive, match="after its in-place update"):
        plan_graph(b.build(), recorded_profile("lavapipe"))
