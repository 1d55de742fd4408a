"""MatMul and the folded Linear on the live device (lavapipe in CI) against a float64 numpy
reference on the storage-rounded operands: the GEMV kernels (both weight layouts), the tiled
GEMM, F32/F16/BF16 weights, odd K and N, batch folding and broadcast batch dims, the subgroup
and the workgroup-memory reductions, and forced schedule fields (several reduction rounds,
one lane per output, vectors narrower than 16 bytes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pootvk.ir import BF16, F16, F32, DType
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.passes import compile_graph
from pootvk.plan import MatMulCombineRequest, MatMulKind, MatMulRequest, forced_matmul
from pootvk.runtime import build_replay
from tests.helpers import assert_close, examples

TOL = 1e-6  # normalised squared error: F32 accumulation over K <= 600 terms


def stored(x: np.ndarray, dt: DType) -> np.ndarray:
    """The values a ``dt`` buffer holds, as float32 (what the reference multiplies)."""
    if dt is F16:
        return x.astype(np.float16).astype(np.float32)
    if dt is BF16:
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    return x.astype(np.float32)


def linear_graph(a_shape, w_shape, dt: DType, transpose: bool):
    """``x @ [Transpose] [Convert] w`` as a model traces it (w stored [.., N, K] when
    transposed)."""
    b = Builder()
    x = b.input("x", a_shape)
    w = b.param("w", w_shape, dt)
    wf = w if dt is F32 else b.convert(w, F32)
    if transpose:
        r = len(w_shape)
        wf = b.transpose(wf, (*range(r - 2), r - 1, r - 2))
    b.export("y", b.matmul(x, wf))
    return b.build()


def run(device, a_shape, w_shape, dt=F32, transpose=False, kind=None, seed=0, **fields):
    """Run on the device; return (output, float64 reference, the matmul request)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(a_shape).astype(np.float32)
    w = stored(rng.standard_normal(w_shape).astype(np.float32), dt)
    g = linear_graph(a_shape, w_shape, dt, transpose)
    with forced_matmul(kind, **fields), build_replay(g, device) as rp:
        reqs = [k.request for k in rp.plan.kernels]
        assert len(reqs) == 1 and isinstance(reqs[0], MatMulRequest), [r.describe() for r in reqs]
        rp.set_params({"w": w})
        y = rp.step({"x": x})["y"]
    w64 = w.astype(np.float64)
    if transpose:
        w64 = np.swapaxes(w64, -1, -2)
    return y, x.astype(np.float64) @ w64, reqs[0]


DTS = [F32, F16, BF16]


@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.value)
@pytest.mark.parametrize("transpose", [False, True], ids=["KxN", "NxK"])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 48), (3, 37, 45), (2, 200, 130)])
def test_gemv(device, dt, transpose, m, k, n):
    """Decode rows: the GEMV for the layout; odd K/N take narrower vectors and tails."""
    w_shape = (n, k) if transpose else (k, n)
    y, ref, req = run(device, (m, k), w_shape, dt, transpose)
    assert req.kind is (MatMulKind.GEMV_T if transpose else MatMulKind.GEMV_N)
    assert req.b_dtype is dt and req.transpose_b is transpose
    assert_close(y, ref, TOL)


@pytest.mark.parametrize("dt", [F32, F16], ids=lambda d: d.value)
@pytest.mark.parametrize("transpose", [False, True], ids=["KxN", "NxK"])
def test_gemm(device, dt, transpose):
    """Prefill rows: the tiled GEMM, M and N not multiples of its tiles, K not of TILE_K."""
    m, k, n = 70, 37, 45
    y, ref, req = run(device, (m, k), (n, k) if transpose else (k, n), dt, transpose)
    assert req.kind is MatMulKind.GEMM
    assert_close(y, ref, TOL)


def test_gemm_bf16_batched_broadcast(device):
    """Batch dims broadcast in both operands: [2,1,20,K] @ [3,N,K]^T -> [2,3,20,N]."""
    y, ref, req = run(device, (2, 1, 20, 33), (3, 29, 33), BF16, True)
    assert req.kind is MatMulKind.GEMM and req.batch == (2, 3)
    assert y.shape == (2, 3, 20, 29)
    assert_close(y, ref, TOL)


def test_gemv_batched_weights(device):
    """A batched B (attention-like [B,H,1,K] @ [B,H,K,N]) is not folded into rows; A
    broadcasts over one batch dim."""
    y, ref, req = run(device, (2, 1, 1, 24), (2, 3, 24, 20), F16)
    assert req.kind is MatMulKind.GEMV_N and req.batch == (2, 3)
    assert req.a_strides == (24, 0)
    assert_close(y, ref, TOL)


def test_weight_rows_fold(device):
    """x[2,3,K] @ W: one [6,K] product (W read once), still GEMV at 6 rows."""
    y, ref, req = run(device, (2, 3, 40), (24, 40), F16, True)
    assert req.kind is MatMulKind.GEMV_T and req.batch == () and req.m == 6
    assert_close(y, ref, TOL)


@pytest.mark.parametrize("transpose", [False, True], ids=["KxN", "NxK"])
def test_gemv_shared_memory_reduction(device, transpose):
    """Without subgroup shuffles every partial folds through workgroup memory."""
    k, n = 96, 40
    y, ref, req = run(device, (2, k), (n, k) if transpose else (k, n), F16, transpose,
                      subgroup=False)
    assert not req.subgroup
    assert_close(y, ref, TOL)


@pytest.mark.parametrize("subgroup", [False, True], ids=["shared", "subgroup"])
def test_gemv_n_many_rounds_and_narrow_words(device, subgroup):
    """8 rows x 8 outputs per lane with 64 k groups: the reduction takes several rounds of
    workgroup memory (teams of lanes add each pair's partials with shuffles); a tiny N tile
    (2 words) and unroll 3 leave tails on both axes."""
    y, ref, req = run(device, (8, 301), (301, 40), F16, False, "gemv_n",
                      lanes=2, groups=64, unroll=3, subgroup=subgroup)
    assert req.vec == 8 and req.local_size == 128
    assert_close(y, ref, TOL)


def test_gemv_t_forced_fields(device):
    """One output per 2-lane group, 3 outputs per group, 2-element words (K = 2 mod 4)."""
    y, ref, req = run(device, (3, 58), (50, 58), BF16, True, "gemv_t",
                      lanes=2, groups=16, outs=3, unroll=3)
    assert req.vec == 2
    assert_close(y, ref, TOL)


@pytest.mark.parametrize("dt", [F32, F16], ids=lambda d: d.value)
@pytest.mark.parametrize("transpose", [False, True], ids=["KxN", "NxK"])
@pytest.mark.parametrize(("k", "n"), [(1032, 2120), (8200, 72)])
def test_gemv_h200_rule_shapes(device, dt, transpose, k, n):
    """The launch shapes the GPU rule picks on the H200 profile (1024-invocation GEMV_N with
    up to 256 k groups and 8 loads per lane; 32-lane GEMV_T with 4 groups), forced on the
    CI device: tails along K (K not a multiple of groups * unroll) and a partial N tile."""
    from pootvk.plan import choose_matmul, recorded_profile

    w_shape = (n, k) if transpose else (k, n)
    h200 = choose_matmul((1, k), w_shape, (1, n), transpose_b=transpose, b_dtype=dt,
                         profile=recorded_profile("nvidia_h200"))
    fields = {f: getattr(h200, f) for f in ("lanes", "groups", "outs", "unroll")}
    y, ref, req = run(device, (1, k), w_shape, dt, transpose, h200.kind.value, **fields)
    assert (req.lanes, req.groups, req.unroll) == (h200.lanes, h200.groups, h200.unroll)
    assert_close(y, ref, 1e-5)


def test_gemm_forced_on_decode_rows(device):
    """The GEMM is correct for one row too (forced), in the tiles' smallest form."""
    y, ref, req = run(device, (1, 50), (50, 7), F32, False, "gemm", tile_m=32, tile_n=32)
    assert req.kind is MatMulKind.GEMM
    assert_close(y, ref, TOL)


def test_plain_matmul_of_activations(device):
    """MatMul of two traced F32 values (no weight, no fold) still runs the new kernels."""
    b = Builder()
    x, z = b.input("x", (3, 17)), b.input("z", (17, 9))
    b.export("y", b.matmul(x, z))
    g = b.build()
    rng = np.random.default_rng(4)
    xv, zv = rng.standard_normal((3, 17), np.float32), rng.standard_normal((17, 9), np.float32)
    with build_replay(g, device) as rp:
        assert compile_graph(g).count(P.MATMUL) == 1
        y = rp.step({"x": xv, "z": zv})["y"]
    assert_close(y, xv.astype(np.float64) @ zv.astype(np.float64), TOL)


@settings(max_examples=examples(12), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.sampled_from([1, 2, 3, 5, 8, 9, 33]), k=st.integers(1, 130),
       n=st.integers(1, 70), dt=st.sampled_from(DTS), transpose=st.booleans(),
       batch=st.sampled_from([((), ()), ((2,), ()), ((2, 1), (1, 3)), ((1,), (2,))]),
       subgroup=st.booleans())
def test_matmul_sweep(device, m, k, n, dt, transpose, batch, subgroup):
    """Random shapes, dtypes, layouts, broadcast batches and reductions agree with float64."""
    ba, bb = batch
    w_shape = (*bb, n, k) if transpose else (*bb, k, n)
    y, ref, _ = run(device, (*ba, m, k), w_shape, dt, transpose, subgroup=subgroup)
    assert_close(y, ref, TOL)


@pytest.mark.parametrize("dt", [F16, BF16], ids=lambda d: d.value)
@pytest.mark.parametrize(("a_shape", "b_shape", "kind"), [
    ((2, 1, 40), (2, 40, 24), MatMulKind.GEMV_N),  # batched b (an unfused attention P @ V)
    ((33, 20), (20, 9), MatMulKind.GEMM),
])
def test_a_16bit_matmul_reads_and_writes_16bit(device, dt, a_shape, b_shape, kind):
    """MatMul of two F16/BF16 values: both read 16-bit, F32 arithmetic, the output rounded
    to the dtype at its store."""
    rng = np.random.default_rng(6)
    x = stored(rng.standard_normal(a_shape).astype(np.float32), dt)
    w = stored(rng.standard_normal(b_shape).astype(np.float32), dt)
    b = Builder()
    b.export("y", b.matmul(b.input("x", a_shape, dt), b.input("w", b_shape, dt)))
    with build_replay(b.build(), device) as rp:
        (req,) = [k.request for k in rp.plan.kernels]
        assert req.kind is kind and req.a_dtype is dt and req.out_dtype is dt
        y = rp.step({"x": x.astype(dt.numpy), "w": w.astype(dt.numpy)})["y"]
    want = x.astype(np.float64) @ w.astype(np.float64)
    # every output is a value of the dtype (rounded at the store)
    np.testing.assert_array_equal(np.asarray(y, np.float32), stored(np.asarray(y, np.float32), dt))
    assert_close(np.asarray(y, np.float64), want, 1e-6 if dt is F16 else 2e-5)


def _run_split(device, a_shape, w_shape, dt, splits, **fields):
    """A forced split-K GEMV_N: the partial launch and its combine (two kernels)."""
    rng = np.random.default_rng(splits)
    x = rng.standard_normal(a_shape).astype(np.float32)
    w = stored(rng.standard_normal(w_shape).astype(np.float32), dt)
    g = linear_graph(a_shape, w_shape, dt, False)
    with forced_matmul("gemv_n", splits=splits, **fields), build_replay(g, device) as rp:
        reqs = [k.request for k in rp.plan.kernels]
        rp.set_params({"w": w})
        y = rp.step({"x": x})["y"]
    return y, x.astype(np.float64) @ w.astype(np.float64), reqs


@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.value)
@pytest.mark.parametrize(("a_shape", "w_shape", "splits", "fields"), [
    ((1, 300), (300, 72), 4, {"lanes": 8, "groups": 8, "unroll": 4}),  # K % splits = 0
    ((3, 301), (301, 40), 7, {"lanes": 4, "groups": 16, "unroll": 3}),  # uneven slices, M = 3
    ((1, 9), (9, 130), 4, {"lanes": 2, "groups": 2, "unroll": 2}),  # an empty last slice
    ((2, 1, 64), (2, 64, 24), 3, {}),  # batched weights: partials per batch element
])
def test_gemv_n_split_k(device, dt, a_shape, w_shape, splits, fields):
    """Split-K GEMV_N: each workgroup sums one contiguous K slice into F32 partials (declared
    scratch), the combine sums the slices; uneven and empty slices, several rows, batches."""
    y, ref, reqs = _run_split(device, a_shape, w_shape, dt, splits, **fields)
    part, comb = reqs
    assert isinstance(part, MatMulRequest) and part.splits == splits
    assert isinstance(comb, MatMulCombineRequest) and comb.partial == part
    assert part.workgroups == part.tiles * splits * max(1, part.batch_size)
    assert_close(y, ref, TOL)


def test_split_k_of_16bit_values_rounds_at_the_combine(device):
    """A plain F16 matmul split over K: partials stay F32, the combine rounds the sum once."""
    rng = np.random.default_rng(3)
    x = stored(rng.standard_normal((2, 1, 50)).astype(np.float32), F16)
    w = stored(rng.standard_normal((2, 50, 20)).astype(np.float32), F16)
    b = Builder()
    b.export("y", b.matmul(b.input("x", x.shape, F16), b.input("w", w.shape, F16)))
    with forced_matmul("gemv_n", splits=5), build_replay(b.build(), device) as rp:
        part, comb = [k.request for k in rp.plan.kernels]
        assert part.out_dtype is F16 and comb.partial.splits == 5
        y = rp.step({"x": x.astype(np.float16), "w": w.astype(np.float16)})["y"]
    want = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_array_equal(np.asarray(y, np.float32), stored(np.asarray(y, np.float32), F16))
    assert_close(np.asarray(y, np.float64), want, 1e-6)
