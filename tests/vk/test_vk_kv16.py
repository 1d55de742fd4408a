"""16-bit K/V storage (issue 7 item 4): float16 and bfloat16 K/V stay 16-bit on the device
(half the bytes) and are computed in F32, on every schedule that takes them; the reference
rounds K/V to the storage dtype and computes in float64. A device without 16-bit storage
refuses with DtypeLowering naming the dtype and the missing feature."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pootvk
from pootvk.errors import BindError, DtypeLowering
from pootvk.ir import BF16, F16
from pootvk.ir import prims as P
from pootvk.ops import trace_attention
from pootvk.passes import canonicalize, compile_graph
from pootvk.plan import DecodeRequest, forced_schedule, plan_graph, recorded_profile
from pootvk.runtime.replay import Replay
from pootvk.shaders.generate import compile_plan
from tests.helpers import assert_close, reference_attention
from tests.vk.test_vk_attention import SCHEDULES

KV = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _qkv(rng, b=2, hq=8, hkv=2, lq=1, lk=300, dk=64, dv=64, dt=np.float16):
    q = rng.standard_normal((b, hq, lq, dk), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, dk), dtype=np.float32).astype(dt)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32).astype(dt)
    return q, k, v


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("kv", sorted(KV))
def test_16bit_kv_matches_the_reference_on_every_schedule(device, kv, schedule):
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, lq=3, lk=257, dk=72, dv=40, dt=KV[kv])
    m = np.where(rng.random((1, 8, 3, 257)) < 0.2, -np.inf, 0.0).astype(np.float32)
    ref = reference_attention(q, k.astype(np.float32), v.astype(np.float32), m, softcap=9.0)
    with forced_schedule(**SCHEDULES[schedule]):
        if schedule == "streaming":  # the streaming kernel is F32 only: a typed refusal
            short = {"float16": "f16", "bfloat16": "bf16"}[kv]
            with pytest.raises(DtypeLowering, match=f"at dtype {short} "):
                pootvk.attention(q, k, v, m, softcap=9.0, device=device)
            return
        out = pootvk.attention(q, k, v, m, softcap=9.0, device=device)
    assert out.dtype == np.float32
    assert_close(out, ref)


def test_16bit_kv_is_read_16bit():
    g = compile_graph(trace_attention((1, 8, 1, 64), (1, 2, 100, 64), (1, 2, 100, 64),
                                      kv_dtype=F16))
    assert g.count(P.ATTENTION) == 1 and g.count(P.CONVERT) == 0  # the Convert is folded
    (e,) = g.eqns
    assert e.params["form"].kv_dtype is F16 and e.inputs[1].dtype is F16
    p = plan_graph(g, recorded_profile("nvidia_h200"))
    assert p.buffers["in:k"].nbytes == 2 * 100 * 64 * 2  # half the bytes of F32
    req = p.kernels[0].request
    assert isinstance(req, DecodeRequest) and req.kv_dtype == "f16"


def test_a_device_without_16bit_storage_refuses_naming_the_feature():
    prof = recorded_profile("mobile_16k")
    prof = prof.with_(supports_16bit=False, extra={**prof.extra, "storage_buffer_16bit": False})
    g = compile_graph(trace_attention((1, 4, 1, 32), (1, 2, 50, 32), (1, 2, 50, 32),
                                      kv_dtype=BF16))
    with pytest.raises(DtypeLowering) as e:
        plan_graph(g, prof)
    assert e.value.dtype == "bf16" and "storageBuffer16BitAccess" in str(e.value)


def test_k_and_v_must_share_a_dtype(device):
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng)
    with pytest.raises(BindError, match="dtype"):
        pootvk.attention(q, k, v.astype(np.float32), device=device)


@pytest.mark.parametrize("kv", sorted(KV))
def test_unfused_16bit_chain_still_runs(device, kv):
    """Without the rewrite the chain runs as primitives: Convert kernels widen K/V."""
    dt = {"float16": F16, "bfloat16": BF16}[kv]
    g = trace_attention((1, 4, 2, 8), (1, 2, 9, 8), (1, 2, 9, 8), kv_dtype=dt)
    c = canonicalize(g)
    assert c.count(P.ATTENTION) == 0 and c.count(P.CONVERT) == 2
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, b=1, hq=4, hkv=2, lq=2, lk=9, dk=8, dv=8, dt=KV[kv])
    p = plan_graph(c, device.profile)  # planned as it is: build_replay would fuse it
    with Replay(device, p, compile_plan(p)) as rp:
        out = rp.step({"q": q, "k": k, "v": v})["out"]
    assert_close(out, reference_attention(q, k.astype(np.float32), v.astype(np.float32)))


@pytest.mark.parametrize("kv", sorted(KV))
def test_decode_loop_keeps_a_16bit_cache(device, kv):
    rng = np.random.default_rng(4)
    loop = pootvk.llm.DecodeLoop(1, 4, 2, 32, 40, device=device, kv_dtype=kv)
    assert loop.plan.buffers["state:k_cache"].nbytes == 2 * 40 * 32 * 2
    ks, vs = [], []
    for _ in range(7):
        q = rng.standard_normal((1, 4, 1, 32), dtype=np.float32)
        kn = rng.standard_normal((1, 2, 1, 32), dtype=np.float32)
        vn = rng.standard_normal((1, 2, 1, 32), dtype=np.float32)
        pos = loop.position
        out = loop.step(q, kn, vn)
        ks.append(kn.astype(KV[kv]).astype(np.float32))
        vs.append(vn.astype(KV[kv]).astype(np.float32))
        k_all, v_all = np.concatenate(ks, axis=2), np.concatenate(vs, axis=2)
        assert_close(out, reference_attention(q, k_all, v_all))
        assert pos == len(ks) - 1
    np.testing.assert_array_equal(loop.k_cache[:, :, :7].astype(np.float32), k_all)
    loop.close()
