"""Which matmul kernel the planner picks, by shape and profile, and that the folded forms
run no Transpose or Convert kernel."""

import pytest

from pootvk.errors import ShapeError
from pootvk.ir import F16, F32
from pootvk.ops import Builder
from pootvk.passes import compile_graph
from pootvk.plan import (
    MatMulKind,
    MatMulRequest,
    forced_matmul,
    plan_graph,
    recorded_profile,
    recorded_profiles,
)

H200 = recorded_profile("nvidia_h200")


def _linear(rows, k, n, transpose, dt=F16):
    b = Builder()
    x = b.input("x", rows + (k,))
    w = b.param("w", (n, k) if transpose else (k, n), dt)
    wf = b.convert(w, F32) if dt is not F32 else w
    if transpose:
        wf = b.transpose(wf, (1, 0))
    b.export("y", b.matmul(x, wf))
    return compile_graph(b.build())


def _only_request(g, profile=H200) -> MatMulRequest:
    plan = plan_graph(g, profile)
    reqs = [k.request for k in plan.kernels]
    assert len(reqs) == 1, [r.describe() for r in reqs]  # no transpose, no convert kernel
    assert isinstance(reqs[0], MatMulRequest)
    return reqs[0]


@pytest.mark.parametrize(("k", "n"), [(4096, 4096), (4096, 14336), (8192, 28672), (576, 1536)])
@pytest.mark.parametrize("transpose", [False, True], ids=["KxN", "NxK"])
def test_decode_rows_take_a_gemv_that_fills_the_h200(k, n, transpose):
    r = _only_request(_linear((1,), k, n, transpose), H200)
    assert r.kind is (MatMulKind.GEMV_T if transpose else MatMulKind.GEMV_N)
    assert r.vec == 8 and r.b_dtype is F16  # 16-byte loads of the 16-bit words
    assert r.subgroup and r.local_size % 32 == 0
    if n >= 4096:
        assert r.workgroups >= H200.compute_units  # at least one wave of workgroups


def test_prefill_rows_take_the_tiled_gemm():
    r = _only_request(_linear((4, 128), 4096, 1024, True), H200)
    assert r.kind is MatMulKind.GEMM and r.m == 512 and r.batch == ()
    assert r.tile_m == 64 and r.tile_n == 64


def test_rows_switch_at_the_gemv_limit():
    assert _only_request(_linear((8,), 64, 32, False)).kind is MatMulKind.GEMV_N
    assert _only_request(_linear((9,), 64, 32, False)).kind is MatMulKind.GEMM


def test_every_recorded_profile_plans_within_its_limits():
    for name, prof in recorded_profiles().items():
        for g in (_linear((1,), 576, 1536, True, F32), _linear((1,), 576, 1536, False, F32),
                  _linear((100,), 96, 80, True, F32)):
            r = _only_request(g, prof)
            assert r.local_size <= prof.max_invocations, name
            assert r.grid[0] <= prof.max_grid[0], name


def test_forced_fields_are_checked():
    g = _linear((1,), 64, 48, False)
    wrong = r"stored \[N, K\]; this b is stored \[K, N\]"
    with forced_matmul("gemv_t"), pytest.raises(ShapeError, match=wrong):
        plan_graph(g, H200)
    with forced_matmul(lanes=3), pytest.raises(ShapeError, match="powers of two"):
        plan_graph(g, H200)
    with forced_matmul(vec=16), pytest.raises(ShapeError, match="vec"):
        plan_graph(g, H200)
