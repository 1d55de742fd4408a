"""Plan rules of the fused primitives: one kernel each, bindings in operand order with their
storage dtypes, a row's lane count, folded grids, and the one-line summaries."""

from pootvk.cli import kernel_summary
from pootvk.ir import F16, F32
from pootvk.ops import Builder
from pootvk.passes import compile_graph
from pootvk.plan import FusedReduceRequest, FusedRequest, plan_graph, recorded_profile
from pootvk.plan.fused import REDUCE_LANES, reduce_lanes
from tests.random_graphs import rms_norm

LAVAPIPE = recorded_profile("lavapipe")


def test_lanes_cover_the_row_up_to_the_cap():
    assert [reduce_lanes(n, 1024) for n in (1, 2, 3, 64, 65, 4096)] == [1, 2, 4, 64, 128, 256]
    assert reduce_lanes(4096, 128) == 128 and REDUCE_LANES == 256


def test_rms_norm_plans_one_row_kernel_with_16bit_bindings():
    b = Builder()
    x = b.input("x", (5, 96), F16)
    y = rms_norm(b, b.convert(x, F32), b.convert(b.param("w", (96,), F16), F32))
    b.export("y", b.convert(y, F16))
    b.export("z", b.mul(b.unary("Silu", b.input("g", (5, 96))), 2.0))
    p = plan_graph(compile_graph(b.build()), LAVAPIPE, group=False)
    reqs = {k.label: k.request for k in p.kernels}
    assert sorted(reqs) == ["Convert", "fused", "fused row"]  # x widened once: read twice
    row = reqs["fused row"]
    assert isinstance(row, FusedReduceRequest) and row.epilogue is not None
    assert (row.rows, row.lanes, row.grid) == (5, 128, (5, 1))
    assert [(bd.name, bd.dtype) for bd in row.bindings()] == [("x0", F32), ("x1", F16),
                                                               ("y", F16)]
    assert kernel_summary(row) == "fused row (Sum): 5 workgroups x 128 lanes"
    fused = reqs["fused"]
    assert isinstance(fused, FusedRequest) and fused.threads == 480
    assert kernel_summary(fused) == "fused Mul(Unary[Silu](x0), 2.0): 480 invocations"


def test_many_rows_fold_into_a_2d_grid():
    b = Builder()
    x = b.input("x", (300, 8))
    b.export("y", rms_norm(b, x, b.param("w", (8,))))
    p = plan_graph(compile_graph(b.build()), LAVAPIPE.with_(max_grid=(64, 65535, 65535)))
    (k,) = p.kernels
    assert k.request.grid == (60, 5) and k.request.rows == 300
