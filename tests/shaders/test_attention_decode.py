"""The grouped split-KV decode kernels on the live device (lavapipe in CI) against a float64
numpy reference: shapes, GQA ratios, masks (broadcast, per head, -inf, fully masked rows and
splits), softcap, f32/f16/bf16 K/V, forced split counts (partial and empty chunks), the
subgroup and shared-memory reductions, and a live length read from a buffer."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pootvk.errors import DtypeLowering, ShapeError
from pootvk.plan.decode_schedule import (
    INTERLEAVE_MIN_CHUNK,
    MIN_CHUNK,
    DecodeProblem,
    check_request,
    choose_decode_schedule,
    chunk_for,
    default_splits,
    lazy_planned,
)
from pootvk.plan.profile import recorded_profile, recorded_profiles
from pootvk.shaders.attention_decode import combine_in_one_round, generate_decode
from pootvk.shaders.compiler import compile_glsl
from tests.helpers import examples, without_regfed

TOL = 5e-4

# A declaration of a non-shared array: `float acc[4];`, `const vec4 t[2] = ...`
PRIVATE_ARRAY = re.compile(
    r"^\s*(?:const\s+)?(?:float|int|uint|bool|[iu]?vec[234]|mat[234]|float16_t|f16vec[234])"
    r"\s+\w+\s*\[", re.M
)


# --- host side: storage dtypes, the reference, one run --------------------------------------


def to_storage(x: np.ndarray, kv_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(bytes to upload, the values the device sees as float64)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if kv_dtype == "f32":
        return x, x.astype(np.float64)
    if kv_dtype == "f16":
        h = x.astype(np.float16)
        return h, h.astype(np.float64)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # nearest even
    back = (rounded.astype(np.uint32) << 16).view(np.float32)
    return rounded, back.astype(np.float64)


def reference(q, k64, v64, mask, scale, softcap, live=None):
    """float64 attention; -inf adds zero weight; a row that sees no key is 0/0 = NaN."""
    n_rep = q.shape[1] // k64.shape[1]
    k = np.repeat(k64, n_rep, axis=1)
    v = np.repeat(v64, n_rep, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        s = s + mask.astype(np.float64)
    if live is not None:  # one length per batch row (an int: the same for every row)
        for b, n in enumerate(np.broadcast_to(live, (s.shape[0],))):
            s[b, ..., min(max(int(n), 0), s.shape[-1]):] = -np.inf
    with np.errstate(invalid="ignore"):
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        p = e / e.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, v)


def run_decode(device, req, q, k_store, v_store, mask=None, live=None, replays=2):
    """Run the request's launches once; returns the f32 output."""
    from pootvk.vk import BufferRange, Dispatch, Recorder

    made = []

    def buf(nbytes, name, data=None):
        b = device.create_buffer(nbytes, name=name)
        made.append(b)
        if data is not None:
            b.write(0, np.ascontiguousarray(data))
        return BufferRange(b, 0, b.size)

    try:
        out_shape = (req.b, req.hq, req.lq, req.dv)
        out = buf(int(np.prod(out_shape)) * 4, "out")
        out.buffer.write(0, np.full(out_shape, 12345.0, np.float32))  # poison
        ranges = {"q": buf(q.nbytes, "q", q), "k": buf(k_store.nbytes, "k", k_store),
                  "v": buf(v_store.nbytes, "v", v_store), "out": out}
        if mask is not None:
            ranges["mask"] = buf(mask.nbytes, "mask", mask)
        if req.live_len:
            lens = np.broadcast_to(np.asarray(live, np.int32), (req.b,)).copy()
            ranges["len"] = buf(lens.nbytes, "len", lens)
        if req.splits > 1:
            part = buf(req.partial_floats * 4, "partial")
            part.buffer.write(0, np.full(req.partial_floats, 777.0, np.float32))
            ranges["partial"] = part
            ranges["counter"] = buf(req.counters * 4, "counter",
                                    np.zeros(req.counters, np.uint32))
        srcs = generate_decode(req)
        launches = [(srcs[0], req.bindings(), req.grid, req.push_constants())]
        if req.launches == 2:
            launches.append((srcs[1], req.combine_bindings(), req.combine_grid, ()))
        dispatches = []
        for src, binds, grid, push in launches:
            pipe = device.compute_pipeline(compile_glsl(src), len(binds), len(push))
            dispatches.append(Dispatch(pipe, tuple(ranges[b.name] for b in binds),
                                       (grid[0], grid[1], 1), "decode", push=push))
        rec = Recorder(device).record(dispatches)
        try:
            rec.submit(wait=True)
            got = out.buffer.read_array(0, out_shape, np.float32)
            if replays > 1:  # a replay must give the same answer (the counters reset)
                out.buffer.write(0, np.full(out_shape, 12345.0, np.float32))
                for _ in range(replays - 1):
                    rec.submit(wait=True)
                again = out.buffer.read_array(0, out_shape, np.float32)
                np.testing.assert_array_equal(again, got)
        finally:
            rec.destroy()
        return got
    finally:
        for b in made:
            b.destroy()


def make_mask(kind, rng, b, hq, lq, lk):
    if kind is None:
        return None
    if kind == "shared":  # causal-style, one for every head, broadcast over B
        m = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq, 0.0, -np.inf)
        return np.broadcast_to(m, (1, 1, lq, lk)).astype(np.float32).copy()
    if kind == "alibi":  # per-head linear bias, broadcast over B and Lq
        slopes = 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)
        m = slopes[:, None, None] * (np.arange(lk) - lk + 1)[None, None, :]
        return np.broadcast_to(m[None], (1, hq, 1, lk)).astype(np.float32).copy()
    if kind == "random":  # per (batch, head, row), with -inf holes
        m = rng.standard_normal((b, hq, lq, lk)).astype(np.float32)
        m[rng.random(m.shape) < 0.3] = -np.inf
        return m
    raise ValueError(kind)


def check(got, ref):
    assert got.dtype == np.float32 and got.shape == ref.shape
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    d = got[~nan].astype(np.float64) - ref[~nan]
    den = max(float((ref[~nan] ** 2).sum()), 1e-30)
    e = float((d**2).sum() / den)
    assert e <= TOL, f"normalised squared error {e:.2e} (max abs {np.abs(d).max():.2e})"
    return e


def case(device, *, b=1, hq=4, hkv=1, lq=1, lk=113, dk=64, dv=64, kv="f32", mask=None,
         softcap=None, splits=None, subgroup=True, live=None, seed=0, overrides=None,
         mask_array=None):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hq, lq, dk), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, dk), dtype=np.float32)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32)
    m = mask_array if mask_array is not None else make_mask(mask, rng, b, hq, lq, lk)
    scale = 1.0 / np.sqrt(dk)
    p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, scale=scale,
                      softcap=softcap, mask=None if m is None else m.shape[:3], kv_dtype=kv,
                      live_len=live is not None)
    req = choose_decode_schedule(p, device.profile, has_subgroup_shuffle=subgroup,
                                 force_splits=splits, overrides=overrides)
    ks, k64 = to_storage(k, kv)
    vs, v64 = to_storage(v, kv)
    got = run_decode(device, req, q, ks, vs, m, live)
    ref = reference(q, k64, v64, m, scale, softcap, live)
    check(got, ref)
    return req, got


# --- parametrized cases ---------------------------------------------------------------------

SHAPES = [  # b, hq, hkv, lq, lk, dk, dv
    (1, 32, 8, 1, 1000, 128, 128),
    (2, 12, 1, 1, 129, 64, 64),
    (3, 4, 4, 3, 113, 72, 40),
    (1, 8, 1, 3, 128, 40, 72),
    (2, 8, 2, 1, 1, 128, 64),
]


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shapes(device, shape, subgroup):
    b, hq, hkv, lq, lk, dk, dv = shape
    case(device, b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, subgroup=subgroup,
         splits=2 if lk > 1 else 1)


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("splits", [1, 2, 7, 16])
@pytest.mark.parametrize("kv", ["f32", "f16", "bf16"])
def test_forced_splits_and_dtypes(device, splits, kv, interleave):
    # Lk=113 with 16 splits: chunks of one tile, most of them empty, the last one partial;
    # interleaved, the splits take the tiles in turn (one split's tiles 7 apart at 1000)
    req, _ = case(device, b=2, hq=8, hkv=2, lk=113 if splits != 7 else 1000, dk=64, dv=128,
                  kv=kv, splits=splits, mask="alibi", seed=splits,
                  overrides={"interleave": interleave})
    assert req.splits == splits and req.interleave == (interleave and splits > 1)


@pytest.mark.parametrize("kv", ["f16", "bf16"])
def test_16bit_with_8_byte_loads(device, kv):
    """Widths that are multiples of 4 but not 8 read uvec2 (4 halves)."""
    req, _ = case(device, hq=4, hkv=2, lk=129, dk=44, dv=36, kv=kv, splits=2)
    assert req.load_elems == 4


def test_scalar_widths(device):
    """f32 widths that are not multiples of 4: float loads, one float per lane step."""
    req, _ = case(device, hq=6, hkv=3, lk=300, dk=6, dv=10, splits=2, mask="alibi")
    assert req.load_elems == 1 and req.vec == 1


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
def test_softcap_and_random_masks(device, subgroup):
    case(device, b=2, hq=8, hkv=2, lq=3, lk=129, dk=64, dv=64, mask="random", softcap=8.0,
         splits=7, subgroup=subgroup)


@pytest.mark.parametrize("splits", [1, 16])
def test_minus_inf_rows_and_masked_splits(device, splits):
    """Row 0 sees 5 keys, row 1 nothing (NaN), row 2 only the last chunk: with splits the
    leading splits are entirely masked and write the neutral partial."""
    b, hq, lq, lk = 1, 4, 3, 1000
    m = np.zeros((b, hq, lq, lk), np.float32)
    m[:, :, 0, 5:] = -np.inf
    m[:, :, 1, :] = -np.inf
    m[:, :, 2, :900] = -np.inf
    m[0, 1, 2, ::2] = -np.inf
    _, got = case(device, b=b, hq=hq, hkv=2, lq=lq, lk=lk, dk=64, dv=64, splits=splits,
                  mask_array=m)
    assert np.isnan(got[:, :, 1]).all()
    assert np.isfinite(got[:, :, 0]).all() and np.isfinite(got[:, :, 2]).all()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-launches"])
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "no-prefetch"])
def test_combine_and_prefetch_variants(device, fused, prefetch):
    req, _ = case(device, b=2, hq=8, hkv=2, lk=1000, dk=64, dv=64, splits=7, mask="alibi",
                  overrides={"fused_combine": fused, "prefetch": prefetch})
    assert req.launches == (1 if fused else 2) and req.prefetch == prefetch


@pytest.mark.parametrize("rounds", [1, 2])
@pytest.mark.parametrize("splits", [2, 7, 16])
def test_fused_combine_in_one_or_two_rounds_of_loads(device, rounds, splits):
    """Both forms of the fused combine: masked rows (5 keys, none: NaN, the last chunk
    only: leading splits write the neutral partial), then live lengths that leave splits
    without a key (nact < splits: the one-round form clamps their words to an active
    split's and weighs them 0) and one that fits one split (written by the partial)."""
    b, hq, lq, lk = 1, 4, 3, 1000
    m = np.zeros((b, hq, lq, lk), np.float32)
    m[:, :, 0, 5:] = -np.inf
    m[:, :, 1, :] = -np.inf
    m[:, :, 2, :900] = -np.inf
    req, got = case(device, b=b, hq=hq, hkv=2, lq=lq, lk=lk, dk=64, dv=64, splits=splits,
                    mask_array=m, overrides={"combine_rounds": rounds, "fused_combine": True})
    assert np.isnan(got[:, :, 1]).all() and np.isfinite(got[:, :, 0]).all()
    assert req.fused_combine and req.combine_rounds == rounds
    assert combine_in_one_round(req)  # rounds=1 runs the one-round form, 2 the other
    lens = np.array([1000, 300, 1, 0], np.int32)
    req, _ = case(device, b=4, hq=8, hkv=2, lk=lk, dk=128, dv=64, kv="f16", splits=splits,
                  live=lens, mask="alibi", overrides={"combine_rounds": rounds,
                                                      "fused_combine": True,
                                                      "min_chunk": 128}, seed=splits)
    assert combine_in_one_round(req)
    assert ("combine2" in req.describe()) == (rounds == 2)


@pytest.mark.parametrize("dv", [45, 44])
def test_one_round_combine_reads_two_channels_a_load_where_dv_is_even(device, dv):
    """The one-round fused combine loads a split's words as vec2 through the alias
    ``part2`` where Dv is even (a partial is Dv + 2 floats, so every row's words start
    at an even float), as floats where it is odd; live lengths leave splits empty."""
    req, _ = case(device, b=2, hq=4, hkv=2, lk=300, dk=45, dv=dv, splits=7,
                  live=np.array([300, 50], np.int32),
                  overrides={"load_elems": 1, "lanes_per_key": 1, "fused_combine": True})
    assert req.fused_combine and combine_in_one_round(req)
    src = generate_decode(req)[0]
    assert ("part2[" in src) == (dv % 2 == 0)


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
@pytest.mark.parametrize("units", [2, 4])
@pytest.mark.parametrize("kv,splits,lq", [("f32", 16, 1), ("f16", 1, 3), ("bf16", 7, 1)])
def test_fold_units_fold_more_rows_a_round(device, units, kv, splits, lq, subgroup):
    """``fold_units``: s_o holds more rows' accumulators, so the rows fold in fewer rounds
    (all of them in one where they fit), over 8 and 6 rows a workgroup (one round, and a
    last round short of full), widths that differ, ALiBi and live lengths that leave
    splits empty."""
    hq = 8 if lq == 1 else 2
    lens = np.array([1000, 300], np.int32)
    req, _ = case(device, b=2, hq=hq, hkv=1, lq=lq, lk=1000, dk=72, dv=40, kv=kv,
                  splits=splits, subgroup=subgroup, live=lens, mask="alibi",
                  overrides={"fold_units": units, "rows_per_wg": hq * lq}, seed=units)
    assert req.fold_units == units and req.rows_per_wg == hq * lq
    assert f"fold_units={units}" in req.describe()
    src = generate_decode(req)[0]
    assert f"s_o[{units * req.local_size // req.lanes_per_key * 10}]" in src


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
@pytest.mark.parametrize("kv,splits", [("f32", 1), ("f16", 7), ("bf16", 16)])
def test_query_in_workgroup_memory(device, kv, splits, subgroup):
    """``q_workgroup``: the rows' query slices stored once to workgroup memory and read at
    each use, with 4 keys a step (as planned for long 16-bit chunks), over widths that
    differ (Dk 72, Dv 40), ALiBi, a softcap, live lengths that leave splits empty and a row
    block of several rows."""
    req, got = case(device, b=2, hq=8, hkv=2, lk=1000, dk=72, dv=40, kv=kv, mask="alibi",
                    softcap=8.0, splits=splits, subgroup=subgroup, live=[1000, 517],
                    seed=splits, overrides={"q_workgroup": True, "keys_per_iter": 4,
                                            "rows_per_wg": 2})
    assert req.q_workgroup and req.keys_per_iter == 4 and req.rows_per_wg == 2
    assert "qwg" in req.describe() and "s_q[" in generate_decode(req)[0]
    assert np.isfinite(got).all()


def test_fp16_conversion_variant(device):
    if not device.profile.extra.get("shader_float16"):
        pytest.skip("no shaderFloat16")
    req, _ = case(device, hq=8, hkv=2, lk=300, dk=64, dv=64, kv="f16", splits=2,
                  overrides={"f16_convert": "fp16"})
    assert req.f16_convert == "fp16"


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("splits", [1, 7])
def test_live_length_from_a_buffer(device, splits, interleave, fused):
    """len[b] from an i32 [B] buffer: keys at or past it add nothing, a split wholly past it
    writes the neutral partial (one recording, any length); interleaved, the splits that
    hold a key take the live length's tiles in turn."""
    req, _ = case(device, b=3, hq=8, hkv=2, lk=1000, dk=64, dv=64, splits=splits,
                  live=np.array([517, 1, 1000]), mask="alibi",
                  overrides={"interleave": interleave, "fused_combine": fused})
    assert req.interleave == (interleave and splits > 1)


@pytest.mark.parametrize("splits", [1, 7])
def test_live_length_is_clamped_into_0_to_lk(device, splits):
    """A length below 0 or past Lk reads nothing outside the buffers: clamped to 0 (no key:
    0/0 = NaN, as the reference) or to Lk (every key)."""
    _, got = case(device, b=4, hq=4, hkv=2, lk=300, dk=32, dv=32, splits=splits,
                  live=np.array([-3, 0, 305, 2**31 - 1]))
    assert np.isnan(got[:2]).all() and np.isfinite(got[2:]).all()


def test_row_blocks(device):
    """n_rep * lq = 36 rows: cut into row blocks (each block its own workgroups)."""
    req, _ = case(device, b=1, hq=12, hkv=1, lq=3, lk=129, dk=64, dv=64, splits=2, kv="f16",
                  overrides={"max_rows": 6})
    assert req.row_blocks == 6 and req.rows_per_wg == 6


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    b=st.integers(1, 3), n_rep=st.sampled_from([1, 4, 8, 12]), hkv=st.integers(1, 2),
    lq=st.sampled_from([1, 3]), lk=st.sampled_from([1, 113, 128, 129, 1000]),
    dk=st.sampled_from([40, 64, 72, 128]), dv=st.sampled_from([40, 64, 72, 128]),
    mask=st.sampled_from([None, "shared", "alibi"]), softcap=st.sampled_from([None, 8.0]),
    kv=st.sampled_from(["f32", "f16", "bf16"]), splits=st.sampled_from([1, 2, 7, 16]),
    subgroup=st.booleans(), qwg=st.booleans(), interleave=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sweep(device, b, n_rep, hkv, lq, lk, dk, dv, mask, softcap, kv, splits, subgroup,
               qwg, interleave, seed):
    case(device, b=b, hq=hkv * n_rep, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv, mask=mask,
         softcap=softcap, kv=kv, splits=splits, subgroup=subgroup, seed=seed,
         overrides={"interleave": interleave, **({"q_workgroup": True} if qwg else {})})


# --- pure checks: sources and the chooser ---------------------------------------------------


def _sources():
    for prof in recorded_profiles().values():
        for kv in ("f32", "f16", "bf16"):
            for sub in (True, False):
                for shape in SHAPES + [(1, 32, 8, 1, 32768, 128, 128), (1, 6, 3, 1, 50, 6, 10)]:
                    b, hq, hkv, lq, lk, dk, dv = shape
                    if kv != "f32" and (dk % 4 or dv % 4):
                        continue
                    p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=lq, lk=lk, dk=dk, dv=dv,
                                      scale=0.1, softcap=5.0, mask=(1, hq, 1), kv_dtype=kv)
                    try:
                        r = choose_decode_schedule(p, prof, has_subgroup_shuffle=sub,
                                                   force_splits=3)
                    except DtypeLowering:
                        continue
                    yield from generate_decode(r)


def test_no_private_arrays_and_every_source_compiles():
    srcs = sorted(set(_sources()))
    assert len(srcs) > 20
    for src in srcs:
        bad = PRIVATE_ARRAY.findall(src)
        assert not bad, f"private array in generated source: {bad}"
    assert PRIVATE_ARRAY.search("void main() {\n    float acc[8];\n")  # the scan can fail
    assert PRIVATE_ARRAY.search("  vec4 t[2];\n")
    assert not PRIVATE_ARRAY.search("shared float s_m[64];\n")
    for src in srcs[::7]:  # a sample through glslang (the rest compile in the device tests)
        assert len(compile_glsl(src)) > 100


def d128(b, hq, hkv, lk, kv="f16", prof=None, **ov):
    """The schedule ``prof`` (default the H200's recorded profile) plans for a D=128, Lq=1
    decode of (b, hq, hkv, lk) with K/V ``kv`` and schedule overrides ``ov``: the planner
    rule tests' shapes."""
    p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=1, lk=lk, dk=128, dv=128, scale=0.1,
                      kv_dtype=kv)
    return choose_decode_schedule(p, prof or recorded_profile("nvidia_h200"),
                                  has_subgroup_shuffle=True, overrides=ov)


def test_interleave_rule():
    """A GPU's split kernels take their tiles in turn from INTERLEAVE_MIN_CHUNK keys a split
    (scalar and register-fed kernels alike); shorter splits, unsplit launches, the staged
    matrix kernel and a CPU keep consecutive tiles; an override wins either way."""
    for kv in ("f16", "f32"):
        r = d128(1, 32, 8, 32768, kv)
        assert r.splits == 16 and r.lk // r.splits == INTERLEAVE_MIN_CHUNK and r.interleave
        assert "interleave" in r.describe()
        assert d128(1, 32, 32, 32768, kv).interleave  # 8 splits of 4096
        assert not d128(1, 32, 8, 4096, kv).interleave  # 16 splits of 256
        assert not d128(32, 32, 8, 2048, kv).interleave  # unsplit
    assert d128(1, 32, 8, 32768).matrix_feed == "registers"
    assert not d128(1, 8, 1, 65536).interleave  # 64 splits of 1024
    assert not d128(1, 32, 8, 32768, interleave=False).interleave
    assert d128(1, 32, 8, 4096, interleave=True).interleave
    assert not d128(32, 32, 8, 2048, interleave=True).interleave  # nothing to take in turn
    staged = d128(1, 32, 8, 65536, matrix=16, matrix_feed="staged")
    assert staged.splits > 1 and not staged.interleave
    forced = choose_decode_schedule(
        DecodeProblem(b=1, hq=8, hkv=2, lq=1, lk=65536, dk=64, dv=64, scale=0.1,
                      kv_dtype="f32"), recorded_profile("lavapipe"),
        has_subgroup_shuffle=True, force_splits=4)
    assert forced.splits == 4 and not forced.interleave  # a CPU: consecutive tiles
    with pytest.raises(ShapeError, match="interleave"):
        check_request(replace(d128(32, 32, 8, 2048), interleave=True))


def test_lazy_rescale_rule():
    """A GPU's scalar kernel with F32 K/V rescales lazily where the launch has at most one
    workgroup a compute unit; more workgroups (the register cost would cut them a compute
    unit), 16-bit K/V past the short rule, the matrix kernels and a CPU stay eager; an
    override wins either way."""
    h200 = recorded_profile("nvidia_h200")

    def req(b, hq, hkv, lk, kv="f32", **kw):
        return d128(b, hq, hkv, lk, kv, **kw)

    for shape in ((1, 32, 8, 32768), (1, 32, 8, 131072), (1, 8, 1, 65536), (1, 32, 8, 4096)):
        r = req(*shape)
        assert r.grid[0] * r.grid[1] <= h200.compute_units
        assert r.lazy_rescale and lazy_planned(r, h200) and " lazy" in r.describe()
    for shape in ((8, 32, 8, 8192), (32, 32, 8, 2048), (1, 32, 32, 32768)):
        r = req(*shape)
        assert r.grid[0] * r.grid[1] > h200.compute_units and not r.lazy_rescale
    assert not req(1, 32, 8, 32768, "f16", matrix=0).lazy_rescale  # long 16-bit: eager
    assert not req(1, 32, 8, 32768, "bf16").lazy_rescale
    assert not req(1, 32, 8, 32768, lazy_rescale=False).lazy_rescale
    assert req(8, 32, 8, 8192, lazy_rescale=True).lazy_rescale
    cpu = req(1, 32, 8, 32768, prof=recorded_profile("lavapipe"))
    assert cpu.grid[0] * cpu.grid[1] <= 132 and not cpu.lazy_rescale


def test_split_rule_on_the_h200_profile():
    """The scalar kernel's rules (the register-fed matrix kernel's: its own test file)."""
    h200 = without_regfed(recorded_profile("nvidia_h200"))

    def req(b, hq, hkv, lk, kv="f16"):
        return d128(b, hq, hkv, lk, kv, h200)

    r = req(1, 32, 8, 32768)
    assert r.splits == 16 and r.workgroups == 128 and r.fused_combine and r.launches == 1
    assert r.chunk >= 128 and r.chunk % r.tile == 0 and r.local_size == 256
    assert r.lanes_per_key == 8 and req(1, 32, 8, 32768, "f32").lanes_per_key == 16
    big = req(32, 32, 8, 2048)
    assert big.splits == 1 and big.local_size == 128  # 256 (batch, KV head) groups fill 132 SMs
    assert req(1, 32, 8, 200).splits == 1  # chunks would fall under 128 keys
    one = req(1, 8, 1, 65536)  # a single KV head: up to 64 splits, combined by a 2nd launch
    assert one.splits == 64 and one.launches == 2
    # ... and two row blocks of 4 rows: 128 workgroups, not 64 (half the SMs idle)
    assert one.rows_per_wg == 4 and one.workgroups == 128
    mid = req(8, 32, 8, 8192)  # 6 splits fill 2.91 waves of 132 SMs (5: 2.42)
    assert mid.splits == 6 and mid.workgroups == 384
    assert mid.fused_combine and mid.launches == 1  # 2.91 per SM <= FUSED_WAVES_PER_CU
    assert combine_in_one_round(mid) and combine_in_one_round(r)
    assert big.keys_per_iter == 4  # unsplit 16-bit K/V at 8 lanes, 128-lane workgroups
    # 8192 keys a workgroup at 8 lanes: the query in workgroup memory, 4 keys a step
    long = req(1, 32, 8, 131072)
    assert long.q_workgroup and long.keys_per_iter == 4 and long.splits == 16
    assert long.chunk == 8192 and long.local_size == 256 and long.fused_combine
    assert not any(x.q_workgroup for x in (r, mid, big, req(1, 32, 8, 65536),
                                           req(1, 32, 8, 131072, "f32")))
    lav = recorded_profile("lavapipe")
    p = DecodeProblem(b=1, hq=32, hkv=8, lq=1, lk=32768, dk=128, dv=128, scale=0.1)
    assert choose_decode_schedule(p, lav, has_subgroup_shuffle=True).splits == 1
    # Lq > 1 is not split (seed rule)
    p3 = DecodeProblem(b=1, hq=32, hkv=8, lq=3, lk=32768, dk=128, dv=128, scale=0.1)
    assert choose_decode_schedule(p3, h200, has_subgroup_shuffle=True).splits == 1


def test_chooser_limits():
    mobile = recorded_profile("mobile_16k")
    p = DecodeProblem(b=1, hq=8, hkv=1, lq=1, lk=4096, dk=128, dv=128, scale=0.1)
    r = choose_decode_schedule(p, mobile, has_subgroup_shuffle=False)
    assert r.shared_bytes <= mobile.max_workgroup_memory
    no16 = mobile.with_(supports_16bit=False, extra={})
    with pytest.raises(DtypeLowering):
        choose_decode_schedule(DecodeProblem(b=1, hq=8, hkv=1, lq=1, lk=64, dk=128, dv=128,
                                             scale=0.1, kv_dtype="f16"), no16,
                               has_subgroup_shuffle=False)
    with pytest.raises(ShapeError):
        DecodeProblem(b=1, hq=6, hkv=4, lq=1, lk=64, dk=64, dv=64, scale=0.1)
    mat = choose_decode_schedule(
        DecodeProblem(b=1, hq=32, hkv=8, lq=1, lk=4096, dk=128, dv=128, scale=0.1,
                      kv_dtype="f16"), recorded_profile("nvidia_h200"),
        has_subgroup_shuffle=True, overrides={"matrix": 16})
    with pytest.raises(ShapeError, match="q_workgroup"):  # the matrix kernel stages q itself
        check_request(replace(mat, q_workgroup=True))
    with pytest.raises(ShapeError):
        DecodeProblem(b=2, hq=8, hkv=4, lq=1, lk=64, dk=64, dv=64, scale=0.1, mask=(2, 3, 1))
    assert chunk_for(113, 16, 32) == 32 and chunk_for(1000, 7, 32) == 160
    assert default_splits(p, recorded_profile("lavapipe"), 1, 32) == 1
    # the requests are plan keys: hashable, equal for equal problems
    h = recorded_profile("nvidia_h200")
    assert hash(choose_decode_schedule(p, h, has_subgroup_shuffle=True)) == \
        hash(choose_decode_schedule(p, h, has_subgroup_shuffle=True))


@pytest.mark.parametrize("lanes", [1, 2, 4])
@pytest.mark.parametrize("splits", [1, 3])
def test_subgroup_fold_of_lane_groups(device, lanes, splits):
    """Key groups narrower than the subgroup merge their (m, l, o) by xor shuffles before the
    workgroup fold (lavapipe's subgroup is 8 lanes wide: 8, 4 and 2 groups per subgroup),
    with several rows per workgroup, a live length and a row that sees nothing (masked)."""
    b, hq, lq, lk = 2, 6, 1, 300
    m = np.zeros((b, hq, lq, lk), np.float32)
    m[0, 1, 0, :] = -np.inf  # one row sees no key: NaN out, like the reference
    m[1, :, 0, 7:] = -np.inf
    req, got = case(device, b=b, hq=hq, hkv=2, lq=lq, lk=lk, dk=64, dv=64, mask_array=m,
                    splits=splits, live=[250, 131], seed=lanes + splits,
                    overrides={"lanes_per_key": lanes, "rows_per_wg": 3})
    assert req.subgroup and req.lanes_per_key == lanes
    assert req.rows_per_wg > 1 and req.key_groups >= 8 // lanes * 2
    assert np.isnan(got[0, 1]).all() and not np.isnan(got[0, 0]).any()


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_min_chunk_runs_a_short_length_on_the_splits_it_needs(device, kv, interleave):
    """A fused split with a minimum chunk: per batch row, a length of one chunk or less is
    one split writing the output itself, a longer one folds only the splits that hold keys
    (those past it return at once; interleaved, those take its tiles in turn); replayed
    twice, so the arrival counters reset."""
    lens = [1, 2, 127, 128, 129, 1000]
    req, _ = case(device, b=len(lens), hq=4, hkv=2, lk=1000, dk=64, dv=64, kv=kv, splits=7,
                  live=lens, overrides={"min_chunk": 128, "interleave": interleave}, seed=3)
    assert req.fused_combine and req.splits == 7 and req.min_chunk == 128
    assert "min_chunk=128" in req.describe()


def test_planned_fused_splits_take_the_minimum_chunk():
    h200 = recorded_profile("nvidia_h200")
    p = DecodeProblem(b=1, hq=9, hkv=3, lq=1, lk=4160, dk=64, dv=64, scale=0.125,
                      kv_dtype="f32", live_len=True)
    planned = choose_decode_schedule(p, h200, has_subgroup_shuffle=True)
    assert planned.fused_combine and planned.splits > 1 and planned.min_chunk == MIN_CHUNK
    forced = choose_decode_schedule(p, h200, has_subgroup_shuffle=True, force_splits=4)
    assert forced.min_chunk == 0  # a forced count keeps its exact chunks
    two = choose_decode_schedule(p, h200, has_subgroup_shuffle=True,
                                 overrides={"fused_combine": False})
    assert two.min_chunk == 0  # the combine launch folds every split's partial
