"""The tensor-core decode kernel (``DecodeRequest.matrix``) on a device that lists the
16x16x16 f16 cooperative matrix (the H200; lavapipe has no VK_KHR_cooperative_matrix, so
these device cases skip there) against the float64 reference of test_attention_decode, and
its chooser rules on the recorded profiles (those run everywhere)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pootvk.errors import DtypeLowering, ShapeError
from pootvk.plan.decode_schedule import (
    MATRIX_MIN_STATE,
    DecodeProblem,
    check_request,
    choose_decode_schedule,
    matrix_supported,
)
from pootvk.plan.profile import recorded_profile, recorded_profiles
from pootvk.shaders.attention_decode import generate_decode
from pootvk.shaders.compiler import compile_glsl
from tests.helpers import examples, without_regfed
from tests.shaders.test_attention_decode import (
    PRIVATE_ARRAY,
    case,
    check,
    reference,
    run_decode,
    to_storage,
)

H200 = recorded_profile("nvidia_h200")


@pytest.fixture(scope="session")
def mdevice(device):
    p = DecodeProblem(b=1, hq=4, hkv=1, lq=1, lk=128, dk=64, dv=64, scale=0.1, kv_dtype="f16")
    if not matrix_supported(p, device.profile, device.profile.subgroup_shuffle):
        pytest.skip(f"{device.name} lists no 16x16x16 f16 cooperative matrix "
                    f"(VK_KHR_cooperative_matrix): the matrix kernel is not planned there")
    return device


def mcase(device, **kw):
    req, got = case(device, kv="f16", overrides={"matrix": 16, **kw.pop("ov", {})}, **kw)
    assert req.matrix == 16
    return req, got


@pytest.mark.parametrize("shape", [  # b, hq, hkv, lq, lk, dk, dv
    (1, 32, 8, 1, 4096, 128, 128),
    (2, 12, 4, 1, 128, 64, 64),
    (1, 16, 1, 1, 1008, 256, 256),
    (3, 4, 4, 3, 160, 80, 48),
    (1, 36, 1, 1, 64, 64, 128),  # 36 rows: three blocks of 12
    (2, 8, 2, 1, 16, 128, 64),
    (1, 8, 2, 1, 113, 64, 64),  # a capacity off 16 (the staged copy clamps its reads)
], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("splits", [1, 2, 7, 16])
def test_matrix_shapes_and_splits(mdevice, shape, splits):
    b, hq, hkv, lq, lk, dk, dv = shape
    mcase(mdevice, b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, splits=splits)


@pytest.mark.parametrize("shape,rows", [  # b, hq, hkv, lq, lk, dk, dv; rows per workgroup
    ((1, 64, 2, 1, 256, 128, 128), 32),
    ((2, 32, 1, 1, 200, 96, 64), 32),  # two row tiles, a live-free partial last tile
    ((1, 24, 1, 1, 128, 64, 64), 24),  # the second row tile half full
], ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x))
@pytest.mark.parametrize("variant", [{}, {"local_size": 256}, {"local_size": 256, "tile": 16},
                                     {"fused_combine": False}])
@pytest.mark.parametrize("splits", [1, 3])
def test_matrix_two_row_tiles(mdevice, shape, rows, variant, splits):
    """Up to 32 query rows a workgroup (two 16-row tiles sharing each staged K/V tile)."""
    b, hq, hkv, lq, lk, dk, dv = shape
    req, _ = mcase(mdevice, b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, splits=splits,
                   ov={"rows_per_wg": rows, **variant})
    assert req.rows_per_wg == rows


def test_matrix_two_row_tiles_split_key(mdevice):
    """The MLA layout (split key, wide value) with 32 rows a workgroup, small."""
    split_key_case(mdevice, (1, 64, 1, 160, 256, 64, 256), (1, 3), seed=5,
                   overrides={"rows_per_wg": 32})


@pytest.mark.parametrize("variant", [{}, {"prefetch": False}, {"q_split": False},
                                     {"local_size": 256}, {"local_size": 64},
                                     {"fused_combine": False}, {"tile": 16}, {"tile": 32},
                                     {"prefetch_steps": 2}, {"prefetch_steps": 3, "tile": 16},
                                     {"score_accumulators": 2},
                                     {"prefetch_steps": 4, "score_accumulators": 3},
                                     {"interleave": True}, {"interleave": True, "tile": 16,
                                                            "prefetch_steps": 3}])
def test_matrix_variants(mdevice, variant):
    mcase(mdevice, b=1, hq=16, hkv=2, lk=512, dk=128, dv=128, splits=3, ov=variant)


@pytest.mark.parametrize("lk", [1, 16, 48, 200, 1000])
@pytest.mark.parametrize("splits", [1, 2, 7])
def test_matrix_deep_prefetch_split_key(mdevice, lk, splits):
    """The MLA layout with words three steps ahead and two score accumulators: chunks of
    any length (fewer steps than register sets, a partial last unrolled step)."""
    split_key_case(mdevice, (1, 32, 1, lk, 128, 64, 256), (splits,), seed=lk,
                   overrides={"rows_per_wg": 32, "local_size": 256, "tile": 16,
                              "prefetch_steps": 3, "score_accumulators": 2})


@pytest.mark.parametrize("mask", ["shared", "alibi", "random"])
@pytest.mark.parametrize("softcap", [None, 8.0])
def test_matrix_masks_and_softcap(mdevice, mask, softcap):
    mcase(mdevice, b=2, hq=8, hkv=2, lq=1, lk=256, dk=64, dv=64, mask=mask, softcap=softcap,
          splits=2)


@pytest.mark.parametrize("splits", [1, 2, 7, 16])
@pytest.mark.parametrize("n", [0, 1, 2, 127, 128, 129, 512, 600])
def test_matrix_live_length_ignores_nan_past_it(mdevice, n, splits):
    """Keys at t >= len[b] hold NaN in K and V: nothing of them reaches the output; a length
    is clamped into [0, Lk] (0: the row sees no key, NaN as the reference)."""
    for inter in (False, True):
        req = nan_past_live_case(mdevice, n, splits, {"matrix": 16, "interleave": inter})
        assert req.matrix == 16 and req.interleave == (inter and splits > 1)


def nan_past_live_case(device, n, splits, overrides):
    """Two batch rows of live lengths n and max(1, n // 2) over a capacity of 512 f16 keys,
    NaN planted in K and V past each, through the kernel ``overrides`` name at ``splits``
    splits, against the float64 reference; returns the request."""
    b, hq, hkv, lk, d = 2, 8, 2, 512, 64
    rng = np.random.default_rng(n)
    q = rng.standard_normal((b, hq, 1, d), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, d), dtype=np.float32)
    lens = np.array([n, max(1, n // 2)], np.int32)
    ks, k64 = to_storage(k, "f16")
    vs, v64 = to_storage(v, "f16")
    for bi, nb in enumerate(lens):
        ks[bi, :, min(nb, lk):] = np.nan
        vs[bi, :, min(nb, lk):] = np.nan
    p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=1, lk=lk, dk=d, dv=d, scale=d ** -0.5,
                      kv_dtype="f16", live_len=True)
    req = choose_decode_schedule(p, device.profile, has_subgroup_shuffle=True,
                                 force_splits=splits, overrides=overrides)
    got = run_decode(device, req, q, ks, vs, None, lens)
    check(got, reference(q, k64, v64, None, d ** -0.5, None, lens))
    return req


def test_matrix_split_key(mdevice):
    """A split key (k [.., Dk - s] + k_shared [B, 1, Lk, s]) as the MLA decode shape, small."""
    split_key_case(mdevice, (1, 32, 1, 256, 128, 32, 128), (1, 4), seed=3)


def split_key_case(device, shape, splits_list, seed, overrides=None):
    """Random q, k (Dk - s wide), k_shared (s), v at ``shape`` = (b, hq, hkv, lk, Dk - s, s,
    Dv) through the matrix kernel at each split count, against the float64 reference of the
    materialised key."""
    b, hq, hkv, lk, dkn, s, dv = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hq, 1, dkn + s), dtype=np.float32)
    kn = rng.standard_normal((b, hkv, lk, dkn), dtype=np.float32)
    kp = rng.standard_normal((b, 1, lk, s), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32)
    scale = (dkn + s) ** -0.5
    p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=1, lk=lk, dk=dkn + s, dv=dv, scale=scale,
                      kv_dtype="f16", dk_shared=s)
    kns, kn64 = to_storage(kn, "f16")
    kps, kp64 = to_storage(kp, "f16")
    vs, v64 = to_storage(v, "f16")
    k64 = np.concatenate([kn64, np.broadcast_to(kp64, (b, hkv, lk, s))], -1)
    for splits in splits_list:
        req = choose_decode_schedule(p, device.profile, has_subgroup_shuffle=True,
                                     force_splits=splits,
                                     overrides={"matrix": 16, **(overrides or {})})
        got = _run_split_key(device, req, q, kns, kps, vs)
        check(got, reference(q, k64, v64, None, scale, None))


def _run_split_key(device, req, q, kn, kp, v):
    """run_decode with k_shared bound (its binding sits between k and v)."""
    from pootvk.vk import BufferRange, Dispatch, Recorder

    made = []

    def buf(data):
        x = device.create_buffer(max(4, data.nbytes), name="t")
        made.append(x)
        x.write(0, np.ascontiguousarray(data))
        return BufferRange(x, 0, x.size)

    try:
        out_shape = (req.b, req.hq, req.lq, req.dv)
        r = {"q": buf(q), "k": buf(kn), "k_shared": buf(kp), "v": buf(v),
             "out": buf(np.zeros(out_shape, np.float32))}
        if req.splits > 1:
            r["partial"] = buf(np.zeros(req.partial_floats, np.float32))
            r["counter"] = buf(np.zeros(req.counters, np.uint32))
        src = generate_decode(req)
        pipe = device.compute_pipeline(compile_glsl(src[0]), len(req.bindings()), 1)
        d = Dispatch(pipe, tuple(r[x.name] for x in req.bindings()), (*req.grid, 1), "mla",
                     push=req.push_constants())
        ds = [d]
        if req.launches == 2:
            cp = device.compute_pipeline(compile_glsl(src[1]), 2, 0)
            ds.append(Dispatch(cp, (r["partial"], r["out"]), (*req.combine_grid, 1), "comb"))
        rec = Recorder(device).record(ds)
        try:
            rec.submit(wait=True)
            return r["out"].buffer.read_array(0, out_shape, np.float32)
        finally:
            rec.destroy()
    finally:
        for x in made:
            x.destroy()


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 3), n_rep=st.sampled_from([1, 4, 8, 12]), hkv=st.integers(1, 2),
    lq=st.sampled_from([1, 3]), lk=st.sampled_from([16, 128, 1008, 4096]),
    dk=st.sampled_from([64, 128, 256]), dv=st.sampled_from([64, 128, 256]),
    mask=st.sampled_from([None, "shared", "alibi"]), softcap=st.sampled_from([None, 8.0]),
    splits=st.sampled_from([1, 2, 7, 16]), seed=st.integers(0, 2**16),
)
def test_matrix_sweep(mdevice, b, n_rep, hkv, lq, lk, dk, dv, mask, softcap, splits, seed):
    mcase(mdevice, b=b, hq=hkv * n_rep, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, mask=mask,
          softcap=softcap, splits=splits, seed=seed)


# --- pure checks: the chooser and the sources -------------------------------------------


def test_matrix_is_planned_only_where_the_device_lists_it():
    p = DecodeProblem(b=1, hq=64, hkv=1, lq=1, lk=32768, dk=128, dv=128, scale=0.1,
                      kv_dtype="f16")  # 64 rows x 256: past MATRIX_MIN_STATE
    assert choose_decode_schedule(p, H200, has_subgroup_shuffle=True).matrix == 16
    for name, prof in recorded_profiles().items():
        listed = "16x16x16 f16 f16 f32 f32" in (prof.extra.get("coopmat") or ())
        try:
            r = choose_decode_schedule(p, prof, has_subgroup_shuffle=prof.subgroup_shuffle)
        except DtypeLowering:  # no 16-bit storage: refused before any kernel is chosen
            assert not listed and not prof.extra.get("storage_buffer_16bit"), name
            continue
        assert (r.matrix == 16) == (listed and prof.subgroup_size == 32
                                    and prof.subgroup_shuffle), name
    # f32 / bf16 K/V, paged keys, widths or capacities off 16 keep the scalar kernel
    from dataclasses import replace
    for q in (replace(p, kv_dtype="f32"), replace(p, kv_dtype="bf16"),
              replace(p, dk=72, dv=72), replace(p, pool_slots=4096)):
        assert choose_decode_schedule(q, H200, has_subgroup_shuffle=True).matrix == 0, q
        with pytest.raises(ShapeError):
            choose_decode_schedule(q, H200, has_subgroup_shuffle=True,
                                   overrides={"matrix": 16})
    assert choose_decode_schedule(p, H200, has_subgroup_shuffle=True,
                                  overrides={"matrix": 0}).matrix == 0
    # any capacity: the copy into workgroup memory clamps its rows
    assert choose_decode_schedule(replace(p, lk=1000), H200, has_subgroup_shuffle=True).matrix


def test_matrix_rules_on_the_h200_profile():
    """Rows per workgroup (the group up to 16), q split and prefetch where they fit, the
    MLA shape within the 48 KiB of workgroup memory."""
    gqa = DecodeProblem(b=1, hq=32, hkv=8, lq=1, lk=32768, dk=128, dv=128, scale=0.1,
                        kv_dtype="f16")
    # D=128 GQA (4 rows x 256 floats) takes the register-fed matrix kernel at this length
    # (2048 keys a workgroup, test_attention_decode_regfed) and, without it, the scalar
    # kernel: the staged one measured slower there
    got = choose_decode_schedule(gqa, H200, has_subgroup_shuffle=True)
    assert (got.matrix, got.matrix_feed) == (16, "registers")
    assert choose_decode_schedule(gqa, without_regfed(H200),
                                  has_subgroup_shuffle=True).matrix == 0
    assert 4 * 256 <= MATRIX_MIN_STATE
    r = choose_decode_schedule(gqa, H200, has_subgroup_shuffle=True, overrides={"matrix": 16})
    assert (r.rows_per_wg, r.local_size, r.tile, r.q_split, r.prefetch) == (4, 128, 64, True,
                                                                            True)
    assert r.splits > 1 and r.fused_combine
    mla = DecodeProblem(b=1, hq=128, hkv=1, lq=1, lk=32768, dk=576, dv=512, scale=0.1,
                        kv_dtype="f16", dk_shared=64)
    m = choose_decode_schedule(mla, H200, has_subgroup_shuffle=True)
    assert m.matrix == 16 and m.rows_per_wg == 32 and m.row_blocks == 4
    assert m.local_size == 256 and m.tile == 16
    # one workgroup per SM (H200: 33 splits 217 us, 64 238.7, 16 410.5), two launches
    assert m.splits == 33 and m.workgroups == H200.compute_units and m.launches == 2
    assert m.prefetch and not m.q_split  # 9 words a lane in flight; lo part needs 32 rows
    assert m.shared_bytes <= H200.max_workgroup_memory
    # one register set of words in flight, one score accumulator (deeper prefetch and split
    # accumulators measured slower or even on the H200: bench/mla_phases.py)
    assert (m.prefetch_steps, m.score_accumulators) == (1, 1)


def test_matrix_prefetch_steps_and_score_accumulators_are_checked():
    """The matrix kernel's knobs refuse values its generator cannot serve, with the
    request's description; the scalar kernel refuses them outright."""
    mla = DecodeProblem(b=1, hq=128, hkv=1, lq=1, lk=4096, dk=576, dv=512, scale=0.1,
                        kv_dtype="f16", dk_shared=64)
    for ov in ({"prefetch_steps": 5}, {"prefetch_steps": 0}, {"score_accumulators": 0},
               {"score_accumulators": 5}, {"prefetch": False, "prefetch_steps": 2}):
        r = choose_decode_schedule(mla, H200, has_subgroup_shuffle=True,
                                   overrides={"matrix": 16})
        bad = replace(r, **ov)
        with pytest.raises(ShapeError, match="prefetch_steps|score_accumulators"):
            check_request(bad)
    gqa = DecodeProblem(b=1, hq=32, hkv=8, lq=1, lk=4096, dk=128, dv=128, scale=0.1,
                        kv_dtype="f16")
    s = choose_decode_schedule(gqa, without_regfed(H200), has_subgroup_shuffle=True)
    assert s.matrix == 0
    for ov in ({"prefetch_steps": 2}, {"score_accumulators": 2}):
        with pytest.raises(ShapeError, match="matrix kernel's"):
            check_request(replace(s, **ov))
    # a planned request with both knobs generates and compiles
    r = choose_decode_schedule(mla, H200, has_subgroup_shuffle=True,
                               overrides={"prefetch_steps": 3, "score_accumulators": 2})
    assert (r.prefetch_steps, r.score_accumulators) == (3, 2)
    assert "prefetch_steps=3" in r.describe() and "score_acc=2" in r.describe()
    for src in generate_decode(r):
        assert not PRIVATE_ARRAY.search(src)
        compile_glsl(src)


def test_matrix_sources_compile_without_private_arrays():
    for shape in [(1, 32, 8, 1, 4096, 128, 128), (2, 12, 4, 3, 160, 80, 48),
                  (1, 128, 1, 1, 1024, 576, 512)]:
        b, hq, hkv, lq, lk, dk, dv = shape
        for live, mask, cap in ((False, None, None), (True, (1, hq, 1), 5.0)):
            p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, scale=0.1,
                              kv_dtype="f16", live_len=live, mask=mask, softcap=cap,
                              dk_shared=64 if dk == 576 else 0)
            for splits in (1, 3):
                r = choose_decode_schedule(p, H200, has_subgroup_shuffle=True,
                                           force_splits=splits, overrides={"matrix": 16})
                for src in generate_decode(r):
                    assert not PRIVATE_ARRAY.search(src), src
                    compile_glsl(src)
