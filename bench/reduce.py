"""Reduce (Max, Sum): GB/s of input read against the device's streaming-read ceiling.

    python3 bench/reduce.py [--device N] [--quick] [--reps N]

Each case is one Reduce over an input slot, planned for the device (the layout the plan
chose is printed), checked once against numpy (float64), then its recorded dispatch is
replayed with timestamps over the resident input: the median kernel time gives GB/s of the
input read (both passes of a split reduction), as a fraction of
``pootvk.benchmark.read_ceiling``. Where torch with CUDA is
present, ``x.sum(dim)`` / ``x.amax(dim)`` on the same shape is timed too (CUDA events).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from pootvk.benchmark import read_ceiling
from pootvk.ir import F16, F32
from pootvk.ops import Builder
from pootvk.runtime import build_replay, resolve_device
from pootvk.vk import Recorder

CASES = [  # shape, axis: rows (softmax/RMSNorm), columns, one long row, a decode row
    ((4096, 4096), 1),
    ((4096, 4096), 0),
    ((32, 128256), 1),
    ((1, 1 << 22), 1),
    ((8, 4096), 1),
]
QUICK = [((64, 1000), 1), ((1000, 64), 0), ((2, 1 << 18), 1)]


def bench_case(device, shape, axis, dt, op, reps, ceiling):
    b = Builder()
    b.export("y", b.reduce(op, b.input("x", shape, dt), axis, keepdim=False))
    x = np.random.default_rng(0).standard_normal(shape).astype(dt.numpy)
    with build_replay(b.build(), device) as rp:
        got = rp.step({"x": x})["y"].astype(np.float64)
        x64 = x.astype(np.float64)
        want = x64.sum(axis) if op == "Sum" else x64.max(axis)
        err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
        rec = Recorder(device).record(list(rp.recording.dispatches), timestamps=True)
        try:
            for _ in range(3):
                rec.submit(wait=True)
            times = []
            for _ in range(reps):
                rec.submit(wait=True)
                t = rec.dispatch_times_ns()
                if t is None:
                    return layout(rp.plan), None, err
                times.append(sum(t))
        finally:
            rec.destroy()
    us = statistics.median(times) / 1e3
    gbps = x.nbytes / (us * 1e3)
    return layout(rp.plan), (us, gbps, gbps / ceiling), err


def layout(plan) -> str:
    """Each pass's layout (a split reduction has two)."""
    return " + ".join(k.request.describe().split("] ", 1)[1].split(" grid")[0]
                      for k in plan.kernels)


def bench_torch(shape, axis, dt, op, reps):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    x = torch.randn(shape, device="cuda", dtype=torch.float16 if dt is F16 else torch.float32)
    fn = (lambda: x.sum(axis)) if op == "Sum" else (lambda: x.amax(axis))
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        ts.append(start.elapsed_time(end) * 1e3)
    us = statistics.median(ts)
    return us, x.numel() * x.element_size() / (us * 1e3)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true", help="small shapes (a CPU device)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    ceiling = read_ceiling(device).gbps
    print(f"device: {device.name}; read ceiling {ceiling:.1f} GB/s\n")
    print("| shape | axis | dtype | op | layout | us | GB/s | of ceiling | rel err | torch us "
          "| torch GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape, axis in QUICK if args.quick else CASES:
        for dt in (F32, F16):
            for op in ("Sum", "Max"):
                desc, t, err = bench_case(device, shape, axis, dt, op, args.reps, ceiling)
                tt = bench_torch(shape, axis, dt, op, args.reps)
                cols = ["n/a"] * 3 if t is None else [f"{t[0]:.1f}", f"{t[1]:.1f}",
                                                      f"{t[2]:.0%}"]
                tcols = ["-", "-"] if tt is None else [f"{tt[0]:.1f}", f"{tt[1]:.1f}"]
                print(f"| {'x'.join(map(str, shape))} | {axis} | {dt.value} | {op} | "
                      f"{desc} | {' | '.join(cols)} | {err:.1e} | {' | '.join(tcols)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
