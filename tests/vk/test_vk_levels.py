"""Level order (vk.hazards.levels / level_order, the recorder's default): each dispatch's
level against a pairwise reference, random programs on the device bit for bit against the
order given and numpy, per-dispatch times kept with their dispatch, and a Llama's logits
unchanged by the order."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pootvk.config import Config
from pootvk.llm import LlamaConfig, LlamaModel, random_weights
from pootvk.vk import Access, BufferRange, Dispatch, Recorder, barriers_before
from pootvk.vk.hazards import level_order, levels
from tests.helpers import examples
from tests.vk.hazard_cases import SEGMENTS, Case, Kernels, Op, run_case

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE


def _fake(bindings: list[tuple[str, int, int, Access]]) -> SimpleNamespace:
    """A dispatch as the hazard rules see it: (buffer, offset, nbytes, access) bindings."""
    return SimpleNamespace(
        bindings=tuple(SimpleNamespace(buffer=b, offset=o, nbytes=n) for b, o, n, _ in bindings),
        accesses=tuple(a for *_, a in bindings),
    )


def _hazard(earlier: SimpleNamespace, later: SimpleNamespace) -> bool:
    """The pairwise rule, written out: RAW, WAW or WAR on overlapping bytes of one buffer."""
    for x, ax in zip(earlier.bindings, earlier.accesses, strict=True):
        for y, ay in zip(later.bindings, later.accesses, strict=True):
            overlap = x.buffer == y.buffer and x.offset < y.offset + y.nbytes \
                and y.offset < x.offset + x.nbytes
            if overlap and (ax.writes or ay.writes):
                return True
    return False


bindings = st.tuples(st.sampled_from("ab"), st.integers(0, 60), st.integers(1, 24),
                     st.sampled_from((R, W, RW)))
programs = st.lists(st.lists(bindings, min_size=1, max_size=4).map(_fake), max_size=24)


@settings(max_examples=300, deadline=None)
@given(programs)
def test_levels_follow_the_pairwise_rule(ds) -> None:
    """level = 1 + the deepest earlier dispatch with a hazard (0 if none); level order keeps
    every pair with a hazard in order; its barriers are the levels minus one, never more
    than the order given needs."""
    lv = levels(ds)
    for j, d in enumerate(ds):
        want = max((lv[i] + 1 for i in range(j) if _hazard(ds[i], d)), default=0)
        assert lv[j] == want, (j, lv)
    order = level_order(ds)
    assert sorted(order) == list(range(len(ds)))
    pos = {i: n for n, i in enumerate(order)}
    for j in range(len(ds)):
        for i in range(j):
            if _hazard(ds[i], ds[j]):
                assert pos[i] < pos[j], (i, j, order)
    placed = sum(barriers_before([ds[i] for i in order]))
    assert placed == (max(lv) if ds else 0)
    assert placed <= sum(barriers_before(ds))


def test_level_order_example() -> None:
    """q GEMV -> rope -> k write, then v GEMV -> v write (a plan's order): the v GEMV moves
    next to the q GEMV and the v write next to rope, 3 barriers become 2."""
    ds = [_fake([("x", 0, 4, R), ("q", 0, 4, W)]),  # q GEMV
          _fake([("q", 0, 4, R), ("k", 0, 4, W)]),  # rope
          _fake([("k", 0, 4, R), ("kc", 0, 4, W)]),  # k write
          _fake([("x", 0, 4, R), ("v", 0, 4, W)]),  # v GEMV
          _fake([("v", 0, 4, R), ("vc", 0, 4, W)])]  # v write
    assert levels(ds) == (0, 1, 2, 0, 1)
    assert level_order(ds) == (0, 3, 1, 4, 2)
    assert sum(barriers_before(ds)) == 3
    assert sum(barriers_before([ds[i] for i in level_order(ds)])) == 2


@pytest.fixture(scope="module")
def kernels(device) -> Kernels:
    return Kernels(device)


refs = st.tuples(st.sampled_from("pq"), st.integers(0, SEGMENTS - 1), st.integers(0, 1))


@st.composite
def device_programs(draw) -> tuple[Op, ...]:
    """Random inc/add ops over ranges of two buffers (shifted ranges partly overlap their
    neighbours); an op's output never overlaps its inputs (its invocations would race)."""
    ops = []
    for _ in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(("inc", "add")))
        ins = [draw(refs) for _ in range(1 if kind == "inc" else 2)]
        out = draw(refs.filter(lambda r, ins=ins: all(r[:2] != i[:2] for i in ins)))
        ops.append(Op(kind, (*ins, out)))
    return tuple(ops)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(device_programs())
def test_random_programs_match_the_order_given(device, kernels, ops) -> None:
    """Level order and the order given compute the same bits, and the bits of numpy running
    the ops one after another (under the validation layer, like every device test)."""
    k = kernels
    case = Case("random", ops, ())
    rec, got, want = run_case(k, case, Recorder(device).record)
    prog, got_p, _ = run_case(k, case, lambda ds: Recorder(device).record(ds, program_order=True))
    assert rec.barriers <= prog.barriers
    for b in want:
        np.testing.assert_array_equal(got[b], want[b], err_msg=b)
        np.testing.assert_array_equal(got_p[b], want[b], err_msg=b)


def test_dispatch_times_stay_with_their_dispatch(device, kernels) -> None:
    """A long dispatch given last but recorded second (level 0): its time comes back at its
    own index, and the times still sum to the submit's."""
    k = kernels
    big = 1 << 21  # floats: ~ms on lavapipe against ~us for the 256-float dispatches
    n = 256
    buf = device.create_buffer(4 * n * 4, name="small")
    src = device.create_buffer(big * 4, name="big-src")
    dst = device.create_buffer(big * 4, name="big-dst")
    seg = (n * 4 + k.align - 1) // k.align * k.align
    r = [BufferRange(buf, i * seg, n * 4) for i in range(3)]
    inc = k.pipelines["inc"]
    ds = [Dispatch(inc, (r[0], r[1]), (n // 64, 1, 1), "first", (R, W)),
          Dispatch(inc, (r[1], r[2]), (n // 64, 1, 1), "second", (R, W)),
          Dispatch(inc, (BufferRange(src), BufferRange(dst)), (big // 64, 1, 1), "long", (R, W))]
    rec = Recorder(device).record(ds, timestamps=True)
    try:
        assert rec.order == (0, 2, 1) and rec.barrier_before == (False, True, False)
        rec.submit()
        times = rec.dispatch_times_ns()
        assert times is not None and len(times) == 3
        assert int(np.argmax(times)) == 2, times
        assert sum(times) == pytest.approx(rec.gpu_time_ns())
    finally:
        rec.destroy()
        for b in (buf, src, dst):
            b.destroy()


def test_program_order_is_a_setting() -> None:
    assert Config.from_env({}).program_order is False
    assert Config.from_env({"POOTVK_PROGRAM_ORDER": "1"}).program_order is True


def test_llama_logits_do_not_depend_on_the_order(device, monkeypatch) -> None:
    """A 2-layer Llama's decode and 16-row prefill graphs are recorded in level order (which
    differs from the plan's order: planned ungrouped, in the graph's order) and again in the
    plan's order: same logits, bit for bit, with no more barriers in level order."""
    cfg = LlamaConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, hidden=64,
                      intermediate=96, vocab=80, capacity=32, weight_dtype="float16",
                      tied_embeddings=True)
    prompt, steps = [5, 17, 3, 60, 2], [7, 11, 0]
    runs = []
    monkeypatch.setattr(device, "config", replace(device.config, group_kernels=False))
    with LlamaModel(cfg, random_weights(cfg, seed=4), device) as m:
        for program_order in (False, True):
            progs = (m.program, m.prefill_program(16))
            for p in progs:
                p.rerecord(program_order)
                rec = p._replay.recording
                assert rec.program_order is program_order
                runs.append((rec.order, p.barriers))
            m.reset()
            out = [m.prefill(prompt)] + [m.step(t) for t in steps]
            runs.append(out)
    (dec_lv, pre_lv, out_lv), (dec_p, pre_p, out_p) = runs[:3], runs[3:]
    # the reordering is exercised (the decode graph's order may already be level order)
    assert pre_lv[0] != tuple(range(len(pre_lv[0])))
    assert dec_p[0] == tuple(range(len(dec_p[0])))
    assert dec_lv[1] <= dec_p[1] and pre_lv[1] <= pre_p[1]
    for a, b in zip(out_lv, out_p, strict=True):
        np.testing.assert_array_equal(a, b)
