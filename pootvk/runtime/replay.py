"""Replay: a plan's buffers, pipelines and one recorded command buffer, run every step.

This is the runtime's per-step glue between a ``Plan`` and the ``vk`` layer (which knows
nothing of graphs or plans): it makes each planned buffer, tells the recorder which ranges
each dispatch reads and writes (from the request's bindings), and binds values to slots.

``Replay.step`` checks every bound value against its slot before anything is written
(typed errors name the slot; nothing is written or published on a refusal), writes the
step's inputs into their mapped buffers, submits the one recording, waits on its fence and
only then reads the outputs. Validation witnesses (index guards' I32 [2]: offending count,
one offending value) are zeroed before every submit and read first after it: a nonzero
count raises GuardFailed and nothing is returned (the graph's state writes were gated on
the same witnesses, ``passes.ranges.gate_state_writes``, so the state is unchanged).
Per-step values (the position, new k/v) live in bound
buffers, so the recording made at construction is valid for every step: ``recordings``
stays 1.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import BindError, Closed, GuardFailed
from ..ir import DType, SlotKind
from ..ir.bind import check_bind
from ..ir.dtypes import device_bytes, device_numpy, from_device
from ..ir.prims import INDEX_GUARD
from ..ir.slotmap import ForwardSlotMap, write_map_pool
from ..plan import BufferRole, Location, Plan
from ..vk import Buffer, BufferRange, Device, Dispatch, Recorder, Recording, Timestamps

#: integer scalars a ranged scalar slot (a position) takes on the fast path, range-checked
#: as they are (bool is not among them: check_bind refuses it)
_SCALAR_INTS = frozenset({int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                          np.uint32, np.uint64})


def _require_open(res: _Resources, name: str) -> None:
    """Closed unless the replay (its resources ``res``), every replay it borrows buffers
    from and its device are open."""
    if res.recording is None:
        raise Closed(f"replay {name!r}")
    for lender in res.lenders:  # its buffers are bound here
        if lender.closed:
            raise Closed(f"replay {lender.name!r} (this replay shares its buffers)")
    res.device._require_open()


def _lean_step(fast: list[tuple] | None, outs: list[tuple], lock: Any, res: _Resources,
               name: str) -> Callable[[Mapping[str, object]], dict[str, np.ndarray] | None] | None:
    """``Replay.step``'s common case as one straight-line function made for this plan, or
    None where the plan has no such case.

    Why: the step's Python glue is part of issue 7's host overhead (step wall - GPU time
    against an empty submit), and CPython runs a function of constants and locals faster
    than a loop over slot tuples (Replay.step 3.95 -> 3.18 us on the development machine, submit
    stubbed out). The function takes only what needs no conversion and no typed error:
    every per-step slot given, arrays of the slot's exact type, dtype and shape, and an
    int for a ranged scalar (a position) inside its range. Anything else returns None
    before a byte is written, and ``step`` goes the general way, which converts or raises.
    No function is made where the step has witnesses, write maps, ranged arrays or outputs
    that need converting or are not mapped: those keep the general path.

    The function holds the replay's resources and lock, never the Replay (its finalizer
    frees the resources when the Replay goes)."""
    if fast is None or any(w or (rng is not None and shape) for _n, shape, _d, rng, _v, w in fast):
        return None
    if any(witness or not plain for _n, _v, _l, _view, witness, plain in outs):
        return None
    env: dict[str, Any] = {"ndarray": np.ndarray, "INTS": _SCALAR_INTS, "lock": lock,
                           "res": res, "require_open": _require_open, "NAME": name}
    check, write = [], []
    for i, (slot, shape, dtype, rng, view, _w) in enumerate(fast):
        env[f"v{i}"], env[f"dt{i}"], env[f"sh{i}"] = view, dtype, shape
        check.append(f"    a{i} = get({slot!r})")
        if rng is None:
            check.append(f"    if type(a{i}) is not ndarray or a{i}.dtype != dt{i} "
                         f"or a{i}.shape != sh{i}: return None")
        else:
            check.append(f"    if type(a{i}) not in INTS or not {int(rng[0])} <= a{i} "
                         f"<= {int(rng[1])}: return None")
        write.append(f"        v{i}[...] = a{i}")
    ret = []
    for j, (out, _v, _loc, view, _w, _p) in enumerate(outs):
        env[f"o{j}"] = view
        ret.append(f"{out!r}: o{j}.copy()")
    src = "\n".join([
        "def lean_step(values):",
        f"    if len(values) != {len(fast)}: return None",
        "    get = values.get",
        *check,
        "    with lock:",
        "        rec = res.recording",
        "        if rec is None or res.lenders or res.device.handle is None:",
        "            require_open(res, NAME)",
        *write,
        "        rec.submit(True)",
        "        return {" + ", ".join(ret) + "}",
    ])
    exec(compile(src, f"<lean step of {name}>", "exec"), env)  # noqa: S102  # our own source
    return env["lean_step"]


class _Resources:
    """What a Replay owns on its Device, freed by ``close`` or by the Replay's finalizer
    (which must not refer to the Replay itself, or it would never be collected)."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.buffers: dict[str, Buffer] = {}  # what kernels bind
        self.borrowed: set[str] = set()  # buffers another Replay owns (never freed here)
        self.lenders: list[Replay] = []  # kept alive while this one borrows from them
        self.staging: dict[str, Buffer] = {}  # host-side copies of per-step inputs
        self.pipelines: list[Any] = []  # held in the Device's pipeline cache
        self.recording: Recording | None = None

    def free(self) -> None:
        if self.recording is not None:
            self.recording.destroy()
            self.recording = None
        for name, b in self.buffers.items():
            if name not in self.borrowed:
                b.destroy()
        for b in self.staging.values():
            b.destroy()
        self.buffers.clear()
        self.lenders.clear()
        self.staging.clear()
        pipes, self.pipelines = self.pipelines, []
        if not self.device.closed:
            for p in pipes:
                self.device.release_pipeline(p)


class Replay:
    """One plan made runnable. Safe to share between threads: ``step`` and the other
    methods run one caller at a time (a lock per Replay); ``close`` (or garbage
    collection) frees its buffers and recording; use after close raises Closed."""

    def __init__(
        self, device: Device, plan: Plan, spirv: list[bytes], *, timestamps: Timestamps = False,
        share: Replay | None = None, program_order: bool | None = None,
    ) -> None:
        self.device, self.plan = device, plan
        self._res = _Resources(device)
        self._finalizer = weakref.finalize(self, self._res.free)
        self._lock = threading.RLock()
        self.buffers = self._res.buffers
        self.staging = self._res.staging
        self.recordings = 0
        self.name = "+".join(k.label for k in plan.kernels) or "replay"
        try:
            lent = self._borrow(share) if share is not None else {}
            uploads = []
            for spec in plan.buffers.values():
                n = max(spec.nbytes, 4)
                if spec.name in lent:
                    self.buffers[spec.name] = lent[spec.name]
                    continue
                # Exports are read back by the host: host memory, written once per step.
                # Everything kernels read lives in device memory; a per-step input whose
                # device memory is not mappable (a discrete GPU without ReBAR) is written to
                # a host staging buffer and copied by the recording itself.
                buf = device.create_buffer(n, host_visible=spec.role.host_reads,
                                           name=spec.name)
                self.buffers[spec.name] = buf
                if spec.role.host_writes_per_step and not buf.mapped:
                    self.staging[spec.name] = device.create_buffer(
                        n, host_visible=True, name=f"{spec.name}:staging"
                    )
                    uploads.append((self.staging[spec.name], buf, n))
            for spec in plan.buffers.values():
                if spec.name in lent:  # the lender's value stands
                    continue
                if spec.role in (BufferRole.STATE, BufferRole.SCRATCH):  # start zeroed
                    self.buffers[spec.name].zero()
            for name, value in plan.graph.constants.items():  # folded constants, once
                self._write_slot(name, value)
            dispatches = []
            for k, spv in zip(plan.kernels, spirv, strict=True):
                push = k.request.push_constants()
                pipe = device.compute_pipeline(spv, len(k.bindings), len(push), hold=True)
                self._res.pipelines.append(pipe)
                binds = tuple(
                    BufferRange(self.buffers[b.location.buffer], b.location.offset,
                                max(b.location.nbytes, 4))
                    for b in k.bindings
                )
                access = tuple(b.binding.access for b in k.bindings)  # barriers on hazards
                dispatches.append(
                    Dispatch(pipe, binds, (*k.request.grid, 1), k.label, access=access,
                             push=push)
                )
            self._res.recording = Recorder(device).record(
                dispatches, timestamps=timestamps, uploads=uploads, program_order=program_order
            )
            self.recordings += 1
        except BaseException:
            self.close()
            raise
        self._per_step = {s.name for s in plan.graph.slots if s.kind.per_step and s.kind.bound}
        self._params = {s.name for s in plan.graph.slots if s.kind is SlotKind.PARAM}
        self._fast_in = self._fast_inputs()
        self._outs = self._output_reads()
        self._guards = self._guard_ranges()
        self._lean = _lean_step(self._fast_in, self._outs, self._lock, self._res, self.name)

    def _borrow(self, lender: Replay) -> dict[str, Buffer]:
        """The lender's param and state buffers that this plan has too (same slot name,
        dtype and shape): bound here as they are, so both recordings read and update the
        same bytes (a prefill graph writes the KV cache a decode graph then reads; the
        weights are uploaded once). The lender is kept alive while this Replay lives."""
        lender._require_open()
        if lender.device is not self.device:
            raise BindError("share", self.device.name, lender.device.name, "device")
        mine = {s.name: s for s in self.plan.graph.slots
                if s.kind in (SlotKind.PARAM, SlotKind.STATE)}
        lent: dict[str, Buffer] = {}
        for s in lender.plan.graph.slots:
            m = mine.get(s.name)
            if m is None or m.kind is not s.kind:
                continue
            if (m.var.shape, m.var.dtype) != (s.var.shape, s.var.dtype):
                raise BindError(s.name, m.var.aval(), s.var.aval(), "shared slot")
            key = lender.plan.locations[s.var].buffer
            lent[self.plan.locations[m.var].buffer] = lender.buffers[key]
            self._res.borrowed.add(self.plan.locations[m.var].buffer)
        self._res.lenders.append(lender)
        return lent

    def _fast_inputs(self) -> list[tuple] | None:
        """Per-step slots as typed views of mapped memory, built once: a step whose values
        already have the slots' exact dtypes and shapes is checked and written through them
        (no per-step lookups, allocations or byte casts); anything else goes through
        ``check_bind``, which converts or refuses with a typed error. None when a slot is
        not mapped or is stored unlike the caller's arrays (BF16, Bool)."""
        ins = []
        for s in self.plan.graph.slots:
            if s.name not in self._per_step:
                continue
            view = self._slot_buffer(s.name).view(0, s.var.shape, device_numpy(s.var.dtype))
            if view is None or s.var.dtype.numpy != device_numpy(s.var.dtype):
                return None
            ins.append((s.name, s.var.shape, view.dtype, s.range, view,
                        s.kind is SlotKind.WRITEMAP))
        return ins

    def _output_reads(self) -> list[tuple]:
        """What a step reads back, witnesses first (checked before anything is published):
        (name, var, location, typed view of mapped memory or None, is_witness, plain: the
        view's copy is the value as it is, no ``from_device`` conversion)."""
        g = self.plan.graph
        reads = []
        for names, witness in ((g.validations, True), (g.exports, False)):
            for name, v in names.items():
                loc = self.plan.outputs[name]
                view = self.buffers[loc.buffer].view(loc.offset, v.shape, device_numpy(v.dtype))
                plain = view is not None and v.dtype not in (DType.BOOL, DType.BF16)
                reads.append((name, v, loc, view, witness, plain))
        return reads

    def _guard_ranges(self) -> dict[str, tuple[int, int] | None]:
        """Each witness's guard range [lo, hi], for GuardFailed's message."""
        g = self.plan.graph
        prod = {o: e for e in g.eqns for o in e.outputs}
        out: dict[str, tuple[int, int] | None] = {}
        for name, v in g.validations.items():
            e = prod.get(v)
            guard = e is not None and e.prim is INDEX_GUARD
            out[name] = (e.params["lo"], e.params["hi"]) if guard else None  # type: ignore[union-attr]
        return out

    def _clear_witnesses(self) -> None:
        for _name, v, loc, view, witness, _plain in self._outs:
            if not witness:
                continue
            if view is not None:
                view[...] = 0
            else:
                self.buffers[loc.buffer].write(loc.offset, np.zeros(v.shape, np.int32))

    def _fast_bind(self, values: Mapping[str, object]) -> list[tuple] | None:
        """The (view, array) writes of a step that needs no conversion, all checked before
        any is made; None sends the step through ``check_bind``. A Python or NumPy integer for
        a ranged scalar slot (a position) is range-checked as it is, with no array made:
        this runs every step, and its host time is part of issue 7's step overhead."""
        fast = self._fast_in
        if fast is None or len(values) != len(fast):
            return None
        writes = []
        for name, shape, dtype, rng, view, write_map in fast:
            a = values.get(name)
            if rng is not None and not shape and type(a) in _SCALAR_INTS:
                if not rng[0] <= a <= rng[1]:  # type: ignore[operator]  # a position, as is
                    return None  # check_bind raises the typed error
            else:
                if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape:  # type: ignore[union-attr]
                    if rng is None or a is None or not isinstance(a, (int, np.integer)) \
                            or isinstance(a, bool):
                        return None
                    a = np.asarray(a)
                    if a.dtype != dtype and not np.issubdtype(a.dtype, np.integer):
                        return None
                if rng is not None and a.size and not (  # type: ignore[union-attr]
                    rng[0] <= a.item() <= rng[1] if a.size == 1  # type: ignore[union-attr]
                    else rng[0] <= int(a.min()) and int(a.max()) <= rng[1]  # type: ignore[union-attr]
                ):  # a ranged slot may be an array (token ids), not only a scalar position
                    return None  # check_bind raises the typed error
            if write_map:  # a pool slot named twice: WriteMapError, before any write
                ForwardSlotMap(a, write_map_pool(name, rng), name)
            writes.append((view, a))
        return writes

    @property
    def recording(self) -> Recording | None:
        return self._res.recording

    @property
    def closed(self) -> bool:
        return self._res.recording is None

    def _require_open(self) -> None:
        _require_open(self._res, self.name)

    # --- binding -------------------------------------------------------------------------------
    def _slot_buffer(self, name: str) -> Buffer:
        """Where the host writes a slot's value (its staging buffer when it has one)."""
        key = self.plan.locations[self.plan.graph.slot(name).var].buffer
        return self.staging.get(key) or self.buffers[key]

    def set_params(self, values: Mapping[str, object]) -> None:
        """Write weights (PARAM slots); checked in full before the first byte is written."""
        bad = set(values) - self._params
        if bad:
            raise BindError(sorted(bad)[0], sorted(self._params), "not a param", "param name")
        checked = check_bind(self.plan.graph, values, only=set(values))
        with self._lock:
            self._require_open()
            for name, arr in checked.items():
                self._write_slot(name, arr)

    def set_state(self, name: str, value: object) -> None:
        s = self.plan.graph.slot(name)
        if s.kind is not SlotKind.STATE:
            raise BindError(name, "a state slot", s.kind.value, "slot kind")
        arr = check_bind(self.plan.graph, {name: value}, only={name})[name]
        with self._lock:
            self._require_open()
            self._write_slot(name, arr)

    def _write_slot(self, name: str, arr: np.ndarray) -> None:
        """A checked slot value into its buffer, as the device stores it (Bool a 32-bit
        word, BF16 its 16 bits)."""
        self._slot_buffer(name).write(0, device_bytes(arr, self.plan.graph.slot(name).var.dtype))

    def read_state(self, name: str) -> np.ndarray:
        s = self.plan.graph.slot(name)
        with self._lock:
            self._require_open()
            return self._read(self.plan.locations[s.var], s.var.shape, s.var.dtype)

    def _read(self, loc: Location, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        raw = self.buffers[loc.buffer].read_array(loc.offset, shape, device_numpy(dtype))
        return from_device(raw, dtype)

    # --- one step --------------------------------------------------------------------------
    def step(self, values: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Bind per-step slots (and any params given), run the recording, return exports."""
        if self._lean is not None:
            out = self._lean(values)
            if out is not None:
                return out
        fast = self._fast_bind(values)
        if fast is None:
            names = self._per_step | (set(values) & self._params)
            checked = check_bind(self.plan.graph, values, only=names)
        with self._lock:  # bind + submit + read: one caller at a time
            self._require_open()
            if fast is not None:
                for view, a in fast:
                    view[...] = a
            else:
                for name, arr in checked.items():
                    self._write_slot(name, arr)
            rec = self._res.recording
            assert rec is not None
            self._clear_witnesses()
            rec.submit(wait=True)
            out = {}
            for name, v, loc, view, witness, plain in self._outs:
                val = (view.copy() if plain
                       else from_device(view.copy(), v.dtype) if view is not None
                       else self._read(loc, v.shape, v.dtype))
                if not witness:
                    out[name] = val
                elif val.reshape(-1)[0]:
                    w = val.reshape(-1)  # [count, value] (an IndexGuard's), else [flag]
                    lo, hi = self._guards[name] or (None, None)
                    raise GuardFailed(name, int(w[-1]), int(w[0]), lo, hi)
            return out

    def rerecord(self, program_order: bool | None = None) -> None:
        """Record the command buffer again from the same dispatches and drop the old one:
        what a runtime that records every step pays (descriptor sets, command buffer). Only
        the benchmarks call it, as the baseline replay is measured against, or with
        ``program_order`` (None: as before) to time the plan's order against level order
        (``Recording.order``) in one run."""
        with self._lock:
            self._require_open()
            old = self._res.recording
            assert old is not None
            keep = old.program_order if program_order is None else program_order
            self._res.recording = Recorder(self.device).record(
                old.dispatches, timestamps=old.timestamps, uploads=old.uploads,
                program_order=keep,
            )
            old.destroy()
            self.recordings += 1

    @property
    def barriers(self) -> int:
        """Compute->compute barriers recorded between this step's dispatches."""
        rec = self._res.recording
        return rec.barriers if rec is not None else 0

    def gpu_time_ns(self) -> float | None:
        with self._lock:
            rec = self._res.recording
            return rec.gpu_time_ns() if rec else None

    def dispatch_times_ns(self) -> list[tuple[str, float]] | None:
        """(kernel label, device ns) of every dispatch of the last step, in the plan's
        kernel order whatever order they were recorded in (None without timestamps): where
        a step's GPU time goes, kernel by kernel."""
        with self._lock:
            rec = self._res.recording
            times = rec.dispatch_times_ns() if rec else None
            if times is None:
                return None
            return [(d.label, t) for d, t in zip(rec.dispatches, times, strict=False)]

    def close(self) -> None:
        """Free the buffers, the recording and the held pipelines (idempotent); waits for
        a caller that is mid-step."""
        with self._lock:
            self._finalizer()

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
