"""Fused kernels with moved indices on the device against the oracle: the RoPE chain as one
kernel, a concat of computed operands, and state writes that compute their update in place
(FusedUpdate): F32 and F16 states, starts clamped at the edges, a failed guard's gate."""


import numpy as np
import pytest

from pootvk.cli import kernel_summary
from pootvk.errors import GuardFailed
from pootvk.ir import F16, F32, I32
from pootvk.ir import prims as P
from pootvk.ir.fused import FUSED, FUSED_REDUCE, FUSED_ROW, FUSED_UPDATE
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.passes import compile_graph
from pootvk.plan import FusedUpdateRequest, plan_graph
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan
from tests.helpers import assert_close, nse, random_inputs
from tests.passes.test_fuse_moves import dus_graph, rope_graph
from tests.random_graphs import rms_norm
from tests.vk.test_vk_fused import check
from tests.vk.test_vk_graphs import run_on_device


@pytest.mark.parametrize("shape", [(1, 12, 1, 64), (2, 3, 5, 6)])
def test_rope_one_kernel(device, shape):
    g = rope_graph(shape)
    c = check(device, g, random_inputs(g, np.random.default_rng(1)))
    assert [e.prim for e in c.eqns] == [FUSED]
    assert [k.label for k in plan_graph(c, device.profile).kernels] == ["fused"]


def test_a_three_way_concat_of_computed_operands(device):
    b = Builder()
    x, y = b.input("x", (3, 2, 4)), b.input("y", (3, 5, 4))
    z = b.concat([b.unary("Exp", x), b.slice(b.mul(y, 2.0), (0, 1, 0), (3, 4, 4)),
                  b.unary("Neg", x)], axis=1)
    b.export("z", b.add(z, b.input("w", (7, 1))))
    g = b.build()
    c = check(device, g, random_inputs(g, np.random.default_rng(2)))
    assert [e.prim for e in c.eqns] == [FUSED]


def test_transposes_and_reshapes_inside_one_body(device):
    """A permuted read, a reshape that only adds unit axes, and one that regroups axes
    (through the row-major offset), around computed values: one kernel."""
    b = Builder()
    x = b.input("x", (2, 3, 4))
    t = b.transpose(b.unary("Tanh", x), (2, 0, 1))  # [4, 2, 3]
    r = b.reshape(b.mul(t, 2.0), (1, 4, 6))  # regrouped: [4, 6] under a unit axis
    z = b.reshape(b.add(r, b.input("y", (1, 4, 6))), (3, 8))  # regrouped again
    b.export("z", b.transpose(b.unary("Neg", z), (1, 0)))
    g = b.build()
    c = check(device, g, random_inputs(g, np.random.default_rng(6)))
    assert [e.prim for e in c.eqns] == [FUSED]


@pytest.mark.parametrize("dt", [F32, F16])
def test_gathers_and_moves_inside_bodies_and_row_kernels(device, dt):
    """A gathered row read through by an elementwise body (indices past both ends clamp,
    as Gather's do), an RMSNorm of gathered rows as one row kernel, and a sum of a slice."""
    b = Builder()
    table = b.param("table", (10, 8), dt)
    ids = b.input("ids", (4,), I32)
    row = b.convert(b.gather(table, ids), F32)
    b.export("g", b.mul(b.unary("Tanh", row), b.input("c", (4, 8))))
    b.export("n", rms_norm(b, b.convert(b.gather(table, b.input("j", (3,), I32)), F32),
                           b.param("w", (8,))))
    x = b.input("x", (5, 12))
    b.export("s", b.reduce("Sum", b.unary("Abs", b.slice(x, (0, 3), (5, 11))), 1))
    g = b.build()
    ins = random_inputs(g, np.random.default_rng(8))
    ins["ids"] = np.array([3, -2, 12, 9], np.int32)
    ins["j"] = np.array([0, 5, 100], np.int32)
    c = check(device, g, ins, tol=1e-6 if dt is F32 else 1e-3)
    assert c.count(P.GATHER) == c.count(P.SLICE) == 0
    assert c.count(FUSED_ROW) == 1 and c.count(FUSED_REDUCE) == 1


@pytest.mark.parametrize("kv", [F32, F16])
def test_a_fused_state_write_on_the_device(device, kv):
    """The state after the step, and what the step read of it, for starts inside the state
    and past both edges (clamped like DynamicUpdateSlice's)."""
    g = dus_graph(kv)
    c = compile_graph(g)
    assert c.count(FUSED_UPDATE) == 1
    plan = plan_graph(c, device.profile)
    (req,) = [k.request for k in plan.kernels if isinstance(k.request, FusedUpdateRequest)]
    assert req.state == ((1, 2, 6, 8), kv) and req.threads == 16
    assert kernel_summary(req) == f"fused update {req.body}: 16 invocations, in place"
    assert req.describe().startswith(f"FusedUpdate[{req.body}] into {kv.value}[1,2,6,8]")
    for p in (-4, 0, 3, 5, 9):
        ins = random_inputs(g, np.random.default_rng(p + 20))
        ins["p"] = np.int32(p)
        out, states = run_on_device(device, c, ins)
        ref = evaluate(g, ins)
        tol = 1e-6 if kv is F32 else 1e-3  # an F16 rounding of a 1-ulp F32 difference
        assert_close(states["s"].astype(np.float32), ref["s"].astype(np.float32), tol)
        assert_close(out["y"], ref["y"], tol)
        row = min(max(p, 0), 5)
        untouched = np.delete(np.arange(6), row)
        np.testing.assert_array_equal(states["s"][:, :, untouched], ins["s"][:, :, untouched])


def test_a_failed_guard_skips_the_fused_write(device):
    g = dus_graph(gate=True)
    c = compile_graph(g)
    plan = plan_graph(c, device.profile)
    ins = random_inputs(g, np.random.default_rng(5))
    with Replay(device, plan, compile_plan(plan)) as rp:
        rp.set_state("s", ins["s"])
        step = {k: v for k, v in ins.items() if k != "s"}
        with pytest.raises(GuardFailed):
            rp.step({**step, "p": np.int32(2), "n": np.array([0], np.int32)})
        np.testing.assert_array_equal(rp.read_state("s"), ins["s"])  # not written
        rp.step({**step, "p": np.int32(2), "n": np.array([4], np.int32)})
        got = rp.read_state("s")
    want = evaluate(c, {**ins, "p": np.int32(2), "n": np.array([4], np.int32)})["s"]
    assert_close(got, want, 1e-6)
    assert not np.array_equal(got[:, :, 2], ins["s"][:, :, 2])


def test_a_small_llama_decodes_like_the_oracle_with_fused_writes(device):
    """Two layers at test size, F16 caches: q's rotation one kernel, k's inside its cache
    write, both narrowings fused into the writes; logits and caches after prefill and
    decode steps match the oracle's."""
    from pootvk.llm.model import LlamaConfig, LlamaModel, OracleLlama, trace_llama

    cfg = LlamaConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, hidden=32,
                      intermediate=64, vocab=50, capacity=16, kv_dtype="float16")
    labels = [k.label for k in plan_graph(compile_graph(trace_llama(cfg)),
                                          device.profile, group=False).kernels]
    assert labels.count("fused update") == 2 * cfg.layers and "Slice" not in labels
    oracle = OracleLlama(cfg, seed=3)
    with LlamaModel(cfg, device=device, seed=3, buckets=(4,)) as model:
        got = list(model.generate([5, 2, 9], 4))
        want = list(oracle.generate([5, 2, 9], 4))
        assert [t for t, _ in got] == [t for t, _ in want]
        assert max(nse(a, b) for (_, a), (_, b) in zip(got, want, strict=True)) <= 5e-4
        n = model.position
        np.testing.assert_allclose(
            model.program.state("l1.k_cache")[:, :, :n].astype(np.float32),
            oracle.states["l1.k_cache"][:, :, :n].astype(np.float32), rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("dt", [F32, F16])
def test_a_reshape_dropping_unit_axes_of_a_computed_value(device, dt):
    """tanh(x [2, 1, 1]) reshaped to [2]: the body's tanh has more axes than the output
    (hypothesis found the generator indexing past the output's index; regression)."""
    b = Builder()
    x = b.input("x", (2, 1, 1), dt)
    y = b.unary("Tanh", x if dt is F32 else b.convert(x, F32))
    b.export("y", b.mul(b.reshape(y, (2,)), b.input("w", (2,))))
    g = b.build()
    check(device, g, random_inputs(g, np.random.default_rng(11)))
