"""The register-fed tensor-core decode kernel (``matrix_feed`` = "registers") on a device
whose cooperative-matrix element layout it is written for (the H200; lavapipe lists no
VK_KHR_cooperative_matrix, so these device cases skip there), against the float64 reference
of test_attention_decode; its layout check, sources and planner rules run everywhere."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pootvk.errors import ShapeError
from pootvk.plan.decode_schedule import (
    REGFED_LAYOUT,
    REGFED_MIN_CHUNK,
    DecodeProblem,
    check_request,
    choose_decode_schedule,
    regfed_fold_slots,
    regfed_fold_stride,
    regfed_supported,
)
from pootvk.plan.profile import recorded_profile
from pootvk.shaders.attention_decode import generate_decode
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk.coopmat_layout import NV_MMA, OTHER, classify, nv_mma_elements
from tests.helpers import examples
from tests.shaders.test_attention_decode import (
    PRIVATE_ARRAY,
    case,
)
from tests.shaders.test_attention_decode_matrix import nan_past_live_case

H200 = recorded_profile("nvidia_h200")
REG = {"matrix_feed": "registers"}


def _problem(b=1, hq=32, hkv=8, lq=1, lk=4096, dk=128, dv=128, kv="f16", **kw):
    return DecodeProblem(b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, scale=0.1,
                         kv_dtype=kv, **kw)


@pytest.fixture(scope="session")
def rdevice(device):
    if not regfed_supported(_problem(), device.profile, device.profile.subgroup_shuffle):
        pytest.skip(f"{device.name}: no 16x16x16 f16 cooperative matrix in the "
                    f"{REGFED_LAYOUT} layout (coopmat_layout="
                    f"{device.profile.extra.get('coopmat_layout')!r})")
    return device


def rcase(device, **kw):
    req, got = case(device, kv="f16", overrides={**REG, **kw.pop("ov", {})}, **kw)
    assert req.matrix == 16 and req.matrix_feed == "registers"
    return req, got


# --- the layout check ---------------------------------------------------------------------


def test_layout_classifier():
    elems = np.stack([nv_mma_elements(u) for u in "ABC"]).astype(np.float32)
    pad = np.concatenate([elems, np.full((3, 32, 24), -1.0, np.float32)], -1)
    assert classify((8, 8, 8), pad) == NV_MMA
    swapped = pad.copy()
    swapped[1, 5, [0, 1]] = swapped[1, 5, [1, 0]]  # two of B's elements in one lane
    assert classify((8, 8, 8), swapped) == OTHER
    assert classify((8, 8, 8), pad[[0, 0, 2]]) == OTHER  # B laid out as A
    assert classify((16, 8, 8), pad) == OTHER


def test_layout_recorded_on_a_coopmat_device(device):
    """A device that lists the matrix shape reads its layout back at open; the H200's is
    the one the recorded profile names."""
    if not device.profile.extra.get("coopmat"):
        pytest.skip(f"{device.name} lists no cooperative matrix")
    got = device.profile.extra.get("coopmat_layout")
    assert got in (NV_MMA, OTHER)
    if "H200" in device.name:
        assert got == H200.extra["coopmat_layout"] == NV_MMA


# --- on the device ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [  # b, hq, hkv, lq, lk, dk, dv
    (1, 32, 8, 1, 4096, 128, 128),
    (2, 12, 4, 1, 128, 64, 64),
    (1, 16, 1, 1, 1008, 128, 128),  # 16 rows: both halves of the matrix rows
    (1, 36, 1, 1, 64, 64, 128),  # 36 rows: three blocks of 12
    (3, 4, 4, 3, 160, 64, 64),  # 3 query rows a KV head
    (2, 8, 2, 1, 16, 128, 64),
    (1, 8, 2, 1, 113, 64, 64),  # a capacity off 16 (reads clamp to the last key)
    (1, 8, 1, 1, 1, 128, 128),
], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("splits", [1, 2, 7, 16])
def test_regfed_shapes_and_splits(rdevice, shape, splits):
    b, hq, hkv, lq, lk, dk, dv = shape
    rcase(rdevice, b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, splits=splits)


@pytest.mark.parametrize("variant", [{}, {"prefetch": False}, {"q_split": False},
                                     {"local_size": 32}, {"local_size": 64},
                                     {"local_size": 256}, {"fused_combine": False},
                                     {"rows_per_wg": 2}, {"interleave": True},
                                     {"interleave": True, "fused_combine": False}])
def test_regfed_variants(rdevice, variant):
    rcase(rdevice, b=1, hq=16, hkv=2, lk=700, dk=128, dv=128, splits=3, ov=variant)


@pytest.mark.parametrize("mask", ["shared", "alibi", "random"])
@pytest.mark.parametrize("softcap", [None, 8.0])
@pytest.mark.parametrize("lq", [1, 3])
def test_regfed_masks_and_softcap(rdevice, mask, softcap, lq):
    rcase(rdevice, b=2, hq=8, hkv=2, lq=lq, lk=256, dk=64, dv=64, mask=mask, softcap=softcap,
          splits=2 if lq == 1 else 1)


@pytest.mark.parametrize("splits", [1, 2, 7, 16])
@pytest.mark.parametrize("n", [0, 1, 2, 15, 16, 17, 127, 128, 129, 512, 600])
def test_regfed_live_length_ignores_nan_past_it(rdevice, n, splits):
    """Keys at t >= len[b] hold NaN in K and V: nothing of them reaches the output (their
    scores are -inf, and reads past the chunk clamp to its last key, so no NaN V row meets
    a zero weight in the product); a length is clamped into [0, Lk] (0: the row sees no
    key, NaN as the reference)."""
    for inter in (False, True):
        req = nan_past_live_case(rdevice, n, splits, {**REG, "interleave": inter})
        assert req.matrix_feed == "registers" and req.interleave == (inter and splits > 1)


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 3), n_rep=st.sampled_from([2, 4, 8, 12]), hkv=st.integers(1, 2),
    lq=st.sampled_from([1, 3]), lk=st.sampled_from([1, 113, 128, 129, 1000, 4096]),
    dk=st.sampled_from([64, 128]), dv=st.sampled_from([64, 128]),
    mask=st.sampled_from([None, "shared", "alibi"]), softcap=st.sampled_from([None, 8.0]),
    splits=st.sampled_from([1, 2, 7, 16]), interleave=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_regfed_sweep(rdevice, b, n_rep, hkv, lq, lk, dk, dv, mask, softcap, splits,
                      interleave, seed):
    """Issue 7's sweep over what the kernel serves (f16, Dk/Dv its multiples of 32/64),
    each split's tiles consecutive or in turn."""
    rcase(rdevice, b=b, hq=hkv * n_rep, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, mask=mask,
          softcap=softcap, splits=splits, seed=seed, ov={"interleave": interleave})


# --- sources and planner rules (everywhere) ------------------------------------------------


def test_sources_compile_without_private_arrays():
    srcs = set()
    for shape, ov in [((1, 32, 8, 1, 4096, 128, 128), {}),
                      ((1, 16, 1, 1, 1008, 128, 128), {"prefetch": False}),
                      ((3, 4, 4, 3, 160, 64, 64), {"q_split": False}),
                      ((2, 8, 2, 1, 16, 128, 64), {"local_size": 32}),
                      ((1, 8, 1, 1, 65536, 128, 128), {"fused_combine": False})]:
        b, hq, hkv, lq, lk, dk, dv = shape
        p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, scale=0.1,
                          softcap=5.0, mask=(1, hq, 1), kv_dtype="f16", live_len=True)
        r = choose_decode_schedule(p, H200, has_subgroup_shuffle=True, force_splits=3,
                                   overrides={**REG, **ov})
        srcs.update(generate_decode(r))
    for src in sorted(srcs):
        assert not PRIVATE_ARRAY.findall(src)
        assert len(compile_glsl(src)) > 100


@pytest.mark.parametrize("rows,dv", [(4, 128), (8, 128), (16, 128), (4, 64), (8, 64)])
def test_fold_stores_hit_distinct_banks(rows, dv):
    """Each store of the fold into workgroup memory, as generated, puts its active lanes
    (rows x 4 lanes of a subgroup) on distinct 4-byte banks of 32: the generated index
    expressions are evaluated for every lane (unpadded rows of 128 floats put 16 lanes on
    one bank: 2.2 us of a (1,32,8,32768) launch on the H200)."""
    import re

    p = _problem(hq=rows, hkv=1, lk=65536, dv=dv)
    r = choose_decode_schedule(p, H200, has_subgroup_shuffle=True, force_splits=16,
                               overrides={**REG, "local_size": 256})
    src = generate_decode(r)[0]
    start = src.index("uint ob = ")  # the fold's first store block
    ob, stores = None, 0
    for line in src[start:].splitlines():
        s = re.sub(r"(\d+)u\b", r"\1", line.strip())
        if s.startswith("uint ob = "):
            ob = s[len("uint ob = "):-1]
        elif s.startswith("sO[ob + ") and "] = o" in s:
            index = s[len("sO["):s.index("] = o")]
            banks = set()
            for lr in range(8):
                for lc in range(4):
                    base = eval(ob, {"sg": 0, "lr": lr, "lc": lc})  # noqa: S307
                    if base // regfed_fold_stride(dv) >= rows:
                        continue  # a lane of a row past the block's rows: no store
                    banks.add(eval(index, {"ob": base, "lc": lc}) % 32)  # noqa: S307
            assert len(banks) == min(rows, 8) * 4, (line, sorted(banks))
            stores += 1
        elif s == "barrier();":
            break
    assert stores == (dv // 16) * 4 * (2 if rows > 8 else 1)


@pytest.mark.parametrize("rows,lanes,dv,splits", [
    (4, 256, 128, 16),  # the one-round fold (every subgroup a padded slot), fused combine
    (16, 256, 128, 16),  # 16 rows: the tree fold through half the slots
    (4, 128, 64, 1),  # Dv 64: one pad word a row
    (12, 256, 128, 7),
])
def test_planned_workgroup_memory_covers_the_padded_fold(rows, lanes, dv, splits):
    """``DecodeRequest.shared_bytes`` (what the planner fits) covers what the kernel
    declares, the fold's padded slot rows (``regfed_fold_stride``) included."""
    from tests.shaders.test_shared_memory import workgroup_bytes

    p = _problem(hq=rows, hkv=1, lk=65536, dv=dv)
    r = choose_decode_schedule(p, H200, has_subgroup_shuffle=True, force_splits=splits,
                               overrides={**REG, "local_size": lanes})
    assert (r.rows_per_wg, r.local_size) == (rows, lanes)
    used = workgroup_bytes(compile_glsl(generate_decode(r)[0]))
    assert used <= r.shared_bytes <= H200.max_workgroup_memory, (r.describe(), used)
    slots = regfed_fold_slots(lanes // 32, rows, dv)
    assert f"shared float sO[{slots * rows * regfed_fold_stride(dv)}];" in \
        generate_decode(r)[0]


@pytest.mark.parametrize("shape,lanes,splits,rows,planned", [
    # B, Hq, Hkv, Lk: one 256-lane workgroup a compute unit where splits fill them; the
    # planner takes it where a workgroup streams >= REGFED_MIN_CHUNK keys
    ((1, 32, 8, 131072), 256, 16, 4, True),  # 8192 keys a workgroup
    ((8, 32, 8, 8192), 256, 2, 4, True),  # 4096
    ((1, 32, 8, 32768), 256, 16, 4, True),  # 2048
    ((1, 32, 8, 16384), 256, 16, 4, False),  # 1024: the scalar kernel measured faster
    ((1, 32, 8, 4096), 256, 16, 4, False),
    ((32, 32, 8, 2048), 128, 1, 4, True),  # 256 row blocks fill 132 SMs: unsplit, 128 lanes
    ((1, 8, 1, 65536), 256, 64, 8, False),  # one KV head: the few-heads split count
])
def test_h200_regfed_schedules(shape, lanes, splits, rows, planned):
    b, hq, hkv, lk = shape
    p = _problem(b=b, hq=hq, hkv=hkv, lk=lk)
    assert REGFED_MIN_CHUNK == 2048
    r = choose_decode_schedule(p, H200, has_subgroup_shuffle=True, overrides=REG)
    assert (r.matrix, r.matrix_feed, r.local_size, r.splits, r.rows_per_wg) == \
        (16, "registers", lanes, splits, rows)
    assert r.q_split and r.prefetch and r.keys_per_iter == 16
    assert r.fused_combine == (splits <= 16)
    assert r.shared_bytes <= H200.max_workgroup_memory
    assert (r.chunk >= REGFED_MIN_CHUNK) == planned
    got = choose_decode_schedule(p, H200, has_subgroup_shuffle=True)
    assert got == r if planned else got.matrix == 0


@pytest.mark.parametrize("kw,why", [
    ({"kv": "f32"}, "f32 K/V: the scalar kernel"),
    ({"kv": "bf16"}, "bf16: no bf16 matrix listed"),
    ({"hq": 8, "hkv": 8}, "one row a KV head"),
    ({"lk": 4096}, "short chunks"),
    ({"dk": 72, "dv": 72}, "Dk not a multiple of 32"),
    ({"dv": 96}, "Dv not a multiple of 64"),
    ({"dk": 256, "dv": 256}, "wider than REGFED_MAX_WIDTH"),
])
def test_h200_keeps_other_kernels(kw, why):
    r = choose_decode_schedule(_problem(**{"lk": 131072, **kw}), H200,
                               has_subgroup_shuffle=True)
    assert r.matrix_feed == "staged", why


def test_layout_gates_the_kernel():
    """Without the layout read back (a recorded profile of another driver, or a probe that
    failed) the planner keeps the scalar kernel and refuses the override."""
    assert choose_decode_schedule(_problem(lk=131072), H200,
                                  has_subgroup_shuffle=True).matrix_feed == "registers"
    other = replace(H200, extra={**H200.extra, "coopmat_layout": OTHER})
    unprobed = replace(H200, extra={k: v for k, v in H200.extra.items()
                                    if k != "coopmat_layout"})
    for prof in (other, unprobed):
        r = choose_decode_schedule(_problem(lk=131072), prof, has_subgroup_shuffle=True)
        assert r.matrix == 0
        with pytest.raises(ShapeError, match="register-fed"):
            choose_decode_schedule(_problem(), prof, has_subgroup_shuffle=True, overrides=REG)


def test_refusals():
    r = choose_decode_schedule(_problem(), H200, has_subgroup_shuffle=True, overrides=REG)
    for bad in ({"rows_per_wg": 32, "hq": 64}, {"keys_per_iter": 32}, {"local_size": 96},
                {"matrix_feed": "elsewhere"}):
        hq = bad.pop("hq", None)
        rr = replace(r, **bad) if hq is None else replace(r, hq=hq, **bad)
        with pytest.raises(ShapeError):
            check_request(rr)
    with pytest.raises(TypeError):
        choose_decode_schedule(_problem(), H200, has_subgroup_shuffle=True,
                               overrides={**REG, "tile": 32})
    with pytest.raises(ShapeError, match="matrix is 0"):
        choose_decode_schedule(_problem(), H200, has_subgroup_shuffle=True,
                               overrides={**REG, "matrix": 0})
    # a staged kernel's knob without a kernel named keeps the planner off this one
    long = _problem(lk=131072)
    assert choose_decode_schedule(long, H200, has_subgroup_shuffle=True,
                                  overrides={"local_size": 256}).matrix_feed == "registers"
    r = choose_decode_schedule(long, H200, has_subgroup_shuffle=True,
                               overrides={"matrix": 16, "tile": 32})
    assert r.matrix_feed == "staged" and r.tile == 32
