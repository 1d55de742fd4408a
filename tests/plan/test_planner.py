import pytest

from pootvk.errors import AttentionLds, DtypeLowering, GridLimit, UnsupportedPrimitive
from pootvk.ir import F16
from pootvk.ops import Builder, trace_attention, trace_decode_step
from pootvk.passes import compile_graph
from pootvk.plan import (
    AttentionRequest,
    DecodeRequest,
    DeviceProfile,
    choose_lanes,
    fold_grid,
    forced_schedule,
    plan_graph,
    recorded_profile,
    recorded_profiles,
)

LAVAPIPE = recorded_profile("lavapipe")


def attn_plan(profile, dv=64, b=1, hq=8, lq=1):
    g = compile_graph(trace_attention((b, hq, lq, 64), (b, 2, 100, 64), (b, 2, 100, dv)))
    return plan_graph(g, profile)


def test_recorded_profiles_load():
    ps = recorded_profiles()
    assert {"lavapipe", "nvidia_h200", "amd_rdna3_radv", "intel_arc_anv", "mobile_16k"} <= set(ps)
    assert ps["lavapipe"].max_storage_buffer_range == 128 << 20


@pytest.mark.parametrize(
    ("profile", "dv", "lanes"),
    [
        ("lavapipe", 64, 64),      # 64 * 66 * 4 = 16896 <= 32768
        ("lavapipe", 128, 32),     # 64 * 130 * 4 = 33280 > 32768
        ("nvidia_h200", 128, 64),  # 33280 <= 49152
        ("mobile_16k", 128, 16),
        ("mobile_16k", 512, 4),    # a 512-wide head still runs, with fewer lanes
        ("amd_rdna3_radv", 576, 16),
    ],
)
def test_lanes_are_the_widest_power_of_two_that_fits(profile, dv, lanes):
    p = recorded_profile(profile)
    assert choose_lanes(dv, p) == lanes
    assert lanes * (dv + 2) * 4 <= p.max_workgroup_memory
    assert lanes == 64 or 2 * lanes * (dv + 2) * 4 > p.max_workgroup_memory


def test_attention_lds_names_dv_and_device_bytes():
    tiny = LAVAPIPE.with_(max_workgroup_memory=256)
    with pytest.raises(AttentionLds) as e:
        attn_plan(tiny, dv=128)
    assert (e.value.dv, e.value.need_bytes, e.value.device_bytes) == (128, 520, 256)
    assert "dv=128" in str(e.value) and "256" in str(e.value)


def test_grid_folds_to_2d_past_the_x_limit():
    assert fold_grid(100, (1000, 10, 1)) == (100, 1)
    assert fold_grid(1001, (1000, 10, 1)) == (501, 2)
    gx, gy = fold_grid(9999, (1000, 10, 1))
    assert gx <= 1000 and gy <= 10 and gx * gy >= 9999
    with pytest.raises(GridLimit) as e:
        fold_grid(10001, (1000, 10, 1))
    assert e.value.groups == 10001
    small = LAVAPIPE.with_(max_grid=(7, 65535, 65535))
    with forced_schedule("streaming"):
        req = attn_plan(small, b=3, hq=8).kernels[-1].request
    assert isinstance(req, AttentionRequest)
    assert req.grid == (6, 4) and req.workgroups == 24
    tiny = LAVAPIPE.with_(max_grid=(2, 65535, 65535))
    req = attn_plan(tiny, b=3, hq=8).kernels[-1].request  # grouped: one per (b, kv head)
    assert isinstance(req, DecodeRequest) and req.workgroups == 6 and req.grid == (2, 3)


def test_request_is_the_plan_key():
    a, b = attn_plan(LAVAPIPE), attn_plan(LAVAPIPE)
    assert a.key == b.key and hash(a.key) == hash(b.key)
    assert attn_plan(LAVAPIPE, dv=72).key != a.key
    assert attn_plan(recorded_profile("mobile_16k")).key != a.key  # lanes differ


def test_decode_plan_binds_state_in_place_and_prints():
    p = plan_graph(compile_graph(trace_decode_step(2, 8, 2, 64, 16)), LAVAPIPE, group=False)
    labels = [k.label for k in p.kernels]
    # the mask's Iota is a folded constant, written once: not a per-step kernel; its
    # Compare and Select are one fused kernel
    assert labels == ["DynamicUpdateSlice", "DynamicUpdateSlice", "fused", "attention"]
    assert p.kernels[0].operands[-1].buffer == "state:k_cache"
    attn = p.kernels[-1]
    assert [o.buffer for o in attn.operands[1:3]] == ["state:k_cache", "state:v_cache"]
    text = str(p)
    assert isinstance(attn.request, DecodeRequest)  # the grouped schedule on lavapipe too
    assert attn.request.lanes_per_key == 8 and attn.request.splits == 1  # D=64 f32: 32 B/lane
    assert "lanes/key=8" in text and "arena peak" in text and "state:k_cache" in text
    for k in p.kernels:
        for o in k.operands:
            assert o.offset % LAVAPIPE.min_storage_offset_alignment == 0


def test_typed_refusals():
    b = Builder()
    x = b.input("x", (4,), F16)
    b.export("y", b.exp(x))
    plan_graph(b.build(), LAVAPIPE)  # 16-bit storage: read 16-bit, computed in F32
    no16 = LAVAPIPE.with_(extra={**LAVAPIPE.extra, "storage_buffer_16bit": False})
    with pytest.raises(DtypeLowering) as err:
        plan_graph(b.build(), no16)
    assert (err.value.prim, err.value.dtype, err.value.missing) == (
        "eqn 0 (Unary)", "f16", "storageBuffer16BitAccess")
    b = Builder()
    x = b.state("s", (4,))
    y = b.exp(x)
    b.set_state("s", y)
    b.export("z", b.add(x, y))  # reads the old state after its in-place update
    with pytest.raises(UnsupportedPrimitive, match="after its in-place update"):
        plan_graph(b.build(), LAVAPIPE)
    p = DeviceProfile("no-grid", max_grid=(1, 1, 1))
    with pytest.raises(GridLimit):
        attn_plan(p)


# The whole printed plan of one small decode step on the recorded lavapipe profile: what
# POOTVK_DEBUG=1 logs. Any change to planning (kernels, bindings, buffers, arena layout) or
# to the printing shows up here as a diff to review.
GOLDEN_PLAN = """\
plan for llvmpipe (LLVM 15.0.6, 256 bits): 4 kernel(s), arena peak 128 bytes for 128 bytes of intermediates (colouring saves 0 bytes, 0%)
  k0 [eqn 0] DynamicUpdateSlice -> f32[1,2,32,16] threads=32 wg=64 grid=1x1
       binds x1=in:k_new x4=in:pos y->state:k_cache
  k1 [eqn 1] DynamicUpdateSlice -> f32[1,2,32,16] threads=32 wg=64 grid=1x1
       binds x1=in:v_new x4=in:pos y->state:v_cache
  k2 [eqn 2] Fused[Select(Compare[Le](x0, x1), 0.0, -inf)] -> f32[1,1,1,32] threads=32 wg=64 grid=1x1
       binds x0=const:const0 x1=in:pos y->arena0
  k3 [eqn 3] attention_decode B=1 Hq=8 Hkv=2 Lq=1 Lk=32 Dk=16 Dv=16 kv=f32 scale=0.25 mask=additive[1,1,1] splits=1 rows/wg=4 lanes/key=2 wg=64 keys/iter=2 load=4 subgroup prefetch grid=2x1
       binds q=in:q k=state:k_cache v=state:v_cache mask=arena0 out->out:out
buffers:
  in:q                 input            512 B
  in:k_new             input            128 B
  in:v_new             input            128 B
  state:k_cache        state           4096 B
  state:v_cache        state           4096 B
  in:pos               input              4 B
  const:const0         const            128 B
  out:out              export           512 B
  arena0               arena            128 B
arena: 1 buffer(s), peak 128 bytes (unshared 128)
  v0     arena0+0                 128 B  live [2, 3]"""  # noqa: E501 (the attention kernel's line is 118 wide)


def test_print_plan_golden():
    plan = plan_graph(compile_graph(trace_decode_step(1, 8, 2, 16, 32)), LAVAPIPE, group=False)
    assert str(plan) == GOLDEN_PLAN
