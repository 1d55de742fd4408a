"""TopK and BlockTopK kernels alone: per-kernel GPU time on one device, in one run.

    python3 bench/topk.py [--n 128,512,2048,8192] [--rows 8,64] [--k 16] [--block 64]
                          [--variants plan|all|NAME,...] [--calls 1] [--quick]
                          [--warm 1.0] [--reps 50] [--device D] [--json FILE]

Each case is one graph of one kernel, planned for the device as ``pootvk`` plans it:

- ``TopK``: ``b.topk(x, k)`` over ``rows`` rows of ``N`` standard-normal f32 scores;
- ``BlockTopK``: ``BlockTopK(scores [1, rows, 1, N], qpos)`` with block size ``--block`` at
  ``qpos = N * block - 1`` (a decode row at the cache's last position: every block but the
  row's own, unfinished one is eligible, so the selection runs over N - 1 scores).

Each case's output is checked against the oracle (``pootvk.oracle``) for exact equality,
before and after the timing; any mismatch makes the exit status 1. Timing: the case's
recorded dispatches re-recorded with a timestamp after every dispatch (``--calls`` copies
back to back in one command buffer, each behind the barrier its hazards need), submitted
back to back for >= ``--warm`` s (the GPU clocks up), then the kernel's median time over
``--reps`` submits. The SM clock is read after each warm-up through NVML
(``pootvk.benchmark.SmClock``) where ``pynvml`` imports. A ``floor`` row times an
elementwise kernel of 8 values the same way: the launch and timestamp cost no kernel
avoids.

``--variants``: ``plan`` (the planner's choice), or names of forced variants
(``plan.topk_rules.forced_topk``): ``subgroup`` / ``shared`` (the prefix sums on subgroup
shuffles / through workgroup memory, the row in registers where it fits),
``stream-subgroup`` / ``stream-shared`` (the row re-read from memory every radix pass);
``all`` is every one of them; or fields joined by ``+`` (``lanes=64``,
``lanes=128+subgroup=0``, ``registers=0``: the workgroup width and the rest by hand).
``--quick`` (lavapipe, CI): short rows, a short warm-up, few reps.
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

from pootvk.benchmark import SmClock, dispatch_runs, per_launch_ns  # noqa: E402
from pootvk.errors import PootvkError  # noqa: E402
from pootvk.ir import F32, I32  # noqa: E402
from pootvk.ir import prims as P  # noqa: E402
from pootvk.ops import Builder  # noqa: E402
from pootvk.oracle import evaluate  # noqa: E402
from pootvk.plan.topk import TopKRequest  # noqa: E402
from pootvk.plan.topk_rules import FORCIBLE, forced_topk  # noqa: E402
from pootvk.runtime import build_replay, resolve_device  # noqa: E402

#: forced_topk fields of each variant (``plan``: none)
VARIANTS: dict[str, dict[str, object]] = {
    "plan": {},
    "subgroup": {"subgroup": True},
    "shared": {"subgroup": False},
    "stream-subgroup": {"subgroup": True, "registers": False},
    "stream-shared": {"subgroup": False, "registers": False},
}
KERNELS = ("TopK", "BlockTopK")


def variant_fields(name: str) -> dict[str, object]:
    """A named variant's forced fields, or ``field=value[+field=value...]`` (ints; 0/1 for
    ``subgroup`` and ``registers``)."""
    if name in VARIANTS:
        return VARIANTS[name]
    out: dict[str, object] = {}
    for part in name.split("+"):
        key, eq, value = part.partition("=")
        if not eq or key not in FORCIBLE or not value.isdigit():
            raise ValueError(f"variant {name!r}: not a name from {list(VARIANTS)} nor "
                             f"field=value[+...] over {FORCIBLE}")
        out[key] = int(value) if key == "lanes" else bool(int(value))
    return out


def graph_and_inputs(kernel: str, n: int, rows: int, k: int, bs: int,
                     rng: np.random.Generator):
    """One kernel's graph and a step's inputs."""
    b = Builder()
    if kernel == "TopK":
        x = rng.standard_normal((rows, n)).astype(np.float32)
        b.export("y", b.topk(b.input("x", x.shape, F32), k))
        return b.build(), {"x": x}
    s = rng.standard_normal((1, rows, 1, n)).astype(np.float32)
    q = np.array([[n * bs - 1]], np.int32)
    sv, qv = b.input("s", s.shape, F32), b.input("qpos", q.shape, I32)
    b.export("y", b.emit(P.BLOCK_TOPK, [sv, qv], block_size=bs, top_k=k))
    return b.build(), {"s": s, "qpos": q}


def floor_case():
    """An elementwise kernel of 8 values: what a launch and its timestamps cost."""
    b = Builder()
    b.export("y", b.neg(b.input("x", (8,), F32)))
    return b.build(), {"x": np.arange(8, dtype=np.float32)}


def time_case(device, g, inputs, pick, *, warm_s: float, reps: int, calls: int,
              clock: SmClock, what: str) -> dict:
    """Build ``g``, check it against the oracle, time its kernel ``pick(request)`` picks."""
    row: dict = {}
    want = evaluate(g, inputs)
    rp = build_replay(g, device)
    try:
        kernels = rp.plan.kernels
        idx = [i for i, kn in enumerate(kernels) if pick(kn.request)]
        if len(idx) != 1:
            row["note"] = f"{len(idx)} kernels of {len(kernels)} are the one to time"
            row["ok"] = False
            return row
        (i,) = idx
        row["schedule"] = kernels[i].request.describe()
        row["ok"] = same(rp.step(inputs), want)
        dispatches = list(rp.recording.dispatches)
        if len(dispatches) != len(kernels):
            row["note"] = f"{len(dispatches)} dispatches for {len(kernels)} kernels"
            row["ok"] = False
            return row
        runs, row["sm_mhz"] = dispatch_runs(device, dispatches * calls, warm_s=warm_s,
                                            reps=reps, clock=clock, what=what, out=sys.stdout)
        if runs is None:
            row["note"] = "the device has no timestamps"
            return row
        row["us"] = statistics.median(per_launch_ns(t, len(dispatches), calls)[i]
                                      for t in runs) / 1e3
        row["ok"] = row["ok"] and same(rp.step(inputs), want)  # still right after the reps
    finally:
        rp.close()
    return row


def same(got: dict, want: dict) -> bool:
    return all(np.array_equal(got[name], want[name]) for name in want)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default=None, help="row lengths N, comma separated")
    ap.add_argument("--rows", default=None, help="row counts, comma separated")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--block", type=int, default=64, help="BlockTopK's block size")
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--variants", default="plan",
                    help=f"plan, all, or names from {', '.join(VARIANTS)}")
    ap.add_argument("--calls", type=int, default=1,
                    help="copies of the kernel recorded back to back in one submit")
    ap.add_argument("--quick", action="store_true", help="short rows, short warm-up (CI)")
    ap.add_argument("--warm", type=float, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.n.split(",")] if args.n else \
        ([128, 512, 2048] if args.quick else [128, 512, 2048, 8192])
    rows_list = [int(x) for x in args.rows.split(",")] if args.rows else \
        ([8] if args.quick else [8, 64])
    variants = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    try:
        forced = {v: variant_fields(v) for v in variants}
    except ValueError as e:
        ap.error(str(e))
    kernels = args.kernels.split(",")
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        ap.error(f"unknown kernels: {bad} (known: {KERNELS})")
    warm = args.warm if args.warm is not None else (0.05 if args.quick else 1.0)
    reps = args.reps or (3 if args.quick else 50)
    calls = max(1, args.calls)
    device = resolve_device(args.device)
    prof = device.profile
    clock = SmClock(device.name)
    print(f"device: {device.name} ({prof.device_type}, {prof.driver}, subgroup "
          f"{prof.subgroup_size} {'with' if prof.subgroup_shuffle else 'without'} shuffles)")
    print(clock.note or f"SM clock: {clock.sm_mhz()} MHz now, maximum {clock.max_mhz} MHz")
    print(f"method: K={args.k} (BlockTopK: block {args.block}, qpos = N*{args.block}-1); "
          f">= {warm:g} s back-to-back warm-up per case, then the kernel's median time over "
          f"{reps} submits of {calls} cop{'y' if calls == 1 else 'ies'} (timestamps around "
          "each dispatch); every output checked against the oracle, exactly", flush=True)

    results = []
    fg, fin = floor_case()
    r = time_case(device, fg, fin, lambda req: True, warm_s=warm, reps=reps, calls=calls,
                  clock=clock, what="floor")
    results.append({"n": 8, "rows": 1, "kernel": "floor (Neg of 8)", "variant": "plan", **r})
    for n in ns:
        for rows in rows_list:
            for kernel in kernels:
                k = min(args.k, n)
                for variant in variants:
                    t0 = time.perf_counter()
                    g, ins = graph_and_inputs(kernel, n, rows, k, args.block,
                                              np.random.default_rng(n * 131 + rows))
                    what = f"{kernel} N={n} rows={rows} {variant}"
                    try:
                        with forced_topk(**forced[variant]):
                            r = time_case(device, g, ins,
                                          lambda req: isinstance(req, TopKRequest),
                                          warm_s=warm, reps=reps, calls=calls, clock=clock,
                                          what=what)
                    except PootvkError as e:
                        r = {"note": f"refused: {type(e).__name__}: {e}".splitlines()[0],
                             "ok": variant != "plan"}  # only a forced variant may be refused
                    results.append({"n": n, "rows": rows, "kernel": kernel,
                                    "variant": variant, "k": k, **r})
                    print(f"  {what}: {r.get('us', float('nan')):.2f} us "
                          f"{'OK' if r.get('ok') else 'MISMATCH'} "
                          f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    print("\n| N | rows | kernel | us | SM MHz | variant | schedule | check |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        us = f"{r['us']:.2f}" if "us" in r else r.get("note", "n/a")
        check = "exact" if r.get("ok") and "us" in r else \
            ("MISMATCH" if not r.get("ok") else "n/a")
        sched = r.get("schedule", r.get("note", "")) if "us" in r else r.get("schedule", "")
        print(f"| {r['n']} | {r['rows']} | {r['kernel']} | {us} | {r.get('sm_mhz')} | "
              f"{r['variant']} | {sched} | {check} |")
    failed = [r for r in results if not r.get("ok")]
    for r in failed:
        print(f"FAILED: {r['kernel']} N={r['n']} rows={r['rows']} {r['variant']}: "
              f"{r.get('note', 'output differs from the oracle')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device.name, "rows": results},
                                              default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
