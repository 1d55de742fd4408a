"""Decode-attention benchmark: K/V bytes read per second as a fraction of the device's ceiling.

Everything is measured in one run on one device (issue 7 items 5 and 7):

- the streaming-read ceiling (:func:`read_ceiling`: a plain read kernel over random words);
- pootvk: for each shape and K/V dtype, ``pootvk.attention`` (the public path) runs once and
  its output is checked against a float64 numpy reference; the plan it made is then replayed
  (its recorded kernels, K/V resident on the device) with timestamps: attention GPU time
  with the output in device memory as torch's (that copy's output checked too), K/V GB/s
  and fraction of the ceiling from it, the same time with the output the plan's export in
  host memory (``export us``), the wall time of one submit+wait, and the schedule and
  split count the planner chose. A dtype the public path refuses is reported ``n/a``;
- host overhead of a replayed decode step (``Replay.step`` of a traced decode step, K/V in
  state) against the bare submit+wait of an empty recorded command buffer, with a profile;
- torch ``scaled_dot_product_attention`` (CUDA graph, CUDA events) where torch sees CUDA;
- llama.cpp's Vulkan flash attention (``.gpu/peer-fa perf``, both of its paths) where present.

Method: every shape runs back to back for ``warm_s`` seconds before it is timed (a GPU idles
at a low clock and needs load to clock up), the median of ``reps`` replays is reported, each
replay ``calls`` launches back to back timed per launch (pootvk's recorded behind their
barriers, torch's captured in one CUDA graph: a launch's start is hidden alike; both timed
first to last, no timestamp between launches where the plan is all attention), the
SM clock is logged through NVML where ``pynvml`` imports. Tables never show a time without a
ratio beside it. The GPU-only series each sit in their own try/except: one failure prints one
line and loses nothing else.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import PootvkError
from .shaders.compiler import compile_glsl
from .shaders.readbw import READ_WG, generate_read
from .vk import BufferRange, Device, Dispatch, Recorder

Shape = tuple[int, int, int, int, int]  # B, Hq, Hkv, Lk, D

#: issue 7's shapes (B, Hq, Hkv, Lk, D), Lq = 1. llama.cpp's perf list has the first six.
GPU_SHAPES: list[Shape] = [(1, 32, 8, 4096, 128), (1, 32, 8, 32768, 128),
                           (1, 32, 8, 131072, 128), (8, 32, 8, 8192, 128),
                           (1, 32, 32, 32768, 128), (32, 32, 8, 2048, 128),
                           (1, 8, 1, 65536, 128)]
#: A CPU device (lavapipe): shapes its 128 MiB binding range and ~3 GB/s allow.
CPU_SHAPES: list[Shape] = [(1, 8, 8, 1024, 64), (1, 32, 8, 2048, 128), (4, 32, 8, 1024, 128),
                           (1, 8, 1, 8192, 64)]
#: ``--quick`` (CI on lavapipe, seconds).
QUICK_SHAPES: list[Shape] = [(1, 4, 2, 256, 32), (2, 8, 2, 512, 64)]
DTYPES = ("float32", "float16")
DTYPE_ALIASES = {"float32": "float32", "f32": "float32", "float16": "float16", "f16": "float16"}
#: K + V bytes at or under this are said to fit the H200's 60 MB L2 (repeated replays of
#: such a shape read the cache, not DRAM, so its GB/s may pass the read ceiling).
L2_FIT_BYTES = 50_000_000
TOL = 5e-4  # normalised squared error, DESIGN.md "Tests and tolerance"
HOST_OVERHEAD_GOAL = 1.5  # issue 7 item 5: step wall - GPU <= 1.5x the empty-submit floor


# --- the read ceiling ----------------------------------------------------------------------------


@dataclass
class ReadCeiling:
    nbytes: int
    gbps: float


def read_ceiling(device: Device, nbytes: int | None = None, reps: int = 10,
                 warm_s: float | None = None) -> ReadCeiling:
    """Best GB/s of a plain vec4 read kernel over ``nbytes`` of random words.

    Several launch shapes are tried (one or four loads in flight per invocation, about one
    or eight resident waves) and the best is the ceiling: no single shape is best on every
    driver, and a ceiling must not be flattered by a weak read kernel. The first shape runs
    back to back for ``warm_s`` seconds first (default 1 on a GPU, 0 on a CPU device): an
    H200 fresh from idle measured 1942 GB/s at its 345 MHz idle clock (4444 warmed).
    """
    if warm_s is None:
        warm_s = 0.0 if device.profile.device_type == "cpu" else 1.0
    limit = device.profile.max_storage_buffer_range
    if nbytes is None:
        nbytes = min(limit, 1 << 30) if device.profile.device_type != "cpu" else 64 << 20
    nbytes = min(nbytes, limit) // 16 * 16
    units = device.profile.compute_units or 8
    src = device.create_buffer(nbytes, name="read-src")
    try:
        # Random words: a zero-filled buffer can read faster than DRAM allows on GPUs that
        # compress memory, which would flatter the ceiling.
        src.write(0, np.random.default_rng(0).bytes(nbytes))
        best = math.inf
        for i, (groups, unroll) in enumerate(((units * 8, 4), (units * 64, 4),
                                              (units * 64, 1))):
            threads = READ_WG * min(65535, max(1, groups))
            threads = min(threads, max(READ_WG, nbytes // 16 // READ_WG * READ_WG))
            best = min(best, _time_read(device, src, nbytes, threads, unroll, reps,
                                        warm_s if i == 0 else 0.0))
    finally:
        src.destroy()
    return ReadCeiling(nbytes, nbytes / best)


def _time_read(device: Device, src, nbytes: int, threads: int, unroll: int, reps: int,
               warm_s: float = 0.0) -> float:
    dst = device.create_buffer(threads * 4, name="read-dst")
    try:
        spv = compile_glsl(generate_read(nbytes // 16, threads, unroll))
        pipe = device.compute_pipeline(spv, 2)
        rec = Recorder(device).record(
            [Dispatch(pipe, (BufferRange(src, 0, nbytes), BufferRange(dst, 0, threads * 4)),
                      (threads // READ_WG, 1, 1), "read")],
            timestamps=True,
        )
        try:
            if warm_s > 0:
                warm_for(lambda: rec.submit(wait=True), warm_s)
            best = math.inf
            for _ in range(reps):
                rec.submit()
                best = min(best, rec.gpu_time_ns() or math.inf)
        finally:
            rec.destroy()
    finally:
        dst.destroy()
    return best


# --- helpers -------------------------------------------------------------------------------------


def kv_bytes(shape: Shape, dtype: str) -> int:
    b, _hq, hkv, lk, d = shape
    return b * hkv * lk * 2 * d * np.dtype(dtype).itemsize


def fits_l2(shape: Shape, dtype: str) -> bool:
    return kv_bytes(shape, dtype) <= L2_FIT_BYTES


def shape_text(shape: Shape) -> str:
    return ",".join(map(str, shape))


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(D)) v in float64 on the given (storage-rounded) inputs; GQA:
    query head h reads KV head h // (Hq / Hkv)."""
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    q64 = q.astype(np.float64).reshape(b, hkv, (hq // hkv) * lq, d)
    s = q64 @ k.astype(np.float64).transpose(0, 1, 3, 2) / math.sqrt(d)
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return (p @ v.astype(np.float64)).reshape(b, hq, lq, v.shape[-1])


def nse(got: np.ndarray, ref: np.ndarray) -> float:
    got = np.asarray(got, np.float64)
    if got.shape != ref.shape or not np.all(np.isfinite(got)):
        return math.inf
    return float(((got - ref) ** 2).sum() / max((ref**2).sum(), 1e-300))


def make_inputs(shape: Shape, dtype: str, seed: int = 0):
    """q [B,Hq,1,D], k/v [B,Hkv,Lk,D] in ``dtype`` (random normal; never zeros)."""
    b, hq, hkv, lk, d = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hq, 1, d), dtype=np.float32).astype(dtype)
    k = rng.standard_normal((b, hkv, lk, d), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((b, hkv, lk, d), dtype=np.float32).astype(dtype)
    return q, k, v


class SmClock:
    """The SM clock through NVML where ``pynvml`` (nvidia-ml-py) imports; else ``note``
    says why not."""

    def __init__(self, device_name: str) -> None:
        self.h: Any = None
        self.max_mhz: int | None = None
        self.note = ""
        try:
            import pynvml

            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            names = [pynvml.nvmlDeviceGetName(h) for h in handles]
            names = [x.decode() if isinstance(x, bytes) else str(x) for x in names]
            match = [h for h, nm in zip(handles, names, strict=True)
                     if nm in device_name or device_name in nm]
            if not handles:
                raise RuntimeError("NVML sees no device")
            self.h = (match or handles)[0]
            self._pynvml = pynvml
            self.max_mhz = int(pynvml.nvmlDeviceGetMaxClockInfo(self.h, pynvml.NVML_CLOCK_SM))
        except Exception as e:  # any failure only loses the clock log
            self.h = None
            self.note = f"SM clock not logged: {type(e).__name__}: {e}".splitlines()[0]

    def _read(self, name: str, *args: Any) -> Any:
        """NVML's ``name``(handle, *args), or None without NVML or when the call fails."""
        if self.h is None:
            return None
        try:
            return getattr(self._pynvml, name)(self.h, *args)
        except Exception:
            return None

    def _clock_mhz(self, clock: str) -> int | None:
        """NVML's current ``NVML_CLOCK_<clock>`` in MHz, or None."""
        if self.h is None:
            return None
        mhz = self._read("nvmlDeviceGetClockInfo", getattr(self._pynvml, f"NVML_CLOCK_{clock}"))
        return None if mhz is None else int(mhz)

    def sm_mhz(self) -> int | None:
        return self._clock_mhz("SM")

    def mem_mhz(self) -> int | None:
        """The memory clock now: with the SM clock, what a run that measured unlike
        another of the same code on the same device can be compared by."""
        return self._clock_mhz("MEM")

    def power_w(self) -> float | None:
        """The board's power draw now (W)."""
        mw = self._read("nvmlDeviceGetPowerUsage")
        return None if mw is None else mw / 1e3

    def power_limit_w(self) -> float | None:
        """The enforced power limit (W): past it the driver lowers the clock."""
        mw = self._read("nvmlDeviceGetEnforcedPowerLimit")
        return None if mw is None else mw / 1e3

    def event_reasons(self) -> int | None:
        """NVML's clock-event reason bits now (why the clock is below its maximum); the
        call's older name where the binding predates the new one."""
        nv = getattr(self, "_pynvml", None)
        name = "nvmlDeviceGetCurrentClocksEventReasons"
        if nv is not None and not hasattr(nv, name):
            name = "nvmlDeviceGetCurrentClocksThrottleReasons"
        bits = self._read(name)
        return None if bits is None else int(bits)

    def check(self, what: str, out) -> int | None:
        """Read the clock; warn (one line) when it is under 95% of the device maximum."""
        mhz, out = self.sm_mhz(), out or sys.stdout
        if mhz is not None and self.max_mhz and mhz < 0.95 * self.max_mhz:
            print(f"WARNING: SM clock {mhz} MHz of {self.max_mhz} MHz "
                  f"({mhz / self.max_mhz:.0%}) while timing {what}", file=out, flush=True)
        return mhz


def per_launch_ns(times: list[float], n: int, calls: int) -> list[float]:
    """Per-dispatch device time of ``n`` dispatches recorded ``calls`` times back to back
    (``times`` indexed like the recording), averaged over the copies."""
    return [sum(times[c * n + i] for c in range(calls)) / calls for i in range(n)]


def warm_for(fn, seconds: float) -> int:
    """Run ``fn`` back to back for at least ``seconds`` (at least once); return the count."""
    n, end = 0, time.perf_counter() + seconds
    while True:
        fn()
        n += 1
        if time.perf_counter() >= end:
            return n


def _replayed(device: Device, dispatches: list[Dispatch], *, warm_s: float, reps: int,
              after_warm: Callable[[], int | None], read: Callable[[Any], Any],
              timestamps: Any, program_order: bool | None = None
              ) -> tuple[list[Any], int | None, int]:
    """Record ``dispatches`` once, run them back to back for ``warm_s`` s (the GPU clocks
    up), call ``after_warm`` (the SM clock), then submit ``reps`` times: what ``read`` takes
    from the recording after each submit, ``after_warm``'s answer and the barrier count."""
    rec = Recorder(device).record(dispatches, timestamps=timestamps,
                                  program_order=program_order)
    try:
        warm_for(lambda: rec.submit(wait=True), warm_s)
        mhz = after_warm()
        got = []
        for _ in range(reps):
            rec.submit(wait=True)
            got.append(read(rec))
        return got, mhz, rec.barriers
    finally:
        rec.destroy()


def dispatch_runs(device: Device, dispatches: list[Dispatch], *, warm_s: float, reps: int,
                  clock: SmClock, what: str, out=None) -> tuple[list[list[int]] | None,
                                                                int | None]:
    """Record ``dispatches`` with a timestamp around each, run them back to back for
    ``warm_s`` s (the GPU clocks up; the SM clock checked after, ``clock.check(what)``),
    then submit ``reps`` times: each submit's per-dispatch ns (None: no timestamps) and the
    SM MHz read after the warm-up."""
    runs, mhz, _ = _replayed(device, dispatches, warm_s=warm_s, reps=reps,
                             after_warm=lambda: clock.check(what, out),
                             read=lambda rec: rec.dispatch_times_ns(), timestamps=True)
    if any(t is None for t in runs):
        return None, mhz
    return [list(t) for t in runs], mhz


def bench_device(name: str | None) -> tuple[Device, SmClock]:
    """The device a benchmark runs on (``--device``) and its SM clock; prints both, one
    line each, as every benchmark's header."""
    from .runtime import resolve_device

    device = resolve_device(name)
    prof = device.profile
    clock = SmClock(device.name)
    print(f"device: {device.name} ({prof.device_type}, {prof.driver}, "
          f"{prof.compute_units or '?'} compute units)")
    print(clock.note or f"SM clock: {clock.sm_mhz()} MHz now, maximum {clock.max_mhz} MHz")
    return device, clock


def time_dispatches(device: Device, dispatches: list[Dispatch], *, warm_s: float, reps: int,
                    clock: SmClock, timestamps: Any = "bounds",
                    program_order: bool | None = None) -> tuple[float, int | None, int]:
    """Record ``dispatches`` once, run them back to back for ``warm_s`` s (the GPU clocks
    up), then submit ``reps`` times: the median GPU time in us (first to last timestamp),
    the SM clock read after the warm-up, and the recording's barrier count."""
    times, mhz, barriers = _replayed(device, dispatches, warm_s=warm_s, reps=reps,
                                     after_warm=clock.sm_mhz,
                                     read=lambda rec: rec.gpu_time_ns(),
                                     timestamps=timestamps, program_order=program_order)
    return statistics.median(times) / 1e3, mhz, barriers


# --- results -------------------------------------------------------------------------------------


@dataclass
class Row:
    """One (series, shape, dtype) measurement; ``note`` says why a row has no numbers."""

    series: str  # "pootvk" | "torch" | "llama.cpp"
    shape: Shape
    dtype: str
    kv_bytes: int
    fits_l2: bool
    us: float | None = None  # attention time (median); pootvk: its output in device memory
    #: pootvk: the attention time of the public plan as it is, its output an export in host
    #: memory (the kernels write it over PCIe)
    export_us: float | None = None
    device_nse: float | None = None  # pootvk: the device-memory output's check
    gbps: float | None = None
    ceiling_frac: float | None = None
    wall_us: float | None = None  # pootvk: one submit+wait of the plan's kernels
    gpu_us: float | None = None  # pootvk: all the plan's kernels (first to last timestamp)
    schedule: str | None = None
    splits: int | None = None
    kernels: list[str] = field(default_factory=list)
    nse: float | None = None
    check_ok: bool | None = None
    sm_mhz: int | None = None
    path: str | None = None  # llama.cpp: which path was faster
    other_path_us: float | None = None
    reps: int = 0
    note: str = ""

    def done(self) -> bool:
        return self.us is not None


def _fill(row: Row, us: float, ceiling: ReadCeiling) -> None:
    row.us = us
    row.gbps = row.kv_bytes / (us * 1e3)
    row.ceiling_frac = row.gbps / ceiling.gbps


# --- pootvk --------------------------------------------------------------------------------------


def _public_replay(device: Device):
    """The Replay ``pootvk.attention`` just ran on ``device``: the most recently used entry of
    the runtime's replay cache (a hit or a new entry is moved to its end)."""
    from . import runtime

    with runtime._lock:
        for (dev_id, _key), rp in reversed(runtime._replays.items()):
            if dev_id == id(device) and not rp.closed:
                return rp
    return None


def _schedule_of(request: Any) -> tuple[str, int | None]:
    from .plan import AttentionRequest, DecodeCombineRequest, DecodeRequest

    text = request.describe()
    m = re.search(r"splits=(\d+)", text)
    splits = int(m.group(1)) if m else (1 if isinstance(request, AttentionRequest) else None)
    if isinstance(request, DecodeRequest):  # the scalar kernel, or which matrix kernel
        if request.matrix:
            return ("tensor cores, register-fed" if request.matrix_feed == "registers"
                    else "tensor cores, staged"), splits
        return "grouped", splits
    if isinstance(request, DecodeCombineRequest):
        return "combine", splits
    if isinstance(request, AttentionRequest):
        return "streaming", splits
    return text.split()[0] if text else type(request).__name__, splits


def _device_output(device: Device, replay: Any, dispatches: list[Dispatch]
                   ) -> tuple[list[Dispatch], dict[int, Any]]:
    """``dispatches`` with every binding of a buffer the host reads (the plan's exports, in
    host memory) moved to a device-memory buffer of the same size, and those buffers by
    the ``id`` of the buffer each stands in for (the caller destroys them). torch's timed
    output stays on the device; this is pootvk's."""
    host = {id(replay.buffers[s.name]) for s in replay.plan.buffers.values()
            if s.role.host_reads}
    made: dict[int, Any] = {}

    def moved(br: BufferRange) -> BufferRange:
        if id(br.buffer) not in host:
            return br
        if id(br.buffer) not in made:
            made[id(br.buffer)] = device.create_buffer(br.buffer.size,
                                                       name=f"{br.buffer.name}:device")
        return BufferRange(made[id(br.buffer)], br.offset, br.nbytes)

    return [replace(d, bindings=tuple(moved(b) for b in d.bindings)) for d in dispatches], made


def bench_pootvk(device: Device, shape: Shape, dtype: str, ceiling: ReadCeiling, *,
                 warm_s: float, reps: int, clock: SmClock, calls: int = 10, out=None) -> Row:
    """``pootvk.attention`` once (checked against float64), then its plan's kernels replayed:
    the attention time per launch of ``calls`` launches recorded back to back (as torch is
    timed) with the output in device memory as torch's is (checked too), the same with the
    output the public plan's export in host memory, and the wall time of one."""
    import pootvk

    from .plan import AttentionRequest, DecodeCombineRequest, DecodeRequest

    row = Row("pootvk", shape, dtype, kv_bytes(shape, dtype), fits_l2(shape, dtype))
    q, k, v = make_inputs(shape, dtype)
    try:
        got = pootvk.attention(q, k, v, device=device)
    except PootvkError as e:
        row.note = f"n/a (refused: {type(e).__name__}: {e})".splitlines()[0]
        return row
    ref = reference(q, k, v)
    row.nse = nse(got, ref)
    row.check_ok = row.nse <= TOL
    rp = _public_replay(device)
    if rp is None:
        row.note = "n/a (the public path's replay was not found in the runtime cache)"
        return row
    g = rp.plan.graph
    kv_dt = g.slot("k").var.dtype.value if any(s.name == "k" for s in g.slots) else None
    want = {"float32": "f32", "float16": "f16"}[dtype]
    if kv_dt != want:
        row.note = (f"n/a (pootvk.attention ran {dtype} K/V as {kv_dt}: no {dtype} K/V "
                    "plan through the public path yet)")
        return row
    attn_idx = [i for i, kn in enumerate(rp.plan.kernels)
                if isinstance(kn.request, AttentionRequest | DecodeRequest | DecodeCombineRequest)]
    row.kernels = [rp.plan.kernels[i].request.describe() for i in attn_idx]
    main = [rp.plan.kernels[i].request for i in attn_idx
            if not isinstance(rp.plan.kernels[i].request, DecodeCombineRequest)]
    if main:
        row.schedule, row.splits = _schedule_of(main[0])
    # The public call left K/V in the plan's device buffers; a recording of the same
    # dispatches without the per-step uploads times the kernels over resident K/V: ``calls``
    # copies back to back (each behind the barrier its hazards need, as in a step), per
    # copy, the way torch's CUDA graph of ``calls`` calls is timed; one copy for the wall.
    # Where every dispatch is attention (the bench shapes' plans), the copies are timed
    # first to last timestamp, as torch's graph is timed by events around it: a timestamp
    # after every dispatch drains the pipeline once more per launch (H200: an empty
    # 128-workgroup launch behind its barrier costs 2.71 us with one, 2.18 without).
    disp = list(rp.recording.dispatches)
    bounds = len(attn_idx) == len(disp)
    stamps: Any = "bounds" if bounds else True
    ddisp, dbufs = _device_output(device, rp, disp)
    rec = Recorder(device).record(disp, timestamps=True)
    recn = Recorder(device).record(disp * calls, timestamps=stamps) if calls > 1 else rec
    recd = Recorder(device).record(ddisp * calls, timestamps=stamps)

    def attention_ns(r: Recorder) -> float | None:
        if r.bounds_only:  # the copies first to last: no timestamp between launches
            total = r.gpu_time_ns()
            return None if total is None else total / calls
        times = r.dispatch_times_ns()
        if times is None:
            return None
        per = per_launch_ns(times, len(disp), calls)
        return sum(per[i] for i in attn_idx)

    try:
        if dbufs:  # the device-memory output, checked like the public call's
            recd.submit(wait=True)
            name, g_out = next(iter(rp.plan.graph.exports.items()))
            loc = rp.plan.outputs[name]
            got_dev = dbufs[id(rp.buffers[loc.buffer])].read_array(loc.offset, g_out.shape,
                                                                   np.float32)
            row.device_nse = nse(got_dev, ref)
            row.check_ok = bool(row.check_ok and row.device_nse <= TOL)
        attn, export, gpu, wall = [], [], [], []
        warm_for(lambda: recn.submit(wait=True), warm_s)
        row.sm_mhz = clock.check(f"pootvk {shape_text(shape)} {dtype}", out)
        for _ in range(reps):  # the two outputs alternated, submit by submit
            recn.submit(wait=True)
            ns = attention_ns(recn)
            if ns is None:
                row.note = "n/a (the device has no timestamps)"
                return row
            export.append(ns)
            gpu.append(recn.gpu_time_ns() / calls)
            recd.submit(wait=True)
            attn.append(attention_ns(recd))
        for _ in range(reps):
            t0 = time.perf_counter()
            rec.submit(wait=True)
            wall.append(time.perf_counter() - t0)
        row.reps = reps
    finally:
        recd.destroy()
        if recn is not rec:
            recn.destroy()
        rec.destroy()
        for b in dbufs.values():
            b.destroy()
        rp.close()  # frees its K/V now; the cache rebuilds a closed entry if asked again
    _fill(row, statistics.median(attn) / 1e3, ceiling)
    row.export_us = statistics.median(export) / 1e3
    row.gpu_us = statistics.median(gpu) / 1e3
    row.wall_us = statistics.median(wall) * 1e6
    return row


# --- host overhead (item 5) ----------------------------------------------------------------------


@dataclass
class HostOverhead:
    shape: Shape
    reps: int
    empty_submit_us: float  # submit + fence wait of an empty recorded command buffer
    step_wall_us: float  # Replay.step of a decode step, recorded as DecodeLoop records it
    step_gpu_us: float  # the same plan's first-to-last timestamp (a twin recording's)
    submit_wall_us: float  # submit + wait of the same recording, no Replay.step glue
    timed_wall_us: float = 0.0  # Replay.step of the twin that records the two timestamps
    profile: list[tuple[str, float]] = field(default_factory=list)  # (function, own us/step)
    phases: dict[str, float] = field(default_factory=dict)  # phase -> cumulative us/step

    @property
    def host_us(self) -> float:
        return self.step_wall_us - self.step_gpu_us

    @property
    def ratio(self) -> float:
        return self.host_us / self.empty_submit_us


def empty_submit_us(device: Device, reps: int) -> float:
    """Median wall time of submit + fence wait of a recorded command buffer with no dispatch."""
    rec = Recorder(device).record([])
    try:
        warm_for(lambda: rec.submit(wait=True), 0.05)
        walls = []
        for _ in range(reps):
            t0 = time.perf_counter()
            rec.submit(wait=True)
            walls.append(time.perf_counter() - t0)
    finally:
        rec.destroy()
    return statistics.median(walls) * 1e6


def host_overhead(device: Device, shape: Shape, *, warm_s: float, reps: int) -> HostOverhead:
    """A decode step (K/V caches in state, full at position Lk - 1) through ``Replay.step``:
    step wall - GPU time against the empty-submit floor, and where the step's host time goes.

    The step is the one a DecodeLoop runs: its recording has no timestamp queries (their
    pool reset and writes are instrumentation, paid on the GPU before the first timestamp
    and so counted as host time). Its GPU time comes from a twin replay of the same plan
    recorded with the two bounding timestamps, stepped interleaved with it; the twin's own
    step wall is reported beside it (``timed_wall_us``)."""
    import cProfile
    import pstats

    from .ops import trace_decode_step
    from .runtime import build_replay

    b, hq, hkv, lk, d = shape
    rng = np.random.default_rng(1)
    graph = trace_decode_step(b, hq, hkv, d, lk)
    rp = build_replay(graph, device)
    tw = build_replay(graph, device, timestamps="bounds", share=rp)  # the same K/V bytes
    try:
        for name in ("k_cache", "v_cache"):
            rp.set_state(name, rng.standard_normal((b, hkv, lk, d), dtype=np.float32))
        values = {
            "q": rng.standard_normal((b, hq, 1, d), dtype=np.float32),
            "k_new": rng.standard_normal((b, hkv, 1, d), dtype=np.float32),
            "v_new": rng.standard_normal((b, hkv, 1, d), dtype=np.float32),
            "pos": np.int32(lk - 1),
        }
        floor = empty_submit_us(device, reps)

        def both() -> None:
            rp.step(values)
            tw.step(values)

        warm_for(both, warm_s)
        wall, gpu, timed, sub = [], [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            rp.step(values)
            t1 = time.perf_counter()
            tw.step(values)
            t2 = time.perf_counter()
            wall.append(t1 - t0)
            timed.append(t2 - t1)
            gpu.append(tw.gpu_time_ns() or 0.0)
        rec = rp.recording
        for _ in range(reps):
            t0 = time.perf_counter()
            rec.submit(wait=True)
            sub.append(time.perf_counter() - t0)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(reps):
            rp.step(values)
        prof.disable()
    finally:
        tw.close()
        rp.close()
    st = pstats.Stats(prof)
    stats = st.stats  # type: ignore[attr-defined]
    # Cumulative time of the step's phases (cProfile inflates Python-heavy ones).
    phases = {"check_bind": "check_bind", "write": "input writes", "_read": "output reads",
              "submit": "submit + fence wait", "step": "Replay.step",
              "lean_step": "lean step (checks, writes, submit, output copy)"}
    per_step: dict[str, float] = {}
    for (_fn, _line, name), t in stats.items():
        if name in phases and (name != "step" or _fn.endswith("replay.py")):
            per_step[phases[name]] = per_step.get(phases[name], 0.0) + t[3] / reps * 1e6
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:10]
    profile = [(f"{Path(fn).name}:{line}:{name}", t[2] / reps * 1e6)
               for (fn, line, name), t in top]
    return HostOverhead(shape, reps, floor, statistics.median(wall) * 1e6,
                        statistics.median(gpu) / 1e3, statistics.median(sub) * 1e6,
                        statistics.median(timed) * 1e6, profile, per_step)


# --- torch SDPA ----------------------------------------------------------------------------------


def torch_available() -> str | None:
    """None when torch with CUDA imports; else why not (one line)."""
    try:
        import torch
    except Exception as e:
        return f"torch not importable ({type(e).__name__}: {e})".splitlines()[0]
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    return None


def time_cuda_graph(f, *, calls: int, reps: int, warm_s: float, after_warm=None):
    """Median microseconds per call of ``f`` (a torch CUDA function): 3 eager calls on a side
    stream (what capture needs first), ``calls`` calls captured in one CUDA graph, replayed
    back to back for ``warm_s`` (the GPU clocks up), then ``reps`` replays timed with CUDA
    events. ``after_warm()`` runs between warm-up and timing (an SM-clock check). Returns
    ``(us, the first eager output)``."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            first = f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            f()
    warm_for(lambda: (graph.replay(), torch.cuda.synchronize()), warm_s)
    if after_warm is not None:
        after_warm()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(reps):
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        per_call.append(e0.elapsed_time(e1) * 1e3 / calls)
    return statistics.median(per_call), first


def bench_torch(shape: Shape, dtype: str, ceiling: ReadCeiling, *, warm_s: float, reps: int,
                clock: SmClock, calls: int = 10, out=None) -> Row:
    """``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)``: ``calls`` launches
    captured in one CUDA graph, timed with CUDA events, per-call median of ``reps`` replays."""
    import torch
    import torch.nn.functional as F

    row = Row("torch", shape, dtype, kv_bytes(shape, dtype), fits_l2(shape, dtype))
    q, k, v = make_inputs(shape, dtype, seed=2)
    tdt = {"float32": torch.float32, "float16": torch.float16}[dtype]
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).to("cuda", tdt) for x in (q, k, v))

    def f():
        return F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)

    def clock_check() -> None:
        row.sm_mhz = clock.check(f"torch {shape_text(shape)} {dtype}", out)

    us, first = time_cuda_graph(f, calls=calls, reps=reps, warm_s=warm_s, after_warm=clock_check)
    row.nse = nse(first.float().cpu().numpy(), reference(q, k, v))
    row.check_ok = row.nse <= TOL
    row.reps = reps
    _fill(row, us, ceiling)
    return row


# --- llama.cpp (ggml Vulkan FLASH_ATTN_EXT) ------------------------------------------------------

_FA_LINE = re.compile(r"FLASH_ATTN_EXT\((?P<params>[^)]*)\):.*?(?P<us>[\d.]+)\s*us/run")
#: only the decode cases (nb=1, D=128) of its perf list
PEER_FILTER = r"hsk=128,hsv=128,.*,nb=1,"


def parse_peer_fa(text: str) -> dict[tuple[Shape, str], float]:
    """``test-backend-ops perf -o FLASH_ATTN_EXT`` lines -> {(shape, dtype): us/run}.

    ggml's layout: nh = Hkv, nr23 = [Hq/Hkv, B], kv = Lk, nb = query rows, hsk = D;
    type_KV (older) or type_K/type_V (newer) f16|f32.
    """
    found: dict[tuple[Shape, str], float] = {}
    for line in text.splitlines():
        m = _FA_LINE.search(line)
        if not m:
            continue
        p = m.group("params")
        try:
            hsk = int(re.search(r"hsk=(\d+)", p).group(1))  # type: ignore[union-attr]
            nh = int(re.search(r"nh=(\d+)", p).group(1))  # type: ignore[union-attr]
            r, b = (int(x) for x in re.search(r"nr23=\[(\d+),(\d+)\]", p).groups())  # type: ignore[union-attr]
            kv = int(re.search(r"kv=(\d+)", p).group(1))  # type: ignore[union-attr]
            nb = int(re.search(r"nb=(\d+)", p).group(1))  # type: ignore[union-attr]
            t = re.search(r"type_KV=(\w+)", p) or re.search(r"type_K=(\w+)", p)
            tv = re.search(r"type_V=(\w+)", p)
        except (AttributeError, ValueError):
            continue
        if nb != 1 or t is None or (tv is not None and tv.group(1) != t.group(1)):
            continue
        dtype = {"f16": "float16", "f32": "float32"}.get(t.group(1))
        if dtype is None:
            continue
        found[((b, nh * r, nh, kv, hsk), dtype)] = float(m.group("us"))
    return found


def peer_fa_path() -> Path | None:
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent):
        p = base / ".gpu" / "peer-fa"
        if p.exists():
            return p
    return None


def run_peer_fa(peer: Path, coopmat2: bool, timeout_s: float = 180) -> tuple[str, dict]:
    env = dict(os.environ)
    if not coopmat2:
        env["GGML_VK_DISABLE_COOPMAT2"] = "1"
    else:
        env.pop("GGML_VK_DISABLE_COOPMAT2", None)
    proc = subprocess.run([str(peer), "perf", "-p", PEER_FILTER], cwd=peer.parent.parent,
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0 and not _FA_LINE.search(text):
        tail = text.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"exit {proc.returncode}: {tail[0]}")
    return text, parse_peer_fa(text)


# --- the run -------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _ratio(a: float | None, b: float | None) -> str:
    """a / b as 'N.NNx' (n/a when either is missing)."""
    return "n/a" if not a or not b else f"{a / b:.2f}x"


def _table(out, header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |", file=out)
    print("|" + "---|" * len(header), file=out)
    for r in rows:
        print("| " + " | ".join(r) + " |", file=out)
    print(file=out, flush=True)


def run(device: Device, shapes: list[Shape] | None = None, dtypes: list[str] | None = None, *,
        quick: bool = False, warm_s: float | None = None, reps: int | None = None,
        calls: int | None = None, json_path: str | None = None, plot_path: str | None = None,
        out=None) -> dict:
    """Measure every series, print markdown tables of ratios, write ``json_path`` and the
    ``plot_path`` PNG when given. Returns everything as a dict (what the JSON holds).
    ``calls``: launches timed back to back per replay (pootvk and torch alike)."""
    if shapes is None:
        shapes = QUICK_SHAPES if quick else (
            CPU_SHAPES if device.profile.device_type == "cpu" else GPU_SHAPES)
    dtypes = list(dtypes or DTYPES)
    warm_s = (0.05 if quick else 1.0) if warm_s is None else warm_s
    reps = (10 if quick else 50) if reps is None else reps
    calls = (2 if quick else 10) if calls is None else calls
    out = sys.stdout if out is None else out
    p = device.profile
    print(f"device: {device.name} ({p.device_type}, {p.driver}, "
          f"{p.compute_units or '?'} compute units)", file=out)
    clock = SmClock(device.name)
    if clock.h is None:
        print(clock.note, file=out)
    else:
        print(f"SM clock: {clock.sm_mhz()} MHz now, device maximum {clock.max_mhz} MHz", file=out)
    ceiling = read_ceiling(device, nbytes=8 << 20 if quick else None, reps=3 if quick else 10)
    print(f"read ceiling: {ceiling.gbps:.1f} GB/s (vec4 read of {ceiling.nbytes >> 20} MiB of "
          "random words, best launch shape)", file=out)
    print(f"method: each case runs back to back >= {warm_s:g} s before timing; median of "
          f"{reps} replays of {calls} launches recorded back to back (pootvk, each behind "
          "its barriers) or captured in one CUDA graph (torch), per launch; "
          "K/V GB/s = K+V bytes / attention time; 'L2' = K+V <= "
          f"{L2_FIT_BYTES / 1e6:.0f} MB (fits a 60 MB L2: replays may read the cache); "
          f"pootvk outputs checked once against float64 numpy (nse <= {TOL:g})", file=out,
          flush=True)
    result: dict[str, Any] = {
        "device": {"name": device.name, "type": p.device_type, "driver": p.driver,
                   "compute_units": p.compute_units},
        "ceiling": asdict(ceiling), "warm_s": warm_s, "reps": reps, "calls": calls,
        "sm_max_mhz": clock.max_mhz, "skipped": [], "rows": [],
    }
    skipped: list[str] = result["skipped"]
    if clock.h is None:
        skipped.append(clock.note)

    def skip(msg: str) -> None:
        msg = msg.splitlines()[0] if msg else msg
        skipped.append(msg)
        print(msg, file=out, flush=True)

    # --- host overhead (item 5), before torch loads CUDA into this process: with it loaded
    # the H200's empty submit measured 46.8 us in the bench against 14.5-16.2 alone (and the
    # step's host time 53.6 us against 22.7-27.8), so the ratio said little about a pootvk
    # process --------------------------------------------------------------------------------
    ho = None
    try:
        ho = host_overhead(device, shapes[0], warm_s=warm_s, reps=max(reps, 100))
    except Exception as e:
        skip(f"host overhead skipped: {type(e).__name__}: {e}")

    # --- pootvk and torch, shape by shape --------------------------------------------------
    why_no_torch = torch_available()
    if why_no_torch:
        skip(f"torch SDPA skipped: {why_no_torch}")
    pv: dict[tuple[Shape, str], Row] = {}
    tr: dict[tuple[Shape, str], Row] = {}
    for s in shapes:
        for dt in dtypes:
            try:
                pv[s, dt] = bench_pootvk(device, s, dt, ceiling, warm_s=warm_s, reps=reps,
                                         clock=clock, calls=calls, out=out)
            except Exception as e:  # one shape's failure loses only that row
                r = Row("pootvk", s, dt, kv_bytes(s, dt), fits_l2(s, dt))
                r.note = f"n/a (failed: {type(e).__name__}: {e})".splitlines()[0]
                pv[s, dt] = r
            if not why_no_torch:
                try:
                    tr[s, dt] = bench_torch(s, dt, ceiling, warm_s=warm_s, reps=reps,
                                            clock=clock, calls=calls, out=out)
                except Exception as e:
                    skip(f"torch SDPA {shape_text(s)} {dt} skipped: {type(e).__name__}: {e}")
            r = pv[s, dt]
            print(f"  measured {shape_text(s)} {dt}: pootvk {_pct(r.ceiling_frac)} of ceiling"
                  + (f", torch {_pct(tr[s, dt].ceiling_frac)}" if (s, dt) in tr else ""),
                  file=sys.stderr, flush=True)

    # --- llama.cpp ------------------------------------------------------------------------
    ll: dict[tuple[Shape, str], Row] = {}
    peer = peer_fa_path()
    if peer is None:
        skip("llama.cpp Vulkan flash attention skipped: no .gpu/peer-fa (tools/gpu-prep makes it)")
    else:
        runs: dict[str, dict] = {}
        for label, cm2 in (("coopmat2", True), ("no-coopmat2", False)):
            try:
                text, parsed = run_peer_fa(peer, cm2)
                runs[label] = parsed
                result.setdefault("llama_cpp_raw", {})[label] = [
                    ln for ln in text.splitlines() if "FLASH_ATTN_EXT" in ln]
                if not parsed:
                    skip(f"llama.cpp {label}: no FLASH_ATTN_EXT us/run lines in its output")
            except Exception as e:
                skip(f"llama.cpp {label} skipped: {type(e).__name__}: {e}")
        for s in shapes:
            for dt in dtypes:
                times = {lab: r[s, dt] for lab, r in runs.items() if (s, dt) in r}
                if not times:
                    continue
                best = min(times, key=times.get)  # type: ignore[arg-type]
                row = Row("llama.cpp", s, dt, kv_bytes(s, dt), fits_l2(s, dt), path=best)
                _fill(row, times[best], ceiling)
                others = [t for lab, t in times.items() if lab != best]
                row.other_path_us = others[0] if others else None
                ll[s, dt] = row

    # --- report ---------------------------------------------------------------------------
    print(file=out)
    print("## pootvk (the public path's plan, replayed; K/V resident)", file=out)
    rows = []
    for (s, dt), r in pv.items():
        mb = f"{r.kv_bytes / 1e6:.1f}"
        l2 = "yes" if r.fits_l2 else "no"
        chk = "n/a" if r.nse is None else (
            f"{r.nse:.1e}{'' if r.device_nse is None else f' / {r.device_nse:.1e}'} "
            f"{'OK' if r.check_ok else 'FAILED'}")
        if not r.done():
            rows.append([shape_text(s), dt, mb, l2, r.note or "n/a", "", "", "", "", "", "",
                         "", "", chk, ""])
            continue
        rows.append([shape_text(s), dt, mb, l2, _pct(r.ceiling_frac), _num(r.us),
                     _ratio(r.export_us, r.us), _num(r.export_us),
                     _ratio(r.wall_us, r.export_us), _num(r.wall_us), _num(r.gbps),
                     r.schedule or "?", str(r.splits if r.splits is not None else "?"), chk,
                     _num(r.sm_mhz, "d")])
    _table(out, ["B,Hq,Hkv,Lk,D", "K/V", "K+V MB", "L2", "of ceiling", "attn us",
                 "export / attn", "export us", "wall / export", "step wall us", "GB/s",
                 "schedule", "splits", "check (nse)", "SM MHz"], rows)
    print("attn us: the attention kernels' GPU time with the output in device memory, as "
          "torch's (of ceiling and GB/s from it); export us: the public plan as it is, the "
          "output an export in host memory written by the kernels over the bus (timed "
          "alternately with the first); step wall: one submit + fence wait of the plan's "
          "recorded kernels from Python, K/V resident (the public call's per-call K/V "
          "upload is not in it); wall / export: step wall over the public plan's attention "
          "GPU time; check: the public call's output / the device-memory output's, against "
          "float64", file=out)
    print(file=out)

    if ho is not None:
        print("## host overhead of a replayed decode step (issue 7 item 5)", file=out)
        ok = ho.ratio <= HOST_OVERHEAD_GOAL
        _table(out, ["decode step B,Hq,Hkv,Lk,D", "host us", "host / empty submit",
                     "empty submit us", "goal", "step wall us", "step / bare submit",
                     "bare submit us", "GPU / step wall"],
               [[shape_text(ho.shape), f"{ho.host_us:.1f}", f"{ho.ratio:.2f}x",
                 f"{ho.empty_submit_us:.1f}",
                 f"host <= {HOST_OVERHEAD_GOAL}x empty: {'met' if ok else 'MISSED'}",
                 f"{ho.step_wall_us:.1f}", _ratio(ho.step_wall_us, ho.submit_wall_us),
                 f"{ho.submit_wall_us:.1f}", _ratio(ho.step_gpu_us, ho.step_wall_us)]])
        print(f"host = Replay.step wall (recorded as DecodeLoop records it: no timestamp "
              f"queries) - the plan's GPU time (first to last timestamp of a twin recording "
              f"with the two, stepped interleaved; its step wall: {ho.timed_wall_us:.1f} us); "
              f"empty submit = submit + fence wait of a recorded command buffer with no "
              f"dispatch; bare submit = submit + wait of the same recording without "
              f"Replay.step; median of {ho.reps}", file=out)
        step_us = ho.phases.get("Replay.step") or ho.step_wall_us
        print("Replay.step phases under cProfile (share of its profiled step): " + ", ".join(
            f"{k} {v / step_us:.0%}" for k, v in ho.phases.items() if k != "Replay.step"),
            file=out)
        print("own time by function (share of the profiled step): " + ", ".join(
            f"{name} {us / step_us:.0%}" for name, us in ho.profile[:8]), file=out)
        print(file=out, flush=True)

    if tr:
        print("## torch scaled_dot_product_attention (CUDA graph, CUDA events)", file=out)
        _table(out, ["B,Hq,Hkv,Lk,D", "dtype", "L2", "of ceiling", "GB/s", "torch us",
                     "pootvk speed vs torch", "check (nse)", "SM MHz"],
               [[shape_text(s), dt, "yes" if r.fits_l2 else "no", _pct(r.ceiling_frac),
                 _num(r.gbps), _num(r.us),
                 _ratio(r.us, pv[s, dt].us) if (s, dt) in pv else "n/a",
                 f"{r.nse:.1e}", _num(r.sm_mhz, "d")] for (s, dt), r in tr.items()])
        print("pootvk speed vs torch = torch time / pootvk attention time (> 1: pootvk faster)",
              file=out)
        print(file=out)
    if ll:
        print("## llama.cpp Vulkan flash attention (faster of coopmat2 and "
              "GGML_VK_DISABLE_COOPMAT2=1; its shapes carry a mask)", file=out)
        _table(out, ["B,Hq,Hkv,Lk,D", "dtype", "L2", "of ceiling", "GB/s", "llama.cpp us",
                     "pootvk speed vs llama.cpp", "faster path", "other path / faster"],
               [[shape_text(s), dt, "yes" if r.fits_l2 else "no", _pct(r.ceiling_frac),
                 _num(r.gbps), _num(r.us),
                 _ratio(r.us, pv[s, dt].us) if (s, dt) in pv else "n/a", r.path or "?",
                 _ratio(r.other_path_us, r.us)] for (s, dt), r in ll.items()])
        print(file=out)

    print("## side by side: fraction of the read ceiling", file=out)
    side = []
    for s in shapes:
        for dt in dtypes:
            side.append([shape_text(s), dt, "yes" if fits_l2(s, dt) else "no",
                         _pct(pv[s, dt].ceiling_frac) if (s, dt) in pv else "n/a",
                         _pct(tr[s, dt].ceiling_frac) if (s, dt) in tr else "n/a",
                         _pct(ll[s, dt].ceiling_frac) if (s, dt) in ll else "n/a"])
    _table(out, ["B,Hq,Hkv,Lk,D", "dtype", "L2", "pootvk", "torch SDPA", "llama.cpp Vulkan"],
           side)
    if skipped:
        print("skipped: " + "; ".join(skipped), file=out, flush=True)

    result["rows"] = [_row_json(r) for d in (pv, tr, ll) for r in d.values()]
    if ho is not None:
        result["host_overhead"] = {**asdict(ho), "host_us": ho.host_us, "ratio": ho.ratio,
                                   "goal": HOST_OVERHEAD_GOAL}
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {json_path}", file=out)
    if plot_path:
        try:
            plot(result, plot_path)
            print(f"wrote {plot_path}", file=out)
        except Exception as e:  # a plot never loses the numbers
            skip(f"plot skipped: {type(e).__name__}: {e}")
    return result


def _row_json(r: Row) -> dict:
    d = asdict(r)
    d["shape"] = list(r.shape)
    return d


def plot(result: dict, path: str) -> None:
    """K/V GB/s against Lk, one line per (series, dtype); the read ceiling as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5))
    # one colour and marker per series; a line joins only the points of one (B, Hq, Hkv)
    # family (the same problem at longer lengths), never different batch/head shapes
    series: dict[str, dict[tuple[int, int, int], list[tuple[int, float]]]] = {}
    for r in result["rows"]:
        if r["gbps"] is None:
            continue
        b, hq, hkv, lk, _d = r["shape"]
        fam = series.setdefault(f"{r['series']} {r['dtype']}", {})
        fam.setdefault((b, hq, hkv), []).append((lk, r["gbps"]))
    markers = "osD^v<>p*h"
    families = sorted({k for f in series.values() for k in f})
    marker = {fam: markers[i % len(markers)] for i, fam in enumerate(families)}
    for n, (name, fams) in enumerate(sorted(series.items())):
        colour = f"C{n % 10}"
        for i, (fam, pts) in enumerate(sorted(fams.items())):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour,
                    marker=marker[fam], ls="-" if len(pts) > 1 else "none",
                    label=name if i == 0 else None)
    for fam in families:
        ax.plot([], [], color="0.4", ls="none", marker=marker[fam],
                label="B,Hq,Hkv = " + ",".join(map(str, fam)))
    ax.axhline(result["ceiling"]["gbps"], color="k", ls="--", lw=1,
               label=f"read ceiling {result['ceiling']['gbps']:.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("Lk (keys), D=128, Lq=1")
    ax.set_ylabel("K/V GB/s")
    ax.set_title(f"decode attention on {result['device']['name']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def matplotlib_missing() -> str | None:
    """None when matplotlib imports; else how to install it (one line)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib: pip install 'pootvk[plot]' (or pip install matplotlib)"
    return None
