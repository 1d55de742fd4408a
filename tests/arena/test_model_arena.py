"""The coloured arena at model scale (issue 9): one Llama-shaped model planned with 2, 8 and
32 layers has one arena peak (only weights and KV state grow with depth), and an interval
check written here from the plan's kernels and the graph's eqns (not the arena's liveness
code) finds no two values alive at once sharing a byte."""

from __future__ import annotations

import numpy as np
import pytest

from pootvk.llm import LlamaConfig, trace_llama
from pootvk.passes import compile_graph
from pootvk.plan import BufferRole, plan_graph, recorded_profile


def plan_layers(n: int, profile: str = "lavapipe"):
    return plan_graph(compile_graph(trace_llama(LlamaConfig(layers=n))), recorded_profile(profile))


def arena_intervals(plan):
    """(buffer, first kernel, last kernel, byte lo, byte hi, what) of every value and
    scratch in an arena buffer. A value lives from the first kernel of the eqn producing it
    to the last kernel of the last eqn reading it; an eqn that runs no kernel (a view) makes
    its output an alias of its operand's bytes, so a read of the alias is a read of its
    root. A scratch lives over the kernels of its eqn."""
    kernels_of: dict[int, list[int]] = {}
    for k, kern in enumerate(plan.kernels):
        kernels_of.setdefault(kern.eqn, []).append(k)
    root: dict[int, int] = {}  # id(alias) -> id(root value)
    produced, last_read = {}, {}
    for i, e in enumerate(plan.graph.eqns):
        if i not in kernels_of:  # no kernel: a view of its operand (or dead code)
            for o in e.outputs:
                if e.inputs:
                    root[id(o)] = root.get(id(e.inputs[0]), id(e.inputs[0]))
            continue
        for v in e.inputs:
            last_read[root.get(id(v), id(v))] = i
        for o in e.outputs:
            produced[id(o)] = (i, o)
    observed = {id(v) for v in plan.graph.outputs().values()}
    rows = []
    for vid, (i, v) in produced.items():
        loc = plan.locations.get(v)
        if loc is None or not loc.buffer.startswith("arena"):
            continue
        assert vid not in observed  # exports and states have their own buffers
        first = kernels_of[i][0]
        last = max(kernels_of[last_read.get(vid, i)][-1], first)
        rows.append((loc.buffer, first, last, loc.offset, loc.offset + loc.nbytes, f"eqn{i}"))
    scratch = {}  # one row per (eqn, location): a split launch's partial and combine
    for k, kern in enumerate(plan.kernels):  # kernels bind the same scratch
        for b in kern.bindings:
            if b.role is BufferRole.SCRATCH and b.location.buffer.startswith("arena"):
                ks = kernels_of[kern.eqn]
                loc = (b.location.buffer, b.location.offset, b.location.nbytes)
                scratch.setdefault((kern.eqn, loc), (
                    b.location.buffer, ks[0], ks[-1], b.location.offset,
                    b.location.offset + b.location.nbytes, f"scratch k{k}"))
    return rows + list(scratch.values())


def assert_no_live_overlap(plan) -> int:
    rows = arena_intervals(plan)
    checked = 0
    for buf in {r[0] for r in rows}:
        rs = [r for r in rows if r[0] == buf]
        first, last, lo, hi = (np.array([r[j] for r in rs]) for j in (1, 2, 3, 4))
        for i in range(len(rs)):
            live = (first <= last[i]) & (first[i] <= last)
            share = (lo < hi[i]) & (lo[i] < hi)
            clash = np.flatnonzero(live & share)
            clash = clash[clash != i]
            assert clash.size == 0, (rs[i], rs[int(clash[0])])
            checked += int(live.sum()) - 1
        assert max(r[4] for r in rs) <= plan.buffers[buf].nbytes
    return checked


@pytest.mark.parametrize("profile", ["lavapipe", "nvidia_h200", "mobile_16k"])
def test_arena_peak_does_not_grow_with_depth(profile):
    plans = {n: plan_layers(n, profile) for n in (2, 8, 32)}
    peaks = {n: p.arena.peak_bytes for n, p in plans.items()}
    assert peaks[2] == peaks[8] == peaks[32], peaks
    saved = [plans[n].arena_saved_bytes for n in (2, 8, 32)]
    assert saved[0] < saved[1] < saved[2]  # the intermediates grow, the arena does not
    assert plans[32].arena_value_bytes > 8 * plans[2].arena_value_bytes > 8 * peaks[2]
    for n, p in plans.items():
        assert [k.label for k in p.kernels].count("attention") == n  # every layer planned
        assert assert_no_live_overlap(p) > 0  # live pairs existed and none shared bytes
    assert f"colouring saves {saved[2]} bytes" in str(plans[32])


def test_interval_check_catches_a_clash():
    """The check can fail: two live values moved onto the same bytes are reported."""
    plan = plan_layers(2)
    rows = arena_intervals(plan)
    a = next(r for r in rows if r[2] > r[1])  # a value alive over several kernels
    b = next(r for r in rows if r is not a and r[0] == a[0] and r[1] <= a[2] and a[1] <= r[2]
             and not (r[3] < a[4] and a[3] < r[4]))
    victim = next(v for v, loc in plan.locations.items()
                  if loc.buffer == b[0] and loc.offset == b[3] and f"eqn{_eqn(plan, v)}" == b[5])
    plan.locations[victim] = type(plan.locations[victim])(a[0], a[3], plan.locations[victim].nbytes)
    with pytest.raises(AssertionError):
        assert_no_live_overlap(plan)


def _eqn(plan, v) -> int:
    return next(i for i, e in enumerate(plan.graph.eqns) if any(o is v for o in e.outputs))
