"""TopK and BlockTopK on the device against the oracle, exactly (the outputs are indices).

The kernel (``shaders.topk``) is a radix selection over order keys: the cases aim at what
such a kernel gets wrong: ties (integer-valued scores, all-equal rows: the lower index
wins and the threshold bin is taken in part), NaN (below -inf), -0 against +0, +-inf,
denormals, k == 1 and k == N (a bin taken whole ends the search early), rows shorter than a
workgroup and not a multiple of it, long rows (40000), many rows over a folded grid, a
workgroup narrower than the 256 histogram bins. BlockTopK: positions before the first
complete block (all -1), fewer complete blocks than K, negative positions, positions past
the last block, block sizes 16 and 64, K in {1, 4, 16}, Hs in {1, 4}, Lq in {1, 3}.

Every case runs each variant of the kernel (``forced_topk``): the scans on subgroup
shuffles (lavapipe has them) or through workgroup memory, the row held in registers or
streamed from memory each pass; and the planner's boundaries (lanes, keys a lane, 16-byte
loads, registers against streaming) are crossed on both sides.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from pootvk.errors import ShapeError
from pootvk.ir import F32, I32
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.oracle.sparse import topk_indices
from pootvk.plan import plan_graph, recorded_profiles
from pootvk.plan.topk import TopKRequest
from pootvk.plan.topk_rules import MAX_PER_LANE, forced_topk, topk_request
from pootvk.runtime import build_replay
from pootvk.shaders.compiler import compile_glsl
from pootvk.shaders.generate import generate
from tests.values import run_on_device

#: a declaration of a non-shared array (as tests/shaders/test_generated.py scans for)
PRIVATE_ARRAY = re.compile(
    r"^\s*(?:const\s+)?(?:float|int|uint|bool|[iu]?vec[234]|mat[234])\s+\w+\s*\[", re.M
)
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45,
                    3.4e38, -3.4e38, 2.0, 2.0], np.float32)
#: the bottom of the order only: NaN, -inf, the least number, zeros of both signs
LOW = np.array([np.nan, -np.inf, -3.4e38, -0.0, 0.0], np.float32)
KINDS = ("ints", "normal", "special", "low", "equal")
#: the kernel's variants: forced_topk fields, by name
VARIANTS = {
    "subgroup": {"subgroup": True},
    "shared": {"subgroup": False},
    "stream-subgroup": {"subgroup": True, "registers": False},
    "stream-shared": {"subgroup": False, "registers": False},
}


def check_variant(req: TopKRequest, variant: str) -> None:
    """The plan took the variant's choices."""
    assert req.subgroup == ("shared" not in variant)
    assert (req.per_lane == 0) == variant.startswith("stream")


def scores(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Row data of one ``kind``: many ties, distinct values, the special values, the
    bottom of the order, or rows that are each one value repeated (a number, +-0 mixed,
    -inf, or NaN)."""
    if kind == "ints":  # few distinct values: every threshold is a tie
        return rng.integers(-3, 4, shape).astype(np.float32)
    if kind == "normal":
        return rng.standard_normal(shape).astype(np.float32)
    if kind in ("special", "low"):
        return rng.choice(SPECIAL if kind == "special" else LOW, shape)
    rows = int(np.prod(shape[:-1]))
    fill = np.array([1.5, 0.0, -np.inf, np.nan], np.float32)[np.arange(rows) % 4]
    x = np.broadcast_to(fill.reshape(*shape[:-1], 1), shape).copy()
    x[..., ::3] = np.where(x[..., ::3] == 0, np.float32(-0.0), x[..., ::3])  # -0 == +0
    return x


def topk_graph(shape: tuple[int, ...], k: int):
    b = Builder()
    b.export("y", b.topk(b.input("x", shape, F32), k))
    return b.build()


def block_graph(shape: tuple[int, int, int, int], bs: int, top: int):
    b = Builder()
    s = b.input("s", shape, F32)
    q = b.input("qpos", (shape[0], shape[2]), I32)
    b.export("ids", b.emit(P.BLOCK_TOPK, [s, q], block_size=bs, top_k=top))
    return b.build()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("shape", "ks"), [
    ((1, 3), (1, 2, 3)),  # N = 3: fewer elements than lanes
    ((5, 37), (1, 5, 37)),  # N not a multiple of anything
    ((2, 3, 300), (7, 300)),  # rank 3 (6 rows), k == N
    ((300, 50), (4,)),  # many rows
    ((2, 2048), (1, 16)),  # a decode row of NB = 2048 blocks
    ((2, 40000), (1, 1000)),  # long rows: 157 elements a lane
], ids=str)
def test_topk_matches_the_oracle(device, shape, ks, variant):
    rng = np.random.default_rng(shape[-1])
    for k in ks:
        g = topk_graph(shape, k)
        if shape[-1] > MAX_PER_LANE * 256 and not variant.startswith("stream"):
            continue  # streams whatever is asked: below
        with forced_topk(**VARIANTS[variant]):
            rp = build_replay(g, device)
        with rp:
            (kern,) = rp.plan.kernels
            assert isinstance(kern.request, TopKRequest) and kern.request.k == k
            check_variant(kern.request, variant)
            for kind in KINDS:
                x = scores(kind, shape, rng)
                want = evaluate(g, {"x": x})["y"]
                got = rp.step({"x": x})["y"]
                assert got.shape == (*shape[:-1], k) and got.dtype == np.int32
                np.testing.assert_array_equal(got, want, err_msg=f"{kind} k={k}")


def test_topk_contract_by_hand(device):
    """The order in words, on one row: NaN below -inf, -0 == +0 (ties to the lower
    index), the chosen indices listed ascending."""
    x = np.array([[np.nan, -np.inf, -0.0, 0.0, 5.0, np.nan, -1.0, 0.0, 5.0]], np.float32)
    want = {1: [4], 2: [4, 8], 3: [2, 4, 8], 5: [2, 3, 4, 7, 8], 7: [1, 2, 3, 4, 6, 7, 8],
            8: [0, 1, 2, 3, 4, 6, 7, 8], 9: list(range(9))}
    for k, idx in want.items():
        np.testing.assert_array_equal(topk_indices(x, k)[0], idx)  # the oracle agrees
        g = topk_graph(x.shape, k)
        with build_replay(g, device) as rp:
            np.testing.assert_array_equal(rp.step({"x": x})["y"][0], idx, err_msg=f"k={k}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_narrow_workgroups_and_folded_grids(device, variant):
    """A device of 8 invocations (32 histogram bins a lane; lavapipe's subgroup of 8 is the
    whole workgroup; with subgroup scans on a device of wider subgroups, one subgroup: 32 on
    the H200) and an X grid of 16 (200 rows over a 2-D grid, a few workgroups past the last
    row): the same answers."""
    shape, k = (200, 70), 9
    g = topk_graph(shape, k)
    narrow = max(8, device.profile.subgroup_size) if VARIANTS[variant].get("subgroup") else 8
    small = device.profile.with_(max_grid=(16, 65535, 65535), max_invocations=narrow)
    with forced_topk(**VARIANTS[variant]):
        (kern,) = plan_graph(g, small).kernels
    gx, gy = kern.request.grid
    assert kern.request.lanes == narrow and gx <= 16 and gy > 1 and gx * gy > 200  # some idle
    check_variant(kern.request, variant)
    rng = np.random.default_rng(3)
    for kind in KINDS:
        x = scores(kind, shape, rng)
        with forced_topk(**VARIANTS[variant]):
            got = run_on_device(device, g, {"x": x}, profile=small)["y"]
        np.testing.assert_array_equal(got, evaluate(g, {"x": x})["y"], err_msg=kind)


def positions(shape: tuple[int, int], nb: int, bs: int, top: int,
              rng: np.random.Generator) -> np.ndarray:
    """Query positions over every regime: negative, before the first complete block,
    fewer complete blocks than K, exactly K, more, past the last block."""
    special = np.array([-1, -bs - 5, -(1 << 31), 0, bs - 1, bs, 2 * bs + 3, top * bs,
                        top * bs + bs - 1, (top + 1) * bs, nb * bs - 1, nb * bs,
                        nb * bs + 7 * bs, (1 << 31) - 1], np.int64)
    pick = rng.choice(special, shape)
    wide = rng.integers(-2 * bs, (nb + 2) * bs, shape)
    return np.where(rng.random(shape) < 0.6, pick, wide).astype(np.int32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("shape", "bs", "top"), [
    ((2, 1, 1, 24), 16, 1),
    ((2, 4, 3, 24), 16, 4),
    ((3, 1, 3, 40), 64, 16),
    ((2, 4, 1, 33), 64, 4),
    ((1, 4, 3, 2048), 16, 16),  # decode-sized rows of blocks
], ids=str)
def test_block_topk_matches_the_oracle(device, shape, bs, top, variant):
    rng = np.random.default_rng(shape[-1] + bs + top)
    g = block_graph(shape, bs, top)
    with forced_topk(**VARIANTS[variant]):
        rp = build_replay(g, device)
    with rp:
        (kern,) = rp.plan.kernels
        assert isinstance(kern.request, TopKRequest) and kern.request.masked
        check_variant(kern.request, variant)
        for kind in KINDS:
            s = scores(kind, shape, rng)
            q = positions((shape[0], shape[2]), shape[3], bs, top, rng)
            want = evaluate(g, {"s": s, "qpos": q})["ids"]
            got = rp.step({"s": s, "qpos": q})["ids"]
            assert got.shape == (*shape[:3], top) and got.dtype == np.int32
            np.testing.assert_array_equal(got, want, err_msg=f"{kind} qpos={q.tolist()}")
            ok = np.maximum(q.astype(np.int64), 0) // bs  # the contract, by hand
            for (bi, h, li) in np.ndindex(*shape[:3]):
                row, n_ok = got[bi, h, li], min(int(ok[bi, li]), shape[3])
                picked = row[row >= 0]
                assert len(picked) == min(n_ok, top) and np.all(np.diff(picked) > 0)
                assert np.all(row[len(picked):] == -1) and np.all(picked < n_ok)


def test_block_topk_contract_by_hand(device):
    """NaN scores read as -inf (tied with -inf, ties to the lower block), incomplete blocks
    never picked while complete ones remain, picked incomplete blocks written -1."""
    bs = 16
    row = np.array([np.nan, -np.inf, np.nan, 1.0, 7.0, -0.0, 0.0, 9.0], np.float32)
    s = np.broadcast_to(row, (1, 1, 4, 8)).copy()
    q = np.array([[8 * bs, 5 * bs + 3, 3 * bs, 2 * bs - 1]], np.int32)  # 8, 5, 3, 1 complete
    want = [[3, 4, 7], [0, 3, 4], [0, 1, 2], [0, -1, -1]]  # row 1: NaN ties -inf, wins
    g = block_graph(s.shape, bs, 3)
    np.testing.assert_array_equal(evaluate(g, {"s": s, "qpos": q})["ids"][0, 0], want)
    with build_replay(g, device) as rp:
        np.testing.assert_array_equal(rp.step({"s": s, "qpos": q})["ids"][0, 0], want)


def test_block_topk_with_no_complete_block(device):
    """Every position before the first complete block (or negative): all -1."""
    shape, bs = (2, 4, 3, 10), 16
    g = block_graph(shape, bs, 4)
    q = np.array([[0, 15, -3], [-(1 << 31), 1, 7]], np.int32)
    s = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    with build_replay(g, device) as rp:
        got = rp.step({"s": s, "qpos": q})["ids"]
    assert np.all(got == -1)
    np.testing.assert_array_equal(got, evaluate(g, {"s": s, "qpos": q})["ids"])


def sources() -> list[tuple[TopKRequest, str]]:
    """Every recorded device's kernels, each variant, plain and masked, short and long."""
    out = {}
    for prof in recorded_profiles().values():
        for g in (topk_graph((3, 5), 2), topk_graph((4, 40000), 64), topk_graph((2, 300), 7),
                  block_graph((2, 4, 3, 2048), 64, 16), block_graph((1, 1, 1, 3), 16, 3),
                  block_graph((1, 2, 1, 8190), 64, 16)):
            for over in ({}, {"subgroup": False}, {"registers": False}):
                with forced_topk(**over):
                    reqs = [k.request for k in plan_graph(g, prof).kernels]
                out.update((r, generate(r)) for r in reqs)
    return sorted(out.items(), key=lambda rs: rs[1])


def test_generated_sources_keep_no_private_arrays_and_validate():
    exe = shutil.which("spirv-val")
    srcs = sources()
    assert len(srcs) >= 12
    for req, src in srcs:
        assert not PRIVATE_ARRAY.findall(src), src
        # subgroup operations only in the subgroup variant (the shared one has none)
        assert ("subgroup" in src.lower()) == req.subgroup, req.describe()
        if req.subgroup and req.k < req.n:  # one barrier a pass, one before, one after
            assert src.count("barrier();") == (3 if req.subgroups > 1 else 2), src
        if exe is None:
            continue
        spv = compile_glsl(src)
        r = subprocess.run([exe, "--target-env", "vulkan1.1", "-"], input=spv,
                           capture_output=True)
        assert r.returncode == 0, r.stdout.decode() + r.stderr.decode() + src


def test_lanes_and_workgroup_memory_fit_every_recorded_device():
    for prof in recorded_profiles().values():
        for n in (1, 3, 100, 2048, 8192, 8193, 65536):
            for over in ({}, {"subgroup": False}, {"registers": False}):
                with forced_topk(**over):
                    (k,) = plan_graph(topk_graph((2, n), 1), prof).kernels
                r = k.request
                assert r.lanes & (r.lanes - 1) == 0 and r.lanes <= prof.max_invocations
                assert r.lanes <= prof.max_workgroup_size[0]
                assert r.shared_bytes <= prof.max_workgroup_memory
                assert r.per_lane <= MAX_PER_LANE and r.lanes * r.per_lane in (0, *range(
                    n, n + r.lanes))  # the registers hold the row, a lane's worth spare at most
                # subgroups only where the profile has them, whole subgroups of lanes
                assert not r.subgroup or (prof.subgroup_shuffle and
                                          r.lanes % prof.subgroup_size == 0)


def test_the_h200_plan():
    """On the H200 (subgroups of 32): 8 keys a lane up to the 256-lane workgroup, one
    subgroup at least, the row in registers up to 8192 (32 a lane), then streamed; the
    subgroup scans unless forced off."""
    prof = recorded_profiles()["nvidia_h200"]
    want = {3: (32, 1), 128: (32, 4), 256: (32, 8), 257: (64, 5), 512: (64, 8),
            2048: (256, 8), 2049: (256, 9), 8192: (256, 32), 8193: (256, 0)}
    for n, (lanes, per_lane) in want.items():
        r = topk_request(8, n, 1, prof, block_size=64, heads=8)
        assert (r.lanes, r.per_lane, r.subgroup, r.subgroup_size) == \
            (lanes, per_lane, True, 32), (n, r.describe())
        assert r.subgroups == lanes // 32
    with forced_topk(subgroup=False):
        assert not topk_request(8, 2048, 16, prof).subgroup
    with forced_topk(registers=False, lanes=64):
        r = topk_request(8, 2048, 16, prof)
        assert (r.lanes, r.per_lane) == (64, 0)
    mobile = recorded_profiles()["mobile_16k"]  # no subgroup shuffles
    assert not topk_request(8, 2048, 16, mobile).subgroup
    with pytest.raises(ShapeError), forced_topk(subgroup=True):
        topk_request(8, 2048, 16, mobile)
    with pytest.raises(ShapeError), forced_topk(registers=True):
        topk_request(8, 8193, 16, prof)
    with pytest.raises(ValueError):
        with forced_topk(width=3):
            pass


#: rows on both sides of every boundary the plan has on lavapipe (subgroups of 8): the
#: lanes (32 up to 256 keys, then 64), 16-byte loads (keys a lane and N multiples of 4),
#: a lane's chunk past the row's end, registers (up to 32 keys a lane at 256 lanes) against
#: streaming
BOUNDARIES = (255, 256, 257, 2048, 2049, 2052, 8188, 8190, 8192, 8193)


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
@pytest.mark.parametrize("n", BOUNDARIES)
def test_every_boundary(device, n, subgroup):
    rng = np.random.default_rng(n)
    per_lane = -(-n // 256)
    for k in (1, 16):
        g = topk_graph((4, n), k)  # 4 rows: "equal" rows of a number, zeros, -inf, NaN
        with forced_topk(subgroup=subgroup):
            rp = build_replay(g, device)
        with rp:
            (kern,) = rp.plan.kernels
            r = kern.request
            assert r.subgroup == subgroup
            assert (r.per_lane == 0) == (per_lane > MAX_PER_LANE)
            for kind in KINDS:
                x = scores(kind, (4, n), rng)
                np.testing.assert_array_equal(rp.step({"x": x})["y"],
                                              evaluate(g, {"x": x})["y"], err_msg=kind)
    bs, top = 64, 16
    g = block_graph((1, 4, 1, n), bs, top)
    with forced_topk(subgroup=subgroup):
        rp = build_replay(g, device)
    with rp:
        for kind in KINDS:
            s = scores(kind, (1, 4, 1, n), rng)
            # every block eligible, all but the last, the first K + 1, one past the row
            for qp in (n * bs, n * bs - 1, (top + 1) * bs + 5, 3 * n * bs // 4):
                q = np.array([[qp]], np.int32)
                np.testing.assert_array_equal(
                    rp.step({"s": s, "qpos": q})["ids"],
                    evaluate(g, {"s": s, "qpos": q})["ids"], err_msg=f"{kind} qpos={qp}")
