"""Schedule choices over every recorded profile (issue 7): the rules, the refusals, and
`pootvk plan` printing them. No device needed."""

from __future__ import annotations

import re

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
from pootvk.plan.decode_schedule import (
    FEW_SPLITS_BYTES,
    MAX_SPLITS,
    MAX_SPLITS_FEW,
    MIN_CHUNK,
    _fill_waves,
)
from tests.helpers import without_regfed

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
        few = base * MAX_SPLITS * 2 <= cu and lk * 128 * 4 * 2 > FEW_SPLITS_BYTES
        cap = MAX_SPLITS_FEW if few else MAX_SPLITS
        assert 1 <= req.splits <= cap
        assert req.splits == 1 or req.chunk >= MIN_CHUNK  # never a chunk under 128 keys
        # ~2 workgroups per compute unit (ceil), moved by at most one split up when a
        # workgroup streams enough keys for its last wave to matter (_fill_waves)
        assert base * (req.splits - 2) < 2 * cu
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
    one = plan_for(h200, 1, 8, 1, 65536).kernels[0].request  # one KV head
    assert one.splits == 64 and one.rows_per_wg == 4 and one.workgroups == 128
    assert plan_for(h200, 32, 32, 8, 2048).kernels[0].request.splits == 1  # 256 >= 132 SMs
    assert plan_for(h200, 1, 32, 8, 32768, lq=3).kernels[0].request.splits == 1  # Lq > 1
    # few KV heads over a short cache (<= FEW_SPLITS_BYTES each, SmolLM2's attention) stay
    # at MAX_SPLITS, so the combine is fused into the partial launch
    short = plan_for(h200, 1, 9, 3, 4160, d=64).kernels
    assert len(short) == 1 and 1 < short[0].request.splits <= MAX_SPLITS
    assert short[0].request.fused_combine
    assert plan_for(h200, 1, 9, 3, 32768, d=64).kernels[0].request.splits > MAX_SPLITS


def test_split_count_fills_the_last_wave_of_workgroups():
    """Long chunks: the split count whose workgroups fill their last wave of SMs best (the
    H200 measurements in _fill_waves); short ones keep the ~2-per-SM count."""
    h200 = without_regfed(recorded_profile("nvidia_h200"))  # the scalar kernel's rule
    for kv in (F32, F16):
        b8 = plan_for(h200, 8, 32, 8, 8192, kv=kv).kernels[0].request
        assert b8.splits == 6 and b8.workgroups == 384  # 2.91 a SM; 5 splits: 2.42
        mha = plan_for(h200, 1, 32, 32, 32768, kv=kv).kernels[0].request
        assert mha.splits == 8 and mha.workgroups == 256  # 1.94 a SM; 9 splits: 2.18
        assert plan_for(h200, 1, 32, 8, 32768, kv=kv).kernels[0].request.splits == 16
    # short chunks (< WAVE_FILL_BYTES a workgroup): the default count, unmoved
    assert plan_for(h200, 1, 9, 3, 4160, d=64).kernels[0].request.splits == 13  # as before
    assert _fill_waves(64, 5, 132, 16) == 6 and _fill_waves(32, 9, 132, 16) == 8
    assert _fill_waves(8, 16, 132, 16) == 16  # one wave at the cap stays
    assert _fill_waves(8, 3, 10, 16) == 4  # equal fills: more workgroups


def test_fold_units_fold_every_row_in_one_round_where_it_fits():
    """The scalar kernel's fold holds twice the rows where it would take more than one
    round (16 lanes a key: 2 of 4 rows a round) and the doubled fold fits; not with one
    row, on a CPU, in the register-fed kernel, or where workgroup memory is short."""
    h200 = recorded_profile("nvidia_h200")
    f32 = plan_for(h200, 1, 32, 8, 32768).kernels[0].request
    assert (f32.lanes_per_key, f32.rows_per_wg, f32.fold_units) == (16, 4, 2)
    assert f32.shared_bytes <= h200.max_workgroup_memory
    assert plan_for(h200, 1, 32, 8, 32768, kv=F16).kernels[0].request.fold_units == 1
    assert plan_for(h200, 1, 32, 32, 32768).kernels[0].request.fold_units == 1  # one row
    assert plan_for(recorded_profile("lavapipe"), 1, 32, 8, 4096).kernels[0].request \
        .fold_units == 1
    tight = h200.with_(max_workgroup_memory=f32.shared_bytes - 4)
    assert plan_for(tight, 1, 32, 8, 32768).kernels[0].request.fold_units == 1


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
    # one KV head: 64 splits x 2 row blocks of 4 rows (64 workgroups would idle half the SMs)
    assert "grouped split-KV: 128 workgroups x 256 lanes" in out and "4 rows each" in out
    assert "scratch: 266240 B in the arena" in out
    assert "tiles in turn" not in out  # 1024 keys a split: consecutive tiles
    # 2048 keys a split on a GPU: the splits take the tiles in turn, both kernels
    for kv in ("float16", "float32"):
        assert main(["plan", "--profile", "nvidia_h200", "--shape", "1,32,8,32768,128",
                     "--kv-dtype", kv]) == 0
        assert "splits=16, fused combine, tiles in turn" in capsys.readouterr().out
    assert main(["plan", "--profile", "lavapipe", "--shape", "1,4,2,100,64",
                 "--kv-dtype", "bfloat16", "--lq", "2"]) == 0
    out = capsys.readouterr().out
    assert "splits=1" in out and "K/V bf16" in out
    assert main(["plan", "--profile", "nope", "--shape", "1,4,2,100,64"]) == 2
    assert "known:" in capsys.readouterr().err
    assert main(["plan", "--profile", "intel_arc_anv", "--shape", "1,4,2,100,64",
                 "--kv-dtype", "float16"]) == 2
    assert "storageBuffer16BitAccess" in capsys.readouterr().err


MLA = ["--shape", "1,128,1,32768,576", "--dv", "512", "--k-shared", "64"]  # DeepSeek-V3 decode


@pytest.mark.parametrize("profile", ["nvidia_h200", "lavapipe"])
def test_split_key_plan_builds_no_broadcast_key(capsys, profile):
    """`pootvk plan` of the MLA decode shape: one attention kernel (+ its combine) reading k,
    k_shared and v; no Concat/Broadcast kernel and no buffer of the whole key."""
    assert main(["plan", "--profile", profile, *MLA, "--kv-dtype", "float16", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "(k 512 + k_shared 64) Dv=512" in out
    kernels = [ln for ln in out.splitlines() if ln.startswith("  k")]
    assert kernels and all(" attention" in ln or " combine" in ln for ln in kernels), kernels
    assert "Broadcast" not in out and "Concat" not in out
    buffers = dict(re.findall(r"^  (\S+)\s+\w+\s+(\d+) B$", out, re.M))
    lk, item = 32768, 2
    assert buffers["in:k"] == str(lk * 512 * item) and buffers["in:v"] == str(lk * 512 * item)
    assert buffers["in:k_shared"] == str(lk * 64 * item)  # once, not once per head
    assert str(lk * 576 * item) not in buffers.values()  # no whole-key buffer anywhere
    assert f"K/V read: {lk * (512 + 64 + 512) * item} B" in out
    assert "shared 64" in out  # the attention kernel is the split-key one
    assert "split key (k_shared 64 wide, read once for every head)" in kernels[0]
    # the H200 lists 16x16x16 f16 cooperative matrices: the tensor-core kernel serves it
    assert ("tensor-core split-KV (staged" in kernels[0]) == (profile == "nvidia_h200")


def test_split_key_mla_schedule_fits_the_registers_and_compiles():
    """On the H200 the MLA decode shape gets the tensor-core (matrix) kernel within the
    workgroup memory, with splits filling the compute units; on a device without
    cooperative matrices the scalar kernel keeps a lane's query + accumulator state within
    2 * REG_FLOATS floats (wide heads: fewer rows per workgroup, 8-byte 16-bit loads). Both
    sources compile with no private array and read k_shared once per key."""
    from pootvk.plan.decode_schedule import REG_FLOATS
    from pootvk.shaders.compiler import compile_glsl
    from pootvk.shaders.generate import generate
    from tests.shaders.test_generated import PRIVATE_ARRAY

    g = trace_attention((1, 128, 1, 576), (1, 1, 32768, 512), (1, 1, 32768, 512),
                        kv_dtype=F16, k_shared_shape=(1, 1, 32768, 64))
    h200 = recorded_profile("nvidia_h200")
    scalar_only = h200.with_(extra={k: v for k, v in h200.extra.items() if k != "coopmat"})
    for prof, matrix in ((h200, 16), (scalar_only, 0)):
        r = plan_graph(compile_graph(g), prof).kernels[0].request
        assert isinstance(r, DecodeRequest) and r.dk_shared == 64 and r.matrix == matrix
        if matrix:  # two 16-row tiles a workgroup, one workgroup per SM
            assert r.shared_bytes <= prof.max_workgroup_memory and r.rows_per_wg == 32
            assert r.workgroups == prof.compute_units and r.splits == 33
        else:
            assert r.rows_per_wg * (576 + 512) <= 2 * REG_FLOATS * r.lanes_per_key
        assert r.workgroups >= 0.9 * prof.compute_units
        assert r.kv_bytes == 32768 * (512 + 64 + 512) * 2
        src = generate(r)
        assert ("ks[(ksrow + min(" if matrix else "ks[ksb0") in src, src[:400]
        assert not PRIVATE_ARRAY.findall(src)
        assert compile_glsl(src)


def test_lavapipe_from_mesa_23_serves_at_most_two_rows():
    """Mesa >= 23's lavapipe compiles the unrolled multi-row decode kernel far slower (first
    call 5.5-5.9 s at 4 rows, 2.5 s at 2 on Mesa 25.0.7): two rows there, four on 22.3 (1.4-1.7x
    faster at run time)."""
    import dataclasses

    from pootvk.plan.decode_schedule import DecodeProblem, choose_decode_schedule

    base = recorded_profile("lavapipe")
    p = DecodeProblem(b=1, hq=8, hkv=2, lq=1, lk=256, dk=128, dv=128, scale=0.1)
    rows = {}
    for info in ("Mesa 22.3.6 (LLVM 15.0.6)", "Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)",
                 "Mesa 23.0.0", "not mesa"):
        prof = dataclasses.replace(base, extra={**base.extra, "driver_info": info})
        rows[info] = choose_decode_schedule(p, prof, has_subgroup_shuffle=True).rows_per_wg
    assert rows == {"Mesa 22.3.6 (LLVM 15.0.6)": 4, "Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)": 2,
                    "Mesa 23.0.0": 2, "not mesa": 4}
