"""``pootvk.compile(graph) -> Program``: a user's traced graph, recorded once, run per call.

A Program owns one Replay (compiled, planned, generated, recorded at construction). A call
binds its keyword arrays by slot kind: params (weights) are written once and stay on the
device until given again; states are donated: the device holds them between calls, each
call updates them in place, and a state given as a keyword replaces the held value; every
per-step slot (inputs, positions, token ids) must be given on every call. It returns the
graph's exports as numpy arrays. Nothing is re-recorded between calls.

Two Programs may share weights and state: ``Program(g2, share=p1)`` binds p1's buffers for
every param and state slot g2 declares with the same name, shape and dtype (a model's
prefill and decode graphs: one copy of the weights, one KV cache both update in place).
Params p1 has written count as written in p2; p1 must stay open while p2 is used (a call
on p2 after ``p1.close()`` raises Closed).
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import BindError, Closed
from ..ir import Graph, SlotKind
from ..ir.bind import check_bind
from ..plan import Plan
from ..vk import Device, Timestamps
from . import build_replay, resolve_device


class Program:
    """A compiled graph on one device. Call it with keyword arrays; close it (or use it as a
    context manager) to free its buffers; the garbage collector frees it otherwise. Calls
    from several threads run one at a time (a call's binds and its step are not split)."""

    def __init__(self, graph: Graph, device: Device | int | str | None = None, *,
                 timestamps: Timestamps = False, share: Program | None = None) -> None:
        self.graph = graph
        self.device = share.device if share is not None and device is None \
            else resolve_device(device)
        self._replay = build_replay(graph, self.device, timestamps=timestamps,
                                    share=None if share is None else share._replay)
        kinds = {s.name: s.kind for s in graph.slots if s.kind.bound}
        self._params = {n for n, k in kinds.items() if k is SlotKind.PARAM}
        self._states = {n for n, k in kinds.items() if k is SlotKind.STATE}
        self._per_step = {n for n, k in kinds.items() if k.per_step}
        self._unset = set(self._params)  # params not bound yet
        if share is not None:  # what the lender has written is written here too
            self._unset -= (self._params & share._params) - share._unset
        self._lock = threading.Lock()  # a call's binds and its step, one caller at a time

    @property
    def plan(self) -> Plan:
        """The plan: ``print(program.plan)`` lists every kernel, buffer and arena slot."""
        return self._replay.plan

    @property
    def recordings(self) -> int:
        """Command-buffer recordings made (1: recorded once, replayed every call)."""
        return self._replay.recordings

    @property
    def closed(self) -> bool:
        return self._replay.closed

    def __call__(self, **inputs: object) -> dict[str, np.ndarray]:
        """Bind ``inputs`` (params and states optional, per-step slots required), run the
        recording once, return the exports. A refused value raises a typed error before
        anything is written."""
        with self._lock:
            return self._call(inputs)

    def _call(self, inputs: dict[str, object]) -> dict[str, np.ndarray]:
        if self._replay.closed:
            raise Closed("Program")
        unknown = set(inputs) - self._params - self._states - self._per_step
        if unknown:
            name = sorted(unknown)[0]
            raise BindError(name, sorted(self._params | self._states | self._per_step), name,
                            "slot name (one of)")
        missing = (self._unset - set(inputs)) | (self._per_step - set(inputs))
        if missing:
            name = sorted(missing)[0]
            raise BindError(name, self.graph.slot(name).var.aval(), "nothing", "a value of")
        params = {n: inputs[n] for n in self._params & set(inputs)}
        states = self._states & set(inputs)
        if params or states:  # everything checked before the first byte is written
            check_bind(self.graph, inputs, only=set(inputs))
        if params:
            self._replay.set_params(params)
            self._unset -= set(params)
        for n in states:
            self._replay.set_state(n, inputs[n])
        return self._replay.step({n: inputs[n] for n in self._per_step})

    def set_params(self, **params: object) -> None:
        """Write weights without running (a call may also pass them)."""
        with self._lock:
            self._replay.set_params(params)
            self._unset -= set(params)

    def set_state(self, name: str, value: object) -> None:
        """Replace a state's value on the device (a new sequence: zeroed caches)."""
        self._replay.set_state(name, value)

    def state(self, name: str) -> np.ndarray:
        """A state's current value, read back from the device."""
        return self._replay.read_state(name)

    def gpu_time_ns(self) -> float | None:
        """GPU time of the last call (``timestamps=True`` or ``"bounds"``: the latter
        brackets the whole step only, so it is the step's time as it runs untimed)."""
        return self._replay.gpu_time_ns()

    def dispatch_times_ns(self) -> list[tuple[str, float]] | None:
        """(kernel label, device ns) of every dispatch of the last call (``timestamps=True``)."""
        return self._replay.dispatch_times_ns()

    def rerecord(self, program_order: bool | None = None) -> None:
        """Record the command buffer again (the benchmark's record-every-step baseline);
        ``program_order`` True/False switches to the plan's order / level order."""
        self._replay.rerecord(program_order)

    @property
    def barriers(self) -> int:
        """Compute->compute barriers recorded between one call's dispatches."""
        return self._replay.barriers

    def close(self) -> None:
        self._replay.close()

    def __enter__(self) -> Program:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def compile_program(graph: Graph, device: Device | int | str | None = None, *,
                    timestamps: Timestamps = False, share: Program | None = None) -> Program:
    """Compile, plan and record ``graph`` for ``device`` (None: the default device, or
    ``share``'s); exported as ``pootvk.compile``. ``share``: bind that Program's param and
    state buffers (see the module docstring)."""
    return Program(graph, device, timestamps=timestamps, share=share)
