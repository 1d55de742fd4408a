"""Gather in the oracle against hand-written numpy: rows by index, any index rank, the
clamp contract for an index outside the table, and the typed bind refusal of a token slot."""

import numpy as np
import pytest

from pootvk.errors import ShapeError, SlotRangeError
from pootvk.ir import F16, F32, I32
from pootvk.ops import Builder
from pootvk.oracle import evaluate


def gather_graph(tshape, ishape, dtype=F32, tokens=False):
    b = Builder()
    t = b.param("table", tshape, dtype)
    i = b.tokens("ids", ishape, tshape[0]) if tokens else b.input("ids", ishape, I32)
    b.export("y", b.gather(t, i))
    return b.build()


def test_rows_by_index_any_rank():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((7, 3, 2)).astype(np.float32)
    ids = np.array([[6, 0, 2], [2, 2, 5]], np.int32)
    y = evaluate(gather_graph(table.shape, ids.shape), {"table": table, "ids": ids})["y"]
    want = np.empty((2, 3, 3, 2), np.float32)
    for a in range(2):
        for c in range(3):
            want[a, c] = table[ids[a, c]]
    np.testing.assert_array_equal(y, want)


def test_scalar_index_gives_one_row():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = evaluate(gather_graph((4, 3), ()), {"table": table, "ids": np.int32(2)})["y"]
    np.testing.assert_array_equal(y, [6.0, 7.0, 8.0])


def test_out_of_range_index_reads_the_nearest_row():
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    ids = np.array([-5, 4, 100, 1], np.int32)
    y = evaluate(gather_graph((4, 2), (4,)), {"table": table, "ids": ids})["y"]
    np.testing.assert_array_equal(y, [[0, 1], [6, 7], [6, 7], [2, 3]])


def test_16bit_table_keeps_its_dtype():
    table = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float16)
    g = gather_graph((5, 4), (2,), F16)
    assert g.exports["y"].dtype is F16
    y = evaluate(g, {"table": table, "ids": np.array([4, 1], np.int32)})["y"]
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, table[[4, 1]])


def test_token_slot_refuses_an_id_outside_the_vocab_at_bind():
    g = gather_graph((10, 2), (3,), tokens=True)
    table = np.zeros((10, 2), np.float32)
    with pytest.raises(SlotRangeError) as e:
        evaluate(g, {"table": table, "ids": np.array([1, 10, 2], np.int32)})
    assert (e.value.slot, e.value.value, e.value.lo, e.value.hi) == ("ids", 10, 0, 9)


def test_indices_must_be_i32():
    b = Builder()
    t = b.param("table", (4, 2))
    with pytest.raises(ShapeError, match="i32"):
        b.gather(t, b.input("ids", (2,), F32))
