"""MLA decode (split-key attention) against the read ceiling and torch, one run, one device.

    python3 bench/mla_decode.py [--shape B,Hq,Hkv,Lk,Dk,s,Dv] [--dtype f16|f32] [--quick]
                                [--warm 1.0] [--reps 50] [--no-sweep] [--separate-v]
                                [--variants JSON] [--json FILE]

The default shape is DeepSeek-V3's MLA decode step: B=1, Hq=128, Hkv=1, Dk=576 (k_nope 512 +
k_shared s=64), Dv=512, Lk=32768, F16 K/V. As in DeepSeek's absorbed form, v holds the same
latent values as k_nope (``--separate-v`` draws it independently); pootvk still binds and
reads k, k_shared and v as three buffers, and the bytes counted are exactly those:
B*Lk*((Dk-s)*Hkv + s + Dv*Hkv) * itemsize.

Measured in one run: the streaming-read ceiling (``pootvk.benchmark.read_ceiling``);
``pootvk.attention(q, k, v, k_shared=...)`` once per schedule (the planner's, then a sweep of
forced rows-per-workgroup / split counts unless ``--no-sweep``), each output checked against
float64 numpy over the whole key; the plan's kernels replayed with timestamps (K/V resident),
warmed back to back for >= ``--warm`` s, the median of ``--reps``; torch on CUDA where it
imports: the whole key materialised per call (``cat(k_nope, k_pe.expand)``) then
``scaled_dot_product_attention`` (enable_gqa), and the same as a manual matmul/softmax/matmul,
each captured in a CUDA graph and timed with CUDA events. The SM clock is logged through NVML
where ``pynvml`` imports. Every time is printed beside its fraction of the read ceiling, and
the achieved arithmetic rate (2*B*Hq*Lk*(Dk+Dv) FLOPs) beside it: at Hq/Hkv=128 this shape
does ~32 FLOPs per K/V byte, so the kernel is bound by arithmetic, not bytes.

``--quick`` (lavapipe, CI): a small shape, short warm-up, few reps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pootvk  # noqa: E402
from pootvk.benchmark import (  # noqa: E402
    SmClock,
    _public_replay,
    bench_device,
    dispatch_runs,
    read_ceiling,
    time_cuda_graph,
    torch_available,
)
from pootvk.plan import DecodeCombineRequest, DecodeRequest, forced_schedule  # noqa: E402
from pootvk.plan.requests import AttentionRequest  # noqa: E402
from pootvk.vk import Device  # noqa: E402

MLA = (1, 128, 1, 32768, 576, 64, 512)  # B, Hq, Hkv, Lk, Dk, s, Dv
QUICK = (1, 8, 1, 1024, 96, 32, 64)
TOL = 5e-4


def kv_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    b, _hq, hkv, lk, dk, s, dv = shape
    return b * lk * ((dk - s) * hkv + s + dv * hkv) * itemsize


def flops(shape: tuple[int, ...]) -> int:
    b, hq, _hkv, lk, dk, _s, dv = shape
    return 2 * b * hq * lk * (dk + dv)


def make_inputs(shape, dtype, separate_v: bool, seed: int = 0):
    b, hq, hkv, lk, dk, s, dv = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hq, 1, dk), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, dk - s), dtype=np.float32).astype(dtype)
    ks = rng.standard_normal((b, 1, lk, s), dtype=np.float32).astype(dtype)
    if separate_v or dv != dk - s:
        v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32).astype(dtype)
    else:
        v = k.copy()  # the absorbed latent: v = c_kv = k_nope (its own buffer on the device)
    return q, k, ks, v


def reference(q, k, ks, v) -> np.ndarray:
    """float64 softmax(q K^T / sqrt(Dk)) v over the whole key concat(k, broadcast(ks)), one
    (batch row, KV head) at a time."""
    b, hq, lq, dk = q.shape
    hkv = k.shape[1]
    n = hq // hkv
    out = np.empty((b, hq, lq, v.shape[3]), np.float64)
    for bi in range(b):
        shared = ks[bi, 0].astype(np.float64)
        for g in range(hkv):
            key = np.concatenate([k[bi, g].astype(np.float64), shared], axis=1)
            qq = q[bi, g * n:(g + 1) * n].reshape(n * lq, dk).astype(np.float64)
            s = qq @ key.T / math.sqrt(dk)
            s -= s.max(-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(-1, keepdims=True)
            out[bi, g * n:(g + 1) * n] = (p @ v[bi, g].astype(np.float64)).reshape(n, lq, -1)
    return out


def nse(got: np.ndarray, ref: np.ndarray) -> float:
    got = np.asarray(got, np.float64)
    if got.shape != ref.shape or not np.all(np.isfinite(got)):
        return math.inf
    return float(((got - ref) ** 2).sum() / max((ref**2).sum(), 1e-300))


def sweep(shape, default: DecodeRequest | None, compute_units: int | None) -> list[dict]:
    """Forced schedules around the planner's: rows per workgroup (how often each row block
    re-reads the K/V, against the per-lane register state) and split counts."""
    if default is None:
        return []
    if default.matrix:  # the tensor-core kernel: its workgroup and splits, and the scalar one
        base = default.workgroups // default.splits
        out = [{"schedule": "grouped", "local_size": 128}, {"schedule": "grouped", "matrix": 0},
               {"schedule": "grouped", "rows_per_wg": 8},
               {"schedule": "grouped", "rows_per_wg": 32},
               {"schedule": "grouped", "rows_per_wg": 32, "splits": 33},
               {"schedule": "grouped", "rows_per_wg": 32, "splits": 16},
               {"schedule": "grouped", "prefetch": False}]
        for sp in sorted({max(1, default.splits // 2), default.splits * 2,
                          -(-4 * (compute_units or 8) // max(1, base))} - {default.splits}):
            out.append({"schedule": "grouped", "splits": sp})
            out.append({"schedule": "grouped", "splits": sp, "local_size": 128})
        return out
    n_rep = shape[1] // shape[2]
    # (16 rows would hold ~1k floats per lane at Dk+Dv=1088: a pathological spill)
    rows = [r for r in (1, 2, 4, 8) if n_rep % r == 0 and r != default.rows_per_wg]
    out: list[dict] = [{"schedule": "grouped", "rows_per_wg": r} for r in rows]
    base = default.workgroups // default.splits
    for sp in sorted({max(1, default.splits // 2), default.splits * 2,
                      -(-4 * (compute_units or 8) // max(1, base))} - {default.splits}):
        out.append({"schedule": "grouped", "splits": sp})
    return out


def bench_pootvk(device: Device, shape, inputs, ref, ceiling_gbps: float, itemsize: int, *,
                 forced: dict, warm_s: float, reps: int, clock: SmClock) -> dict:
    q, k, ks, v = inputs
    row: dict[str, Any] = {"forced": forced or "planner"}
    try:
        with forced_schedule(**forced):
            got = pootvk.attention(q, k, v, k_shared=ks, device=device)
    except pootvk.PootvkError as e:
        row["note"] = f"refused: {type(e).__name__}: {e}".splitlines()[0]
        return row
    row["nse"] = nse(got, ref)
    rp = _public_replay(device)
    if rp is None:
        row["note"] = "the public path's replay was not found"
        return row
    kinds = (AttentionRequest, DecodeRequest, DecodeCombineRequest)
    idx = [i for i, kn in enumerate(rp.plan.kernels) if isinstance(kn.request, kinds)]
    row["kernels"] = [rp.plan.kernels[i].request.describe() for i in idx]
    main = rp.plan.kernels[idx[0]].request
    row["request"] = main
    try:
        runs, row["sm_mhz"] = dispatch_runs(
            device, list(rp.recording.dispatches), warm_s=warm_s, reps=reps, clock=clock,
            what=f"pootvk MLA {forced or 'planner'}", out=sys.stdout)
    finally:
        rp.close()
    if runs is None:
        row["note"] = "the device has no timestamps"
        return row
    times = [sum(ts[i] for i in idx) for ts in runs]
    us = statistics.median(times) / 1e3
    row.update(us=us, gbps=kv_bytes(shape, itemsize) / (us * 1e3))
    row["frac"] = row["gbps"] / ceiling_gbps
    row["tflops"] = flops(shape) / (us * 1e6)
    return row


def bench_torch(shape, inputs, ref, ceiling_gbps: float, itemsize: int, *, warm_s: float,
                reps: int, clock: SmClock, calls: int = 10) -> list[dict]:
    """torch with the whole key materialised per call: SDPA, and a manual matmul chain."""
    import torch
    import torch.nn.functional as F

    q, k, ks, v = inputs
    b, hq, hkv, lk, dk, s, dv = shape
    tdt = torch.float16 if k.dtype == np.float16 else torch.float32
    tq, tk, tks, tv = (torch.from_numpy(np.ascontiguousarray(x)).to("cuda", tdt)
                       for x in (q, k, ks, v))
    scale = 1.0 / math.sqrt(dk)

    def key():
        return torch.cat([tk, tks.expand(b, hkv, lk, s)], dim=-1)

    def sdpa():
        return F.scaled_dot_product_attention(tq, key(), tv, enable_gqa=True, scale=scale)

    def manual():
        kf = key()
        qg = tq.reshape(b, hkv, (hq // hkv), dk)
        sc = (qg @ kf.transpose(-1, -2)).float() * scale
        p = torch.softmax(sc, dim=-1).to(tdt)
        return (p @ tv).reshape(b, hq, 1, dv)

    rows = []
    for name, f in (("torch SDPA (key materialised)", sdpa),
                    ("torch matmul/softmax/matmul (key materialised)", manual)):
        row: dict[str, Any] = {"series": name}
        try:
            us, first = time_cuda_graph(
                f, calls=calls, reps=reps, warm_s=warm_s,
                after_warm=lambda name=name, row=row: row.update(
                    sm_mhz=clock.check(name, sys.stdout)))
            row["nse"] = nse(first.float().cpu().numpy(), ref)
            row.update(us=us, gbps=kv_bytes(shape, itemsize) / (us * 1e3))
            row["frac"] = row["gbps"] / ceiling_gbps
            row["tflops"] = flops(shape) / (us * 1e6)
        except Exception as e:  # one series' failure loses only its row
            row["note"] = f"failed: {type(e).__name__}: {e}".splitlines()[0]
        rows.append(row)
    return rows


def _shape(text: str) -> tuple[int, ...]:
    s = tuple(int(x) for x in text.split(","))
    if len(s) != 7 or min(s) < 1 or s[5] >= s[4] or s[1] % s[2]:
        raise argparse.ArgumentTypeError(f"{text!r}: want B,Hq,Hkv,Lk,Dk,s,Dv with s < Dk")
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=_shape, default=None, help="B,Hq,Hkv,Lk,Dk,s,Dv")
    ap.add_argument("--dtype", choices=("f16", "f32"), default="f16", help="K/V storage")
    ap.add_argument("--quick", action="store_true", help="small shape, short warm-up (CI)")
    ap.add_argument("--warm", type=float, default=None, help="s of warm-up per case (1)")
    ap.add_argument("--reps", type=int, default=None, help="timed replays, median (50)")
    ap.add_argument("--no-sweep", action="store_true", help="only the planner's schedule")
    ap.add_argument("--variants", default=None,
                    help='a JSON list of schedule overrides timed instead of the sweep, e.g. '
                    '\'[{"prefetch_steps": 3, "score_accumulators": 2}]\'')
    ap.add_argument("--separate-v", action="store_true", help="v independent of k_nope")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    shape = args.shape or (QUICK if args.quick else MLA)
    warm = args.warm if args.warm is not None else (0.05 if args.quick else 1.0)
    reps = args.reps or (5 if args.quick else 50)
    dtype = np.float16 if args.dtype == "f16" else np.float32
    itemsize = np.dtype(dtype).itemsize
    device, clock = bench_device(args.device)
    prof = device.profile
    coop = sorted(e for e in device.physical.extensions if "cooperative_matrix" in e)
    print(f"cooperative-matrix extensions (tensor cores from Vulkan): {', '.join(coop) or 'none'}")
    ceiling = read_ceiling(device, nbytes=8 << 20 if args.quick else None,
                           reps=3 if args.quick else 10)
    b, hq, hkv, lk, dk, s, dv = shape
    nbytes = kv_bytes(shape, itemsize)
    print(f"read ceiling: {ceiling.gbps:.1f} GB/s over {ceiling.nbytes >> 20} MiB")
    print(f"shape: B={b} Hq={hq} Hkv={hkv} Lk={lk} Dk={dk} (k {dk - s} + k_shared {s}) Dv={dv} "
          f"{args.dtype}; bytes read (k + k_shared + v) {nbytes / 1e6:.1f} MB; "
          f"{flops(shape) / 1e9:.2f} GFLOP ({flops(shape) / nbytes:.1f} FLOP/byte); v "
          f"{'independent' if args.separate_v else '= k_nope values (absorbed latent)'}")
    print(f"method: >= {warm:g} s back-to-back warm-up per case, median of {reps}; "
          f"outputs checked against float64 numpy (nse <= {TOL:g})", flush=True)
    t0 = time.perf_counter()
    inputs = make_inputs(shape, dtype, args.separate_v)
    ref = reference(*inputs)
    print(f"(float64 reference: {time.perf_counter() - t0:.1f} s)", flush=True)

    rows = [bench_pootvk(device, shape, inputs, ref, ceiling.gbps, itemsize, forced={},
                         warm_s=warm, reps=reps, clock=clock)]
    default = rows[0].get("request")
    if args.variants or not args.no_sweep:
        forced = [{"schedule": "grouped", **v} for v in json.loads(args.variants)] \
            if args.variants else \
            sweep(shape, default if isinstance(default, DecodeRequest) else None,
                  prof.compute_units)
        for f in forced:
            rows.append(bench_pootvk(device, shape, inputs, ref, ceiling.gbps, itemsize,
                                     forced=f, warm_s=warm, reps=reps, clock=clock))
            print(f"  {f}: {rows[-1].get('us', 'n/a')} us", file=sys.stderr, flush=True)
    why = torch_available()
    trows = [] if why else bench_torch(shape, inputs, ref, ceiling.gbps, itemsize,
                                       warm_s=warm, reps=reps, clock=clock)
    if why:
        print(f"torch skipped: {why}")

    best = min((r for r in rows if "us" in r), key=lambda r: r["us"], default=None)
    print("\n| series | schedule | us | GB/s | of ceiling | TFLOP/s | vs pootvk planner | "
          "nse | SM MHz |")
    print("|---|---|---|---|---|---|---|---|---|")
    planner_us = rows[0].get("us")

    def line(name: str, sched: str, r: dict) -> None:
        if "us" not in r:
            print(f"| {name} | {sched} | {r.get('note', 'n/a')} | | | | | "
                  f"{r.get('nse', 'n/a')} | |")
            return
        vs = f"{planner_us / r['us']:.2f}x" if planner_us else "n/a"
        ok = "OK" if r["nse"] <= TOL else "FAILED"
        print(f"| {name} | {sched} | {r['us']:.1f} | {r['gbps']:.1f} | {r['frac']:.1%} | "
              f"{r['tflops']:.3g} | {vs} | {r['nse']:.1e} {ok} | {r.get('sm_mhz')} |")

    for r in rows:
        req = r.get("request")
        sched = req.describe().split(" mask=none ")[-1] if req is not None else ""
        line("pootvk" + ("" if r["forced"] == "planner" else f" {r['forced']}"), sched, r)
    for r in trows:
        line(r["series"], "", r)
    if best is not None and planner_us:
        print(f"\nbest pootvk schedule: {best['us']:.1f} us, {best['frac']:.1%} of the read "
              f"ceiling ({best['forced']}); the planner's: {rows[0]['frac']:.1%}")
    if clock.max_mhz and prof.compute_units and "NVIDIA" in device.name:
        # Hopper/Ampere SMs: 128 FP32 lanes, one FMA (2 FLOPs) per lane per clock
        peak = prof.compute_units * 128 * 2 * clock.max_mhz * 1e6
        floor_us = flops(shape) / peak * 1e6
        print(f"FP32 FMA peak {peak / 1e12:.1f} TFLOP/s ({prof.compute_units} SMs x 128 lanes "
              f"x 2 x {clock.max_mhz} MHz): no FP32 kernel runs this shape under "
              f"{floor_us:.1f} us = {nbytes / (floor_us * 1e3) / ceiling.gbps:.1%} of the "
              "read ceiling (tensor cores, i.e. cooperative matrices, are the way past it)")
    ok = all(r.get("nse", math.inf) <= TOL for r in rows if "us" in r)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"device": device.name, "ceiling_gbps": ceiling.gbps, "shape": shape,
             "dtype": args.dtype, "bytes": nbytes, "flops": flops(shape), "warm_s": warm,
             "reps": reps, "pootvk": rows, "torch": trows}, indent=1, default=str))
        print(f"wrote {args.json}")
    print("all pootvk outputs match the reference" if ok else "SOME POOTVK OUTPUTS ARE WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
