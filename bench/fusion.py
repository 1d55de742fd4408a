"""Fusion benchmark: each chain unfused (one kernel per primitive) against fused, one run.

    python3 bench/fusion.py [--quick] [--warm 0.5] [--reps 50] [--json FILE]

Chains (F32, and F16 storage where the device has it): RMSNorm ``x * rsqrt(mean(x^2) + eps)
* w`` over [rows, hidden], SwiGLU's elementwise part ``silu(g) * u`` (g and u given: the
matmuls are not what fusion changes) and a row softmax. For each: the kernel count, the
median GPU time of ``--reps`` replays (timestamps, first to last dispatch) after ``--warm``
seconds of back-to-back replays, and the effective bandwidth of the fused plan over the
bytes a perfect kernel must move (inputs read once, output written once). Both plans'
outputs are checked against the oracle (normalised squared error <= 5e-4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pootvk.ir import F16, F32, DType, Graph, SlotKind  # noqa: E402
from pootvk.ops import Builder  # noqa: E402
from pootvk.oracle import evaluate  # noqa: E402
from pootvk.passes import canonicalize, compile_graph  # noqa: E402
from pootvk.plan import plan_graph  # noqa: E402
from pootvk.runtime.replay import Replay  # noqa: E402
from pootvk.shaders.generate import compile_plan  # noqa: E402
from pootvk.vk import default_device  # noqa: E402


def _inputs(b: Builder, dt: DType, *specs: tuple[str, tuple[int, ...]]) -> list:
    vals = [b.input(n, s, dt) for n, s in specs]
    return vals if dt is F32 else [b.convert(v, F32) for v in vals]


def _out(b: Builder, y, dt: DType) -> Graph:  # type: ignore[no-untyped-def]
    b.export("y", y if dt is F32 else b.convert(y, dt))
    return b.build()


def rms_norm(rows: int, hidden: int, dt: DType) -> Graph:
    b = Builder()
    x, w = _inputs(b, dt, ("x", (rows, hidden)), ("w", (hidden,)))
    ms = b.mul(b.reduce("Sum", b.mul(x, x), 1), 1.0 / hidden)
    return _out(b, b.mul(b.mul(x, b.unary("Rsqrt", b.add(ms, 1e-5))), w), dt)


def swiglu(rows: int, width: int, dt: DType) -> Graph:
    b = Builder()
    g, u = _inputs(b, dt, ("g", (rows, width)), ("u", (rows, width)))
    return _out(b, b.mul(b.unary("Silu", g), u), dt)


def softmax(rows: int, n: int, dt: DType) -> Graph:
    b = Builder()
    (s,) = _inputs(b, dt, ("s", (rows, n)))
    ex = b.unary("Exp", b.sub(s, b.reduce("Max", s, 1)))
    return _out(b, b.div(ex, b.reduce("Sum", ex, 1)), dt)


FULL = [("rms_norm", rms_norm, (1, 4096)), ("rms_norm", rms_norm, (512, 4096)),
        ("rms_norm", rms_norm, (1, 8192)), ("swiglu", swiglu, (1, 14336)),
        ("swiglu", swiglu, (512, 14336)), ("softmax", softmax, (32, 4096)),
        ("softmax", softmax, (1, 128256))]
QUICK = [("rms_norm", rms_norm, (2, 256)), ("swiglu", swiglu, (2, 512)),
         ("softmax", softmax, (4, 300))]


def _nse(got: np.ndarray, ref: np.ndarray) -> float:
    d = got.astype(np.float64) - ref.astype(np.float64)
    return float((d**2).sum() / max((ref.astype(np.float64) ** 2).sum(), 1e-30))


def time_plan(dev, g: Graph, ins: dict, warm: float, reps: int) -> dict:  # type: ignore[no-untyped-def]
    plan = plan_graph(g, dev.profile)
    with Replay(dev, plan, compile_plan(plan), timestamps=True) as rp:
        out = rp.step(ins)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warm:
            rp.step(ins)
        times = []
        for _ in range(reps):
            rp.step(ins)
            ns = rp.gpu_time_ns()
            if ns is not None:
                times.append(ns)
    return {"kernels": len(plan.kernels), "us": statistics.median(times) / 1e3 if times else None,
            "out": out["y"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (lavapipe, seconds)")
    ap.add_argument("--warm", type=float, default=0.5)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = default_device()
    dtypes = [F32] + ([F16] if dev.profile.extra.get("storage_buffer_16bit") else [])
    rows = []
    print(f"device: {dev.name}")
    print(f"{'chain':<9} {'shape':<12} {'dt':<4} {'kernels':>9} {'unfused us':>11} "
          f"{'fused us':>9} {'speedup':>8} {'fused GB/s':>11}")
    for name, make, shape in QUICK if args.quick else FULL:
        for dt in dtypes:
            g = make(*shape, dt)
            rng = np.random.default_rng(0)
            ins = {s.name: rng.standard_normal(s.var.shape).astype(dt.numpy)
                   for s in g.slots if s.kind is SlotKind.INPUT}
            ref = evaluate(g, ins)["y"]
            res = {}
            for form, c in (("unfused", canonicalize(g)), ("fused", compile_graph(g))):
                r = time_plan(dev, c, ins, args.warm, args.reps)
                err = _nse(r.pop("out"), ref)
                assert err <= 5e-4, f"{name} {shape} {dt} {form}: nse {err:.2e}"
                res[form] = r
            nbytes = sum(v.nbytes for v in ins.values()) + ref.size * dt.device_itemsize
            u, f = res["unfused"]["us"], res["fused"]["us"]
            speed = f"{u / f:.2f}x" if u and f else "n/a"
            gbs = f"{nbytes / f / 1e3:.1f}" if f else "n/a"
            print(f"{name:<9} {'x'.join(map(str, shape)):<12} {dt.value:<4} "
                  f"{res['unfused']['kernels']:>4} -> {res['fused']['kernels']:<2} "
                  f"{u or float('nan'):>11.1f} {f or float('nan'):>9.1f} {speed:>8} {gbs:>11}")
            rows.append({"chain": name, "shape": shape, "dtype": dt.value, "bytes": nbytes,
                         **{f"{k}_{m}": v[m] for k, v in res.items() for m in v}})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
