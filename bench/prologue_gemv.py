"""A GEMV with an RMSNorm prologue (``y = rms_norm(x) @ W^T``, F16 W [N, K]) under launch
shapes, and the same with the RMSNorm as its own kernel: what a row prologue costs when
every workgroup recomputes the row (SmolLM2's LM head: N=49152, K=576, 56.6 MB).

    python3 bench/prologue_gemv.py [--shapes 576,49152;576,3072] [--groups 2,4,8,16,32]
        [--warm 1.0] [--reps 30] [--quick]

Per shape and variant: GPU time of the step (timestamps around it, warmed, median), the
weight bytes over that time against the device's read ceiling; each output checked against
float64 numpy first.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pootvk.benchmark import SmClock, read_ceiling, time_dispatches  # noqa: E402
from pootvk.ir import F16, F32  # noqa: E402
from pootvk.ops import Builder  # noqa: E402
from pootvk.plan import MatMulRequest, forced_matmul  # noqa: E402
from pootvk.runtime import build_replay, resolve_device  # noqa: E402

EPS = 1e-5


def graph(k: int, n: int):
    b = Builder()
    x = b.input("x", (1, k))
    h = b.rms_norm(x, b.param("g", (k,)), EPS)
    w = b.param("w", (n, k), F16)
    b.export("y", b.matmul(h, b.transpose(b.convert(w, F32), (1, 0))))
    return b.build()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="576,49152;576,3072;576,960")
    ap.add_argument("--groups", default="2,4,8,16,32")
    ap.add_argument("--variants", default=None,
                    help="a JSON list of forced GEMV fields, e.g. '[{\"lanes\": 8, \"outs\": 2}]' "
                         "(in place of --groups)")
    ap.add_argument("--warm", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true", help="small shapes, short warm (lavapipe)")
    a = ap.parse_args(argv)
    if a.quick:
        a.shapes, a.groups, a.warm, a.reps = "64,256", "2,4", 0.05, 3
    device = resolve_device(a.device)
    clock = SmClock(device.name)
    ceiling = read_ceiling(device)
    print(f"device: {device.name}; read ceiling {ceiling.gbps:.0f} GB/s; "
          f"{clock.note or f'SM clock max {clock.max_mhz} MHz'}")
    rng = np.random.default_rng(0)
    base_cfg = device.config
    for shape in a.shapes.split(";"):
        k, n = (int(s) for s in shape.split(","))
        x = rng.standard_normal((1, k), np.float32)
        g = (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)
        w = (rng.standard_normal((n, k), np.float32) / np.sqrt(k)).astype(np.float16)
        h = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean() + EPS) * g
        ref = h @ w.astype(np.float64).T
        variants: list[tuple[str, bool, dict]] = [("planned", True, {})]
        if a.variants:
            variants += [(" ".join(f"{k}={v}" for k, v in f.items()), True, f)
                         for f in json.loads(a.variants)]
        else:
            variants += [(f"groups={gr}", True, {"groups": int(gr)})
                         for gr in a.groups.split(",")]
        variants.append(("norm kernel + planned GEMV", False, {}))
        for name, pro, fields in variants:
            device.config = replace(base_cfg, linear_prologues=pro)
            try:
                with forced_matmul(**fields):
                    rp = build_replay(graph(k, n), device)
            finally:
                device.config = base_cfg
            try:
                rp.set_params({"g": g, "w": w})
                y = rp.step({"x": x})["y"]
                err = float(((y - ref) ** 2).sum() / (ref**2).sum())
                assert err < 5e-4, (name, err)
                mm = [kn.request for kn in rp.plan.kernels if isinstance(kn.request, MatMulRequest)]
                us, mhz, _ = time_dispatches(device, list(rp.recording.dispatches),
                                             warm_s=a.warm, reps=a.reps, clock=clock)
                frac = w.nbytes / (us * 1e-6) / (ceiling.gbps * 1e9)
                r = mm[0]
                print(f"K={k} N={n} W {w.nbytes / 1e6:.1f} MB  {name:28s} "
                      f"kernels {len(rp.plan.kernels)} wg {r.grid[0] * r.grid[1]:6d} "
                      f"(lanes {r.lanes} groups {r.groups} outs {r.outs} unroll {r.unroll})"
                      f"  {us:8.2f} us  "
                      f"{frac:6.1%} of ceiling  nse {err:.1e}  SM {mhz} MHz", flush=True)
            finally:
                rp.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
