"""NaN semantics are the oracle's (issue 6 item 6), on every attention schedule.

A NaN in a visible score (from q, k or the mask) or in a value row makes that output row
NaN; a -inf score still adds exactly zero weight; +inf in a value row gives what the
reference gives (a masked key's value row is multiplied by its zero weight, as the
oracle's matmul does: 0 * inf = NaN). A poisoned cache must never look normal.
"""

from __future__ import annotations

import numpy as np
import pytest

import pootvk
from pootvk.plan import forced_schedule
from tests.helpers import reference_attention
from tests.vk.test_vk_attention import SCHEDULES

B, HQ, HKV, LQ, LK, D = 2, 4, 2, 3, 37, 16


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, HQ, LQ, D), dtype=np.float32)
    k = rng.standard_normal((B, HKV, LK, D), dtype=np.float32)
    v = rng.standard_normal((B, HKV, LK, D), dtype=np.float32)
    mask = np.zeros((B, HQ, LQ, LK), np.float32)
    mask[:, :, :, LK - 5:] = -np.inf  # the last keys are masked for every row
    return q, k, v, mask


def _check(out: np.ndarray, ref: np.ndarray) -> None:
    assert out.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(ref))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(out[fin], ref[fin], rtol=2e-4, atol=2e-5)


CASES = {
    "nan_in_k": lambda q, k, v, m: k.__setitem__((1, 0, 4, 3), np.nan),
    "nan_in_q": lambda q, k, v, m: q.__setitem__((0, 3, 1, 0), np.nan),
    "nan_in_mask": lambda q, k, v, m: m.__setitem__((1, 2, 0, 10), np.nan),
    "nan_in_v": lambda q, k, v, m: v.__setitem__((0, 1, 7, 5), np.nan),
    "inf_in_v": lambda q, k, v, m: v.__setitem__((0, 0, 2, 1), np.inf),
    "nan_in_masked_v": lambda q, k, v, m: v.__setitem__((1, 1, LK - 2, 0), np.nan),
    "inf_in_masked_v": lambda q, k, v, m: v.__setitem__((1, 0, LK - 1, 3), np.inf),
    "neg_inf_in_mask": lambda q, k, v, m: m.__setitem__((0, 0, 0, slice(0, 20)), -np.inf),
    "row_sees_nothing": lambda q, k, v, m: m.__setitem__((1, 1, 2, slice(None)), -np.inf),
}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_nan_and_inf_are_the_references(device, case, schedule):
    q, k, v, mask = _inputs()
    CASES[case](q, k, v, mask)
    ref = reference_attention(q, k, v, mask)
    with forced_schedule(**SCHEDULES[schedule]):
        out = pootvk.attention(q, k, v, mask, device=device)
    _check(out, ref)
    if case.startswith("nan") or case == "inf_in_masked_v":
        assert np.isnan(out).any() and not np.isnan(out).all()  # only the rows that see it
