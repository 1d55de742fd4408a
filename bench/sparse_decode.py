"""Block-sparse decode against dense decode on the same cache, one run, one device.

    python3 bench/sparse_decode.py [--lk 8192,32768,131072] [--shape B,Hq,Hkv,D[,s,Dv]]
                                   [--block 64] [--top-k 16] [--dtype f16|f32]
                                   [--quick] [--warm 1.0] [--reps 50] [--json FILE]

For each key length Lk, one decode row at the cache's last position (Lk - 1):

- ``sparse``: ``pootvk.attention(q, k, v, block_size=, top_k=, block_scores=)`` with the
  caller's block scores (a model that keeps per-block summaries passes these): the step is
  BlockTopK (the selection) + SelectedAttention over ``(top_k + 1) * block`` keys;
- ``sparse + indexer``: the same with ``block_scores=None``: each block scored in the graph by
  its mean key, which reads every key (O(Lk));
- ``dense``: ``pootvk.attention(q, k, v)`` over all Lk keys.

Each is replayed whole (every kernel of its plan, first to last timestamp) after >= ``--warm``
s back to back, median of ``--reps``; outputs are checked against float64 numpy (the sparse
ones against an independent loop-by-loop reference of the selection and the attention). The
SM clock is logged through NVML where ``pynvml`` imports. The goal (issue: block-sparse
attention): the sparse step's time follows ``top_k * block``, not Lk.

Note on caches: the selected K/V of a step, ``(top_k + 1) * block * Hkv * 2 * D`` bytes
(4.5 MB at the default shape), fit the H200's 60 MB L2, and back-to-back replays select the
same blocks, so the sparse rows read mostly from L2; the dense rows at Lk >= 32k do not fit.

``--quick`` (lavapipe, CI): small shapes, short warm-up, few reps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pootvk  # noqa: E402
from pootvk.benchmark import (  # noqa: E402
    SmClock,
    _public_replay,
    bench_device,
    dispatch_runs,
    nse,
    read_ceiling,
    reference,
    time_dispatches,
)
from pootvk.errors import PootvkError  # noqa: E402
from pootvk.plan import forced_schedule  # noqa: E402
from tests.sparse_ref import ref_attend, ref_select  # noqa: E402

TOL = 5e-4


def _time_public(device, warm_s: float, reps: int, clock: SmClock) -> dict:
    """The plan ``pootvk.attention`` just ran, replayed whole: median GPU us (first to last
    timestamp), and each kernel's own median us beside its description."""
    rp = _public_replay(device)
    if rp is None:
        return {"note": "the public path's replay was not found"}
    dispatches = list(rp.recording.dispatches)
    us, mhz, _ = time_dispatches(device, dispatches, warm_s=warm_s, reps=reps, clock=clock)
    per, _ = dispatch_runs(device, dispatches, warm_s=0.0, reps=reps, clock=clock,
                           what="the kernels")
    names = [d.label if hasattr(d, "label") else "" for d in dispatches]
    kernels = []
    for i, name in enumerate(names):
        t = statistics.median(x[i] for x in per) / 1e3 if per else float("nan")
        kernels.append(f"{name or 'kernel'} {t:.1f} us")
    rp.close()
    return {"us": us, "sm_mhz": mhz, "kernels": kernels}


def run_lk(device, shape, lk: int, bs: int, top_k: int, dtype, *, warm_s: float, reps: int,
           clock: SmClock, dense_check: bool, variants: list[dict]) -> list[dict]:
    """The sparse series and dense attention at one key length. ``shape`` is B,Hq,Hkv,D, or
    B,Hq,Hkv,D,s,Dv for latent attention's split key (k D - s wide, k_shared [B, 1, Lk, s]
    read once per key for every head, v Dv wide)."""
    b, hq, hkv, d = shape[:4]
    s, dv = (shape[4], shape[5]) if len(shape) == 6 else (0, d)
    rng = np.random.default_rng(lk)
    q = rng.standard_normal((b, hq, 1, d), dtype=np.float32)
    k = rng.standard_normal((b, hkv, lk, d - s), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((b, hkv, lk, dv), dtype=np.float32).astype(dtype)
    ks = rng.standard_normal((b, 1, lk, s), dtype=np.float32).astype(dtype) if s else None
    whole = k if ks is None else np.concatenate(
        [k, np.broadcast_to(ks, (b, hkv, lk, s))], axis=-1)  # the reference's key
    scores = rng.standard_normal((b, hkv, 1, lk // bs)).astype(np.float32)
    pos = np.full((b, 1), lk - 1, np.int32)
    rows = []
    item = np.dtype(dtype).itemsize
    per_key = (d - s + dv) * hkv + s  # elements of one key position read (k, v, k_shared)
    sel_bytes = b * (top_k + 1) * bs * per_key * item
    cases = [("sparse", scores, {}), ("sparse + indexer", None, {})]
    cases += [(f"sparse {json.dumps(f)}", scores, f) for f in variants]
    for name, sc, forced in cases:
        try:
            with forced_schedule(**forced):
                got = pootvk.attention(q, k, v, k_shared=ks, block_size=bs, top_k=top_k,
                                       block_scores=sc, positions=pos, device=device)
        except PootvkError as e:
            rows.append({"series": name, "lk": lk, "note": f"refused: {e}".splitlines()[0]})
            continue
        if sc is None:  # the in-graph indexer: each block's mean key . the group's query sum
            kf = whole.astype(np.float64).reshape(b, hkv, lk // bs, bs, d).mean(3)
            qs = q.astype(np.float64).reshape(b, hkv, hq // hkv, 1, d).sum(2)
            sc = (qs @ kf.transpose(0, 1, 3, 2)).astype(np.float32)
        ids = ref_select(sc, pos, bs, min(top_k, lk // bs))
        ref = ref_attend(q, whole, v, ids, pos, bs, d ** -0.5)
        row = {"series": name, "lk": lk, "nse": nse(got, ref), "bytes": sel_bytes}
        row.update(_time_public(device, warm_s, reps, clock))
        rows.append(row)
    got = pootvk.attention(q, k, v, k_shared=ks, device=device)
    row = {"series": "dense", "lk": lk, "bytes": b * lk * per_key * item}
    row["nse"] = nse(got, reference(q, whole, v)) if dense_check else 0.0
    row.update(_time_public(device, warm_s, reps, clock))
    rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lk", default=None, help="key lengths, comma separated")
    ap.add_argument("--shape", default="1,32,8,128",
                    help="B,Hq,Hkv,D, or B,Hq,Hkv,D,s,Dv: a split key (latent attention, "
                    "e.g. DeepSeek's 1,128,1,576,64,512)")
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=16)
    ap.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    ap.add_argument("--quick", action="store_true", help="small shapes, short warm-up (CI)")
    ap.add_argument("--warm", type=float, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--variants", default="[]",
                    help='JSON list of forced schedules for the sparse attention, e.g. '
                    '\'[{"schedule": "grouped", "rows_per_wg": 4}]\'')
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    lks = [int(x) for x in args.lk.split(",")] if args.lk else \
        ([1024, 4096] if args.quick else [8192, 32768, 131072])
    shape = tuple(int(x) for x in args.shape.split(","))
    if args.quick and args.shape == "1,32,8,128":
        shape = (1, 4, 2, 64)
    warm = args.warm if args.warm is not None else (0.05 if args.quick else 1.0)
    reps = args.reps or (5 if args.quick else 50)
    dtype = np.float16 if args.dtype == "f16" else np.float32
    device, clock = bench_device(args.device)
    ceiling = read_ceiling(device, nbytes=8 << 20 if args.quick else None,
                           reps=3 if args.quick else 10)
    b, hq, hkv, d = shape[:4]
    split = f" (k {d - shape[4]} + k_shared {shape[4]}, Dv {shape[5]})" if len(shape) == 6 \
        else ""
    print(f"read ceiling: {ceiling.gbps:.1f} GB/s over {ceiling.nbytes >> 20} MiB")
    print(f"shape: B={b} Hq={hq} Hkv={hkv} D={d}{split} {args.dtype} K/V, one query row at "
          f"position Lk-1; block {args.block}, top_k {args.top_k}: "
          f"{(args.top_k + 1) * args.block} keys visited")
    print(f"method: >= {warm:g} s back-to-back warm-up per case, median of {reps} whole-plan "
          f"replays (first to last timestamp); outputs checked against float64 (nse <= {TOL:g})",
          flush=True)
    rows = []
    for lk in lks:
        t0 = time.perf_counter()
        rows += run_lk(device, shape, lk, args.block, args.top_k, dtype, warm_s=warm,
                       reps=reps, clock=clock, dense_check=True,
                       variants=json.loads(args.variants))
        print(f"  Lk={lk}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    print("\n| Lk | series | us | vs dense | K/V bytes touched | GB/s | of ceiling | nse | "
          "SM MHz |")
    print("|---|---|---|---|---|---|---|---|---|")
    dense = {r["lk"]: r.get("us") for r in rows if r["series"] == "dense"}
    for r in rows:
        if "us" not in r:
            print(f"| {r['lk']} | {r['series']} | {r.get('note')} | | | | | | |")
            continue
        gbps = r["bytes"] / (r["us"] * 1e3)
        vs = f"{dense[r['lk']] / r['us']:.2f}x" if dense.get(r["lk"]) else "n/a"
        ok = "OK" if r["nse"] <= TOL else "FAILED"
        print(f"| {r['lk']} | {r['series']} | {r['us']:.1f} | {vs} | {r['bytes'] / 1e6:.1f} MB "
              f"| {gbps:.0f} | {gbps / ceiling.gbps:.1%} | {r['nse']:.1e} {ok} | "
              f"{r.get('sm_mhz')} |")
    sparse = [r for r in rows if r["series"] == "sparse" and "us" in r]
    if len(sparse) > 1:
        lo, hi = sparse[0], sparse[-1]
        print(f"\nsparse step: {lo['us']:.1f} us at Lk={lo['lk']}, {hi['us']:.1f} us at "
              f"Lk={hi['lk']} ({hi['us'] / lo['us']:.2f}x for {hi['lk'] / lo['lk']:.0f}x the "
              "keys)")
    for r in rows:
        if r.get("kernels"):
            print(f"kernels, {r['series']} Lk={r['lk']}: " + "; ".join(r["kernels"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": shape, "rows": rows}, default=str))
    ok = all(r.get("nse", math.inf) <= TOL for r in rows if "note" not in r)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
