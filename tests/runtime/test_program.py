"""pootvk.compile(graph) -> Program: params written once, states kept on the device between
calls, exports returned; typed refusals before anything runs; close and context manager."""

import numpy as np
import pytest

import pootvk
from pootvk.errors import BindError, Closed, SlotRangeError
from pootvk.ops import Builder


def counter_graph():
    """acc' = acc + x * w; exports y = acc' and the row of a table at the token id."""
    b = Builder()
    x = b.input("x", (4,))
    w = b.param("w", (4,))
    acc = b.state("acc", (4,))
    new = b.add(acc, b.mul(x, w))
    b.set_state("acc", new)
    b.export("y", new)
    b.export("row", b.gather(b.param("table", (3, 2)), b.tokens("tok", (), 3)))
    return b.build()


def test_compile_is_the_function_and_passes_the_subpackage():
    import pootvk.passes

    assert callable(pootvk.compile) and pootvk.passes.compile_graph is not pootvk.compile


def test_state_stays_on_the_device_and_params_persist(device):
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    w = np.array([1, 2, 3, 4], np.float32)
    with pootvk.compile(counter_graph(), device) as prog:
        x = np.ones(4, np.float32)
        out = prog(x=x, w=w, table=table, tok=np.int32(2))
        np.testing.assert_array_equal(out["y"], w)
        np.testing.assert_array_equal(out["row"], [4, 5])
        assert set(out) == {"y", "row"}
        for i in range(2, 5):  # params not given again: still bound; the state accumulates
            out = prog(x=x, tok=np.int32(0))
            np.testing.assert_array_equal(out["y"], i * w)
        np.testing.assert_array_equal(prog.state("acc"), 4 * w)
        out = prog(x=x, acc=np.zeros(4, np.float32), w=2 * w, tok=np.int32(1))  # replaced
        np.testing.assert_array_equal(out["y"], 2 * w)
        np.testing.assert_array_equal(out["row"], [2, 3])
        assert prog.recordings == 1
        assert "colouring saves" in str(prog.plan)


def test_refusals_are_typed_and_write_nothing(device):
    prog = pootvk.compile(counter_graph(), device)
    x = np.ones(4, np.float32)
    table = np.zeros((3, 2), np.float32)
    w = np.ones(4, np.float32)
    with pytest.raises(BindError, match="'table'"):  # a param never bound
        prog(x=x, w=w, tok=np.int32(0))
    with pytest.raises(BindError, match="'x'"):  # a per-step input missing
        prog(w=w, table=table, tok=np.int32(0))
    with pytest.raises(BindError, match="nope"):
        prog(x=x, w=w, table=table, tok=np.int32(0), nope=x)
    with pytest.raises(SlotRangeError):
        prog(x=x, w=w, table=table, tok=np.int32(3))
    np.testing.assert_array_equal(prog.state("acc"), np.zeros(4))  # nothing ran
    with pytest.raises(BindError, match="'w'"):  # and the refused call bound no param
        prog(x=x, table=table, tok=np.int32(0))
    prog.close()
    with pytest.raises(Closed):
        prog(x=x, w=w, table=table, tok=np.int32(0))
    assert prog.closed


def test_rerecord_gives_the_same_answers(device):
    """The benchmark's record-every-step baseline computes what the replay computes."""
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    w = np.array([1, 2, 3, 4], np.float32)
    with pootvk.compile(counter_graph(), device) as prog:
        prog.set_params(w=w, table=table)
        for i in range(1, 4):
            prog.rerecord()
            out = prog(x=np.ones(4, np.float32), tok=np.int32(i - 1))
            np.testing.assert_array_equal(out["y"], i * w)
            np.testing.assert_array_equal(out["row"], table[i - 1])
        assert prog.recordings == 4


def test_model_decode_bench_quick(capsys, device):
    from tests.helpers import load_bench

    mod = load_bench("model_decode")
    assert mod.main(["--quick", "--steps", "3", "--warmup", "1", "--check", "2"]) == 0
    out = capsys.readouterr().out
    assert "check: 2 steps vs the oracle" in out
    assert "replay" in out and "rerecord" in out and "host time per token" in out
    assert "program order" in out and "barriers per step" in out


def test_two_programs_share_params_and_state(device):
    """``share=``: the second program binds the first's param and state buffers, so a call
    of either updates the one state the other then reads; the lender's params count as
    written; a shape mismatch is refused; closing the lender refuses the borrower."""
    b = Builder()  # acc' = acc - 10 * w, another graph over the same slots
    w, acc = b.param("w", (4,)), b.state("acc", (4,))
    new = b.sub(acc, b.mul(w, 10.0))
    b.set_state("acc", new)
    b.export("y", new)
    w = np.array([1, 2, 3, 4], np.float32)
    table = np.zeros((3, 2), np.float32)
    x = np.ones(4, np.float32)
    with pootvk.compile(counter_graph(), device) as first:
        first(x=x, w=w, table=table, tok=np.int32(0))  # acc = w
        second = pootvk.compile(b.build(), share=first)  # no params given: first's are bound
        np.testing.assert_array_equal(second()["y"], w - 10 * w)
        np.testing.assert_array_equal(first(x=x, tok=np.int32(0))["y"], w - 10 * w + w)
        np.testing.assert_array_equal(second.state("acc"), first.state("acc"))
        bad = Builder()
        bad.set_state("acc", bad.state("acc", (5,)))
        bad.export("z", bad.add(bad.param("w", (4,)), 1.0))
        with pytest.raises(BindError):
            pootvk.compile(bad.build(), share=first)
    with pytest.raises(Closed):
        second()
    second.close()


def test_a_token_id_as_any_integer_scalar_is_range_checked_before_anything_runs(device):
    """Python and NumPy integer scalars take the replay's fast bind (checked against the
    declared range as they are); out of range they raise SlotRangeError and run nothing."""
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    w = np.ones(4, np.float32)
    x = np.ones(4, np.float32)
    with pootvk.compile(counter_graph(), device) as prog:
        prog.set_params(w=w, table=table)
        for n, tok in enumerate((2, np.int64(1), np.uint8(0), np.int16(2), np.array(1, np.int32))):
            out = prog(x=x, tok=tok)
            np.testing.assert_array_equal(out["row"], table[int(tok)])
            np.testing.assert_array_equal(out["y"], (n + 1) * w)
        for bad in (3, -1, np.int64(2**40), np.uint64(3)):
            with pytest.raises(SlotRangeError):
                prog(x=x, tok=bad)
        with pytest.raises(BindError):
            prog(x=x, tok=True)
        np.testing.assert_array_equal(prog.state("acc"), 5 * w)  # the refusals ran nothing
