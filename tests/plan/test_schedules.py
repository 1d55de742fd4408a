"""Schedule choices over every recorded profile (issue 7): the rules, the refusals, and
`pootvk plan` printing them. No device needed."""

from __future__ import annotations

import pytest

from pootvk.cli import main
from pootvk.errors import BindingRange, DtypeLowering
from pootvk.ir import BF16, F16, F32
from pootvk.ops import trace_attention
from pootvk.passes import compile_graph
from pootvk.plan import (
    AttentionRequest,
    DecodeCombineRequest,
    DecodeRequest,
    forced_schedule,
    plan_graph,
    recorded_profile,
    recorded_profiles,
)
from pootvk.plan.decode_schedule import MAX_SPLITS, MAX_SPLITS_FEW, MIN_CHUNK

BENCH = [(1, 32, 8, 4096), (1, 32, 8, 32768), (1, 32, 8, 131072), (8, 32, 8, 8192),
         (1, 32, 32, 32768), (32, 32, 8, 2048), (1, 8, 1, 65536)]


def plan_for(profile, b, hq, hkv, lk, d=128, kv=F32, lq=1):
    g = trace_attention((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d), kv_dtype=kv)
    return plan_graph(compile_graph(g), profile)


@pytest.mark.parametrize("name", sorted(recorded_profiles()))
@pytest.mark.parametrize("shape", BENCH)
def test_the_split_rule_on_every_profile(name, shape):
    prof = recorded_profile(name)
    b, hq, hkv, lk = shape
    if b * hkv * lk * 128 * 4 > prof.max_storage_buffer_range:  # K alone passes one binding
        with pytest.raises(BindingRange, match="maxStorageBufferRange"):
            plan_for(prof, *shape)
        return
    p = plan_for(prof, *shape)
    req = p.kernels[0].request
    assert isinstance(req, DecodeRequest)
    base = b * hkv * req.row_blocks
    cu = prof.compute_units
    if prof.device_type == "cpu" or base >= cu:
        assert req.splits == 1  # the rows already fill the compute units (or a CPU)
    else:
        cap = MAX_SPLITS_FEW if base * MAX_SPLITS * 2 <= cu else MAX_SPLITS
        assert 1 <= req.splits <= cap
        assert req.splits == 1 or req.chunk >= MIN_CHUNK  # never a chunk under 128 keys
        assert base * (req.splits - 1) < 2 * cu  # ~2 workgroups per compute unit (ceil)
    assert req.workgroups == base * req.splits
    assert req.subgroup == prof.subgroup_shuffle  # shared-memory reduction without them
    assert req.shared_bytes <= prof.max_workgroup_memory
    assert req.local_size <= prof.max_invocations
    if req.splits > 1:  # declared scratch: partials in the arena, sized by the request
        scratch = [q.item for q in p.arena.placements.values() if q.item.scratch]
        assert [i.nbytes for i in scratch] == [req.partial_floats * 4]
        assert len(p.kernels) == (1 if req.fused_combine else 2)
        if not req.fused_combine:
            assert isinstance(p.kernels[1].request, DecodeCombineRequest)


def test_h200_splits_measured_rules():
    h200 = recorded_profile("nvidia_h200")
    assert plan_for(h200, 1, 32, 8, 131072).kernels[0].request.splits == 16
    assert plan_for(h200, 1, 8, 1, 65536).kernels[0].request.splits == 64  # one KV head
    assert plan_for(h200, 32, 32, 8, 2048).kernels[0].request.splits == 1  # 256 >= 132 SMs
    assert plan_for(h200, 1, 32, 8, 32768, lq=3).kernels[0].request.splits == 1  # Lq > 1


def test_16bit_kv_needs_16bit_storage_on_the_profile():
    intel = recorded_profile("intel_arc_anv")
    assert not intel.extra.get("storage_buffer_16bit")
    with pytest.raises(DtypeLowering, match="storageBuffer16BitAccess"):
        plan_for(intel, 1, 32, 8, 4096, kv=F16)
    h200 = recorded_profile("nvidia_h200")
    for kv in (F16, BF16):
        req = plan_for(h200, 1, 32, 8, 4096, kv=kv).kernels[0].request
        assert req.kv_dtype == kv.value and req.load_elems == 8  # 16-byte loads


def test_streaming_is_the_fallback_that_always_fits():
    tiny = recorded_profile("mobile_16k").with_(max_workgroup_memory=2048)
    p = plan_for(tiny, 1, 8, 2, 300, d=64)  # the grouped fold does not fit 2 KiB
    assert isinstance(p.kernels[0].request, (AttentionRequest, DecodeRequest))
    with forced_schedule("streaming"):
        req = plan_for(recorded_profile("nvidia_h200"), 1, 8, 2, 300).kernels[0].request
    assert isinstance(req, AttentionRequest)


def test_pootvk_plan_prints_the_choices(capsys):
    assert main(["plan", "--profile", "nvidia_h200", "--shape", "1,8,1,65536,128"]) == 0
    out = capsys.readouterr().out
    assert "splits=64" in out and "split combine" in out and "132 compute units" in out
    assert "grouped split-KV: 64 workgroups x 256 lanes" in out
    assert "scratch: 266240 B in the arena" in out
    assert main(["plan", "--profile", "lavapipe", "--shape", "1,4,2,100,64",
                 "--kv-dtype", "bfloat16", "--lq", "2"]) == 0
    out = capsys.readouterr().out
    assert "splits=1" in out and "K/V bf16" in out
    assert main(["plan", "--profile", "nope", "--shape", "1,4,2,100,64"]) == 2
    assert "known:" in capsys.readouterr().err
    assert main(["plan", "--profile", "intel_arc_anv", "--shape", "1,4,2,100,64",
                 "--kv-dtype", "float16"]) == 2
    assert "storageBuffer16BitAccess" in capsys.readouterr().err
