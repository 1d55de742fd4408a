"""Gather on the device against the oracle, for F32, F16 and BF16 tables (16-bit rows are
copied as 16-bit words), including indices outside the table (clamped, never read out of
bounds: the validation layer and the oracle agree)."""

import ml_dtypes
import numpy as np
import pytest

from pootvk.ir import BF16, F16, F32, I32
from pootvk.ir import prims as P
from pootvk.ops import Builder
from pootvk.oracle import evaluate
from pootvk.runtime import build_replay

DTYPES = {"f32": (F32, np.float32), "f16": (F16, np.float16), "bf16": (BF16, ml_dtypes.bfloat16)}


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("ishape", [(), (5,), (2, 3)], ids=str)
def test_gather_matches_the_oracle(device, name, ishape):
    dt, npdt = DTYPES[name]
    rng = np.random.default_rng(len(ishape))
    table = rng.standard_normal((33, 3, 5)).astype(npdt)
    ids = rng.integers(-3, 37, ishape).astype(np.int32)  # some outside [0, 33): clamped
    b = Builder()
    b.export("y", b.gather(b.param("table", table.shape, dt), b.input("ids", ishape, I32)))
    g = b.build()
    want = evaluate(g, {"table": table, "ids": ids})["y"]
    with build_replay(g, device) as rp:
        assert [k.request.prim for k in rp.plan.kernels] == [P.GATHER]
        rp.set_params({"table": table})
        got = rp.step({"ids": ids})["y"]
    assert got.shape == ishape + (3, 5)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    rows = np.clip(ids, 0, 32)  # the contract, by hand
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  table.astype(np.float32)[rows])
