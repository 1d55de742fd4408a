"""Replay.step's lean path (``pootvk.runtime.replay._lean_step``): the per-step glue of a
plan made once as one straight-line function. It must give what the general path gives,
bit for bit, and hand everything it does not take (a conversion, a refusal, a closed
replay) to the general path before a byte is written."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.errors import BindError, Closed, PootvkError
from pootvk.ops import trace_decode_step
from pootvk.runtime import build_replay
from tests.helpers import reference_attention

B, HQ, HKV, D, CAP = 1, 4, 2, 16, 24


def _values(rng: np.random.Generator, pos: object) -> dict[str, object]:
    return {"q": rng.standard_normal((B, HQ, 1, D), dtype=np.float32),
            "k_new": rng.standard_normal((B, HKV, 1, D), dtype=np.float32),
            "v_new": rng.standard_normal((B, HKV, 1, D), dtype=np.float32),
            "pos": pos}


@pytest.mark.parametrize("live", [True, False])
def test_lean_step_matches_the_general_path_and_the_reference(device, live) -> None:
    g = trace_decode_step(B, HQ, HKV, D, CAP, live=live)
    with build_replay(g, device) as lean, build_replay(g, device) as general:
        assert lean._lean is not None  # the decode step has a lean path
        rng = np.random.default_rng(0)
        for pos in range(5):
            vals = _values(rng, np.int32(pos) if pos % 2 else pos)  # numpy and Python ints
            got = lean.step(vals)
            # a 0-d array is not an int: the lean path declines, the general one converts
            want = general.step({**vals, "pos": np.asarray(pos, np.int64)})
            assert set(got) == {"out"}
            np.testing.assert_array_equal(got["out"], want["out"])
            k, v = lean.read_state("k_cache"), lean.read_state("v_cache")
            np.testing.assert_array_equal(k, general.read_state("k_cache"))
            np.testing.assert_array_equal(k[:, :, pos], vals["k_new"][:, :, 0])
            ref = reference_attention(vals["q"], k[:, :, :pos + 1], v[:, :, :pos + 1])
            err = float(np.sum((got["out"] - ref) ** 2) / np.sum(ref ** 2))
            assert err <= 1e-9


@pytest.mark.parametrize("change", [
    {"pos": CAP},  # past the declared range
    {"pos": -1},
    {"pos": True},  # a bool is not a position
    {"pos": 1.0},
    {"q": np.zeros((B, HQ, 1, D + 1), np.float32)},
    {"q": "not an array"},
    {"k_new": None},
])
def test_what_the_lean_path_refuses_is_refused_with_nothing_written(device, change) -> None:
    g = trace_decode_step(B, HQ, HKV, D, CAP, live=True)
    with build_replay(g, device) as rp:
        rng = np.random.default_rng(1)
        rp.step(_values(rng, 0))
        k0 = rp.read_state("k_cache")
        with pytest.raises(PootvkError):
            rp.step({**_values(rng, 1), **change})
        np.testing.assert_array_equal(rp.read_state("k_cache"), k0)


def test_a_missing_or_extra_slot_takes_the_general_path(device) -> None:
    g = trace_decode_step(B, HQ, HKV, D, CAP, live=True)
    with build_replay(g, device) as rp:
        vals = _values(np.random.default_rng(2), 0)
        with pytest.raises(BindError):
            rp.step({k: v for k, v in vals.items() if k != "v_new"})
        with pytest.raises(BindError):
            rp.step({**vals, "bogus": np.zeros(1, np.float32)})
        # float64 inputs are the general path's to convert: the same answer as float32
        a = rp.step(vals)["out"]
        rp.step({**vals, "pos": 0})  # rewrite position 0 with the same k/v
        b = rp.step({**vals, "q": vals["q"].astype(np.float64)})["out"]
        np.testing.assert_array_equal(a, b)


def test_the_lean_path_raises_closed(device) -> None:
    g = trace_decode_step(B, HQ, HKV, D, CAP, live=True)
    vals = _values(np.random.default_rng(3), 0)
    rp = build_replay(g, device)
    rp.step(vals)
    rp.close()
    with pytest.raises(Closed, match="replay"):
        rp.step(vals)
    lender = build_replay(g, device)
    borrower = build_replay(g, device, share=lender)
    borrower.step(vals)
    lender.close()
    with pytest.raises(Closed, match="shares its buffers"):
        borrower.step(vals)
    borrower.close()
