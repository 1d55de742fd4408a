"""Sustained power and SM clock of decode attention: pootvk against torch SDPA, same shapes.

    python3 bench/power_probe.py [--shape B,Hq,Hkv,Lk,D ...] [--dtype float16 ...]
                                 [--seconds 4] [--json FILE]

Why: in `pootvk bench` runs on the H200 the SM clock fell on the long rows (to 1380-1500 MHz
for pootvk's F16 kernels) while torch's rows of the same shapes often stayed at 1980 MHz,
and NVML named the software power cap. A kernel that does more ALU work per byte draws more
power at the same bandwidth and is clocked down sooner. This measures it: each case runs
back to back for ``--seconds`` (pootvk: the public path's plan, 10 launches recorded back to
back per submit; torch: ``scaled_dot_product_attention`` with ``enable_gqa``, 10 calls in one
CUDA graph), NVML is sampled every 20 ms, and the second half's medians are reported: power
(W, against the enforced limit), SM clock, the clock-event reasons seen (software power cap,
thermal...), and the time per launch at that clock. Without NVML (lavapipe) only the time
per launch is reported; without torch with CUDA, only pootvk.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pootvk  # noqa: E402
from pootvk.benchmark import (  # noqa: E402
    SmClock,
    _public_replay,
    make_inputs,
    shape_text,
    torch_available,
)
from pootvk.vk import Device, Recorder  # noqa: E402

SHAPES = [(1, 32, 8, 131072, 128), (1, 32, 32, 32768, 128), (8, 32, 8, 8192, 128)]
CALLS = 10
#: NVML clock-event reason bits (nvmlClocksEventReasons)
REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "sw power cap", 0x8: "hw slowdown",
           0x20: "sync boost", 0x40: "sw thermal", 0x80: "hw thermal", 0x100: "power brake"}


class Sampler:
    """NVML power, SM clock and clock-event reasons every ``period`` seconds in a thread."""

    def __init__(self, clock: SmClock, period: float = 0.02) -> None:
        self.clock, self.period = clock, period
        self.samples: list[tuple[float, float, int, int]] = []  # (t, W, MHz, reasons)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        c = self.clock
        while not self._stop.is_set():
            w, mhz = c.power_w(), c.sm_mhz()
            if w is not None and mhz is not None:  # a failed read only loses that sample
                self.samples.append((time.perf_counter(), w, mhz, c.event_reasons() or 0))
            self._stop.wait(self.period)

    def __enter__(self) -> Sampler:
        if self.clock.h is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self, t_half: float) -> dict:
        late = [s for s in self.samples if s[0] >= t_half] or self.samples
        if not late:
            return {"watts": None, "sm_mhz": None, "reasons": []}
        bits = 0
        for s in late:
            bits |= s[3]
        return {"watts": statistics.median(s[1] for s in late),
                "sm_mhz": statistics.median(s[2] for s in late),
                "reasons": [name for bit, name in REASONS.items() if bits & bit]}


def sustain(fn, seconds: float, launches_per_call: int, clock: SmClock) -> dict:
    """Run ``fn`` back to back for ``seconds`` under the sampler: per-launch us of the
    second half and the samples' medians."""
    with Sampler(clock) as smp:
        t0 = time.perf_counter()
        t_half, n_half, n = t0 + seconds / 2, None, 0
        while True:
            fn()
            n += 1
            now = time.perf_counter()
            if n_half is None and now >= t_half:
                n_half, t_mark = n, now
            if now - t0 >= seconds:
                break
        if n_half is None or n == n_half:
            n_half, t_mark = 0, t0
    us = (now - t_mark) / ((n - n_half) * launches_per_call) * 1e6
    return {"us_per_launch": us, **smp.summary(t_half)}


def run_pootvk(device: Device, shape, dtype: str, seconds: float, clock: SmClock) -> dict:
    q, k, v = make_inputs(shape, dtype)
    pootvk.attention(q, k, v, device=device)
    rp = _public_replay(device)
    rec = Recorder(device).record(list(rp.recording.dispatches) * CALLS)
    try:
        return sustain(lambda: rec.submit(wait=True), seconds, CALLS, clock)
    finally:
        rec.destroy()
        rp.close()


def run_torch(shape, dtype: str, seconds: float, clock: SmClock) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    q, k, v = make_inputs(shape, dtype, seed=2)
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).to("cuda") for x in (q, k, v))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)

    def step() -> None:
        graph.replay()
        torch.cuda.synchronize()

    return sustain(step, seconds, CALLS, clock)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", action="append", default=None, help="B,Hq,Hkv,Lk,D")
    ap.add_argument("--dtype", action="append", default=None, help="float16 | float32")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default=None)
    a = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shape] if a.shape else SHAPES
    dtypes = a.dtype or ["float16"]
    device = Device(a.device)
    clock = SmClock(device.name)
    limit = clock.power_limit_w()
    if clock.h is not None:
        print(f"device: {device.name}; SM clock max {clock.max_mhz} MHz; "
              f"enforced power limit {'?' if limit is None else f'{limit:.0f}'} W", flush=True)
    else:
        print(f"device: {device.name}; {clock.note}", flush=True)
    why_no_torch = torch_available()
    if why_no_torch:
        print(f"torch skipped: {why_no_torch}", flush=True)
    rows = []
    for shape in shapes:
        for dt in dtypes:
            for name in ("pootvk",) if why_no_torch else ("pootvk", "torch"):
                got = (run_pootvk(device, shape, dt, a.seconds, clock) if name == "pootvk"
                       else run_torch(shape, dt, a.seconds, clock))
                r = {"shape": shape, "dtype": dt, "runner": name, **got}
                rows.append(r)
                print(f"  {shape_text(shape)} {dt} {name}: {r['us_per_launch']:.1f} us",
                      file=sys.stderr, flush=True)
    print(f"\n{a.seconds:g} s back to back per case, medians of the second half; NVML every "
          "20 ms\n")
    print("| B,Hq,Hkv,Lk,D | dtype | runner | us per launch | power W | SM MHz "
          "| clock-event reasons |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        w = "-" if r["watts"] is None else f"{r['watts']:.0f}"
        mhz = "-" if r["sm_mhz"] is None else f"{r['sm_mhz']:.0f}"
        print(f"| {shape_text(r['shape'])} | {r['dtype']} | {r['runner']} | "
              f"{r['us_per_launch']:.1f} | {w} | {mhz} | {', '.join(r['reasons']) or '-'} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device.name, "power_limit_w": limit,
                                            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
