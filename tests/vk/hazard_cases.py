"""Barrier-placement and reordering cases for the recorder, shared by the in-process tests
and a run under the validation layer's synchronization validation (``python -m
tests.vk.hazard_cases``).

Every case is a short list of elementwise dispatches over ranges of two buffers, with the
order the recorder must record them in (level order) and the barriers it must place. The
expected numbers come from running the same dispatches one after another in numpy, in the
order given: what barriers and reordering must preserve, whatever the device overlaps.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import Access, BufferRange, Device, Dispatch, Recording

INC = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) writeonly buffer Y { float y[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < y.length()) y[i] = x[i] + 1.0;
}
"""
ADD = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };
layout(set = 0, binding = 2) writeonly buffer C { float c[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < c.length()) c[i] = a[i] + b[i];
}
"""
N = 256  # floats per range; a segment holds two ranges so shifted ranges stay inside it
SEGMENTS = 6
R, W = Access.READ, Access.WRITE

#: A range: (buffer "p" or "q", segment, shift in units of minStorageBufferOffsetAlignment).
Ref = tuple[str, int, int]


@dataclass(frozen=True)
class Op:
    kernel: str  # "inc" (y = x + 1) or "add" (c = a + b)
    operands: tuple[Ref, ...]  # inputs, then the output
    declared: bool = True  # False: leave Dispatch.access unset (every binding READ_WRITE)


@dataclass(frozen=True)
class Case:
    name: str
    ops: tuple[Op, ...]
    barriers: tuple[bool, ...]  # expected Recording.barrier_before
    hazard: str = ""  # the sync-validation hazard when the barriers are left out
    #: False where the layer does not report ``hazard`` (seen with VVL 1.3.239: no WAW
    #: between two compute dispatches writing one storage buffer without a barrier).
    layer_reports: bool = True
    #: The recorded order (``Recording.order``); None: the order given.
    order: tuple[int, ...] | None = None
    #: Barriers the order given would need; None: as many as the recorded order.
    program_barriers: int | None = None


def inc(src: Ref, dst: Ref, declared: bool = True) -> Op:
    return Op("inc", (src, dst), declared)


def add(a: Ref, b: Ref, dst: Ref, declared: bool = True) -> Op:
    return Op("add", (a, b, dst), declared)


def p(seg: int, shift: int = 0) -> Ref:
    return ("p", seg, shift)


def q(seg: int, shift: int = 0) -> Ref:
    return ("q", seg, shift)


CASES = (
    Case("independent buffers", (inc(p(0), p(1)), inc(q(0), q(1))), (False, False)),
    Case("disjoint ranges of one buffer", (inc(p(0), p(1)), inc(p(2), p(3))), (False, False)),
    Case("read after read", (add(p(0), p(1), p(2)), add(p(1), p(0), p(3))), (False, False)),
    Case("RAW", (inc(p(0), p(1)), inc(p(1), p(2))), (False, True),
         "SYNC-HAZARD-READ-AFTER-WRITE"),
    Case("RAW on overlapping sub-ranges", (inc(p(0), p(1)), inc(p(1, 1), p(2))),
         (False, True), "SYNC-HAZARD-READ-AFTER-WRITE"),
    Case("WAR", (inc(p(0), p(1)), inc(p(2), p(0))), (False, True),
         "SYNC-HAZARD-WRITE-AFTER-READ"),
    Case("WAW", (inc(p(0), p(2)), inc(p(1), p(2))), (False, True),
         "SYNC-HAZARD-WRITE-AFTER-WRITE", layer_reports=False),
    Case("RAW two dispatches back", (inc(p(0), p(1)), inc(q(0), q(1)), inc(p(1), p(2))),
         (False, False, True), "SYNC-HAZARD-READ-AFTER-WRITE"),
    # d2 reads what d0 wrote, and d1 reads p1 too: the barrier before d1 already ordered d0.
    Case("a barrier covers what came before it",
         (inc(p(0), p(1)), inc(p(1), p(2)), inc(p(1), p(3))), (False, True, False),
         "SYNC-HAZARD-READ-AFTER-WRITE"),
    Case("WAR across a barrier needs none",
         (inc(p(0), p(1)), inc(p(1), p(2)), inc(p(3), p(0))), (False, True, False),
         "SYNC-HAZARD-READ-AFTER-WRITE"),
    # Undeclared access: both dispatches might write p0 and p1, so the second waits.
    Case("undeclared access is conservative",
         (add(p(0), p(1), p(2), declared=False), add(p(1), p(0), p(3), declared=False)),
         (False, True)),
)

#: Cases where level order differs from the order given.
REORDER_CASES = (
    # Two chains interleaved link by link: the order given needs a barrier before each
    # second link (2); level order records both first links, then both second links (1).
    Case("independent chains interleave",
         (inc(p(0), p(1)), inc(p(1), p(2)), inc(q(0), q(1)), inc(q(1), q(2))),
         (False, True, False, False), "SYNC-HAZARD-READ-AFTER-WRITE",
         order=(0, 2, 1, 3), program_barriers=2),
    # The task's decode-step shape: qk | rope | v | k write | v write | attention.
    Case("decode step shape",
         (inc(p(0), p(1)), inc(p(1), p(2)), inc(q(0), q(1)), inc(p(2), p(3)), inc(q(1), q(2)),
          add(p(3), q(2), p(4))),
         (False, True, False, True, False, True), "SYNC-HAZARD-READ-AFTER-WRITE",
         order=(0, 2, 1, 4, 3, 5)),
    # An arena slot reused: d1 reads p0 (a value's bytes), d2 writes a new value there and
    # has no other hazard. Only WAR keeps d2 after d1; without it d2 would be level 0 and
    # run before its reader. d3 is independent and moves up.
    Case("WAR through reused bytes keeps the reader first",
         (inc(q(0), q(1)), add(q(1), p(0), p(2)), inc(q(2), p(0)), inc(q(4), q(5))),
         (False, True, True, False), "SYNC-HAZARD-READ-AFTER-WRITE", order=(0, 3, 1, 2)),
    # The same bytes (p1) hold two values in turn: the second writer (d2) waits for the
    # first value's writer (WAW) and reader (WAR); the second value's reader waits for it.
    Case("WAW and WAR through reused bytes",
         (inc(p(0), p(1)), inc(p(1), p(2)), inc(q(0), p(1)), inc(p(1), q(1)), inc(q(2), q(3))),
         (False, True, True, True, False), "SYNC-HAZARD-READ-AFTER-WRITE",
         order=(0, 4, 1, 2, 3)),
)
ALL_CASES = CASES + REORDER_CASES


def random_ops(rng: np.random.Generator, n: int) -> tuple[Op, ...]:
    """``n`` random inc/add ops over the two buffers' ranges (shifted ranges overlap their
    unshifted neighbours: partial hazards). An op's output never overlaps its own inputs
    (invocations of one dispatch would race), so a program's result is defined."""
    ops = []
    for _ in range(n):
        k = "add" if rng.random() < 0.5 else "inc"
        refs = [(str(rng.choice(["p", "q"])), int(rng.integers(SEGMENTS)), int(rng.integers(2)))
                for _ in range(3 if k == "add" else 2)]
        out = refs[-1]
        while any(r[:2] == out[:2] for r in refs[:-1]):
            out = (out[0], int(rng.integers(SEGMENTS)), out[2])
        ops.append(Op(k, (*refs[:-1], out)))
    return tuple(ops)


#: Random programs the synchronization-validation run records in level order.
RANDOM_PROGRAMS = 16


class Kernels:
    """The two pipelines and the range geometry on one device."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.pipelines = {
            "inc": device.compute_pipeline(compile_glsl(INC), 2),
            "add": device.compute_pipeline(compile_glsl(ADD), 3),
        }
        self.align = device.profile.min_storage_offset_alignment
        self.seg = (2 * N * 4 + self.align - 1) // self.align * self.align

    def offset(self, ref: Ref) -> int:
        return ref[1] * self.seg + ref[2] * self.align


def run_case(
    k: Kernels, case: Case, record: Callable[[list[Dispatch]], Recording]
) -> tuple[Recording, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Record and submit ``case`` on fresh buffers; return the recording, what the device
    computed and what running the ops in order gives (both as float32 per buffer)."""
    dev = k.device
    nfloat = SEGMENTS * k.seg // 4
    rng = np.random.default_rng(len(case.name))
    init = {b: rng.standard_normal(nfloat).astype(np.float32) for b in "pq"}
    bufs = {b: dev.create_buffer(nfloat * 4, name=b) for b in "pq"}
    try:
        for b, x in init.items():
            bufs[b].write(0, x)
        dispatches = [
            Dispatch(
                k.pipelines[op.kernel],
                tuple(BufferRange(bufs[r[0]], k.offset(r), N * 4) for r in op.operands),
                ((N + 63) // 64, 1, 1),
                f"{op.kernel}{i}",
                ((R,) * (len(op.operands) - 1) + (W,)) if op.declared else None,
            )
            for i, op in enumerate(case.ops)
        ]
        rec = record(dispatches)
        rec.submit()
        got = {b: bufs[b].read_array(0, nfloat, np.float32) for b in "pq"}
        rec.destroy()
    finally:
        for buf in bufs.values():
            buf.destroy()
    want = {b: x.copy() for b, x in init.items()}
    for op in case.ops:
        ins = [want[r[0]][k.offset(r) // 4 :][:N] for r in op.operands[:-1]]
        out = op.operands[-1]
        o = k.offset(out) // 4
        want[out[0]][o : o + N] = ins[0] + 1.0 if op.kernel == "inc" else ins[0] + ins[1]
    return rec, got, want


def main() -> None:
    """Run every case twice under synchronization validation, in level order: with the
    recorder's barriers (expect no message) and with every barrier left out (expect the
    case's hazard); then ``RANDOM_PROGRAMS`` seeded random programs with the recorder's
    barriers (expect no message, and the numbers of running them in the order given).
    Prints {"cases": {case name: [messages with barriers, messages without]}, "random":
    [[messages, results equal], ...]} as JSON."""
    import pootvk.vk.recorder as recorder
    from pootvk.vk import Recorder, clear_validation_messages, validation_messages

    placed = recorder.barriers_before
    cases: dict[str, Any] = {}
    random: list[Any] = []
    with Device() as dev:
        k = Kernels(dev)
        for case in ALL_CASES:
            runs = []
            for choose in (placed, lambda ds: (False,) * len(ds)):
                recorder.barriers_before = choose
                clear_validation_messages()
                run_case(k, case, Recorder(dev).record)
                runs.append(validation_messages())
            recorder.barriers_before = placed
            cases[case.name] = runs
        rng = np.random.default_rng(7)
        for i in range(RANDOM_PROGRAMS):
            case = Case(f"random {i}", random_ops(rng, int(rng.integers(4, 13))), ())
            clear_validation_messages()
            _, got, want = run_case(k, case, Recorder(dev).record)
            same = all(np.array_equal(got[b], want[b]) for b in want)
            random.append([validation_messages(), same])
    clear_validation_messages()
    json.dump({"cases": cases, "random": random}, sys.stdout)


if __name__ == "__main__":
    assert "SYNCHRONIZATION" in os.environ.get("VK_LAYER_ENABLES", ""), "run from the test"
    main()
