"""Live-length decode: a DecodeLoop step costs the sequence length, not the cache capacity.

    python3 bench/live_decode.py [--device N] [--quick] [--capacity 32768]
        [--lengths 1024,8192,32768] [--reps 50] [--warm 2]

One run on one device (issue 8): the streaming-read ceiling (``pootvk.benchmark``), then a
``DecodeLoop`` step (B=1, Hq=32, Hkv=8, D=128, float16 K/V over a 32k-capacity cache) timed
by GPU timestamps over its whole recording (cache writes, length, attention):

- at 1k keys in the live form (the default) and in the capacity form (``live=False``: a
  causal mask over every slot), with their ratio;
- in the live form at 1k/8k/32k keys.

Each row gives the bytes the step's attention actually reads (K/V of the visited keys; the
capacity form reads every slot plus its mask), the time that many bytes take at the read
ceiling, and the fraction of the ceiling reached ("L2": the bytes fit the H200's 60 MB L2,
so back-to-back steps may read the cache and pass the ceiling). The caches hold random
values (a zeroed buffer can read faster than DRAM allows on GPUs that compress memory). The
live and capacity outputs of the same step are compared (normalised squared error).
``--quick``: a small shape for lavapipe.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pootvk.benchmark import L2_FIT_BYTES, read_ceiling  # noqa: E402
from pootvk.llm import DecodeLoop  # noqa: E402
from pootvk.runtime import resolve_device  # noqa: E402

FULL = {"shape": (1, 32, 8, 128), "capacity": 32768, "lengths": (1024, 8192, 32768)}
QUICK = {"shape": (1, 4, 2, 32), "capacity": 2048, "lengths": (128, 1024, 2048)}


def time_step(loop: DecodeLoop, length: int, args, warm_s: float, reps: int):
    """Median GPU and wall microseconds of a step that attends over ``length`` keys."""
    b, hq, hkv, d = loop.shape[:4]
    rng = np.random.default_rng(length)
    q = rng.standard_normal((b, hq, 1, d), dtype=np.float32)
    kn = rng.standard_normal((b, hkv, 1, d)).astype(np.float16)
    vn = rng.standard_normal((b, hkv, 1, d)).astype(np.float16)
    end = time.perf_counter() + warm_s
    while True:  # load clocks the GPU up
        loop.seek(length - 1)
        out = loop.step(q, kn, vn)
        if time.perf_counter() >= end:
            break
    gpu, wall, per = [], [], []
    for _ in range(reps):
        loop.seek(length - 1)
        t0 = time.perf_counter()
        loop.step(q, kn, vn)
        wall.append((time.perf_counter() - t0) * 1e6)
        gpu.append((loop.gpu_time_ns() or float("nan")) / 1e3)
        per.append(loop.dispatch_times_ns() or [])
    labels = [lab for lab, _ in per[0]] if per and per[0] else []
    med = [statistics.median(p[i][1] for p in per) / 1e3 for i in range(len(labels))]
    print(f"  {length} keys, GPU us per dispatch: "
          + " + ".join(f"{lab} {t:.1f}" for lab, t in zip(labels, med, strict=True)))
    return statistics.median(gpu), statistics.median(wall), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--capacity", type=int)
    ap.add_argument("--lengths", type=lambda s: tuple(int(x) for x in s.split(",")))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warm", type=float, default=2.0)
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    cap = args.capacity or cfg["capacity"]
    lengths = args.lengths or cfg["lengths"]
    warm = min(args.warm, 0.2) if args.quick else args.warm
    reps = min(args.reps, 5) if args.quick else args.reps
    b, hq, hkv, d = cfg["shape"]
    dev = resolve_device(args.device)
    ceil = read_ceiling(dev)
    print(f"device: {dev.name}; read ceiling {ceil.gbps:.1f} GB/s over "
          f"{ceil.nbytes >> 20} MiB")
    print(f"DecodeLoop B={b} Hq={hq} Hkv={hkv} D={d} float16 K/V, capacity {cap}\n")
    rng = np.random.default_rng(0)
    kc = rng.standard_normal((b, hkv, cap, d)).astype(np.float16)
    vc = rng.standard_normal((b, hkv, cap, d)).astype(np.float16)
    kv_row = b * hkv * 2 * d * 2  # K + V bytes of one key, every KV head

    def row(mode: str, n: int, gpu: float, wall: float, nbytes: int) -> list[str]:
        at_ceiling = nbytes / ceil.gbps / 1e3  # gbps is bytes per ns
        return [mode, str(n), f"{gpu:.1f}", f"{wall:.1f}", f"{nbytes / 1e6:.2f}",
                "yes" if nbytes <= L2_FIT_BYTES else "no", f"{at_ceiling:.1f}",
                f"{at_ceiling / gpu:.2f}"]

    rows, res = [], {}
    for live in (True, False):
        todo = lengths if live else (lengths[0],)
        with DecodeLoop(b, hq, hkv, d, cap, device=dev, kv_dtype="float16",
                        timestamps=True, live=live) as loop:
            loop.seek(0, kc, vc)
            kernel = [k.request.describe() for k in loop.plan.kernels][-1]
            print(f"{'live' if live else 'capacity'} attention kernel: {kernel}")
            for n in todo:
                gpu, wall, out = time_step(loop, n, args, warm, reps)
                nbytes = n * kv_row if live else cap * kv_row + cap * 4
                res[(live, n)] = (gpu, out)
                rows.append(row("live" if live else "capacity", n, gpu, wall, nbytes))
    head = ["form", "keys", "step GPU us", "step wall us", "attention MB read", "L2",
            "us at ceiling", "fraction of ceiling"]
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    n0 = lengths[0]
    (lg, lo), (cg, co) = res[(True, n0)], res[(False, n0)]
    err = float(((lo - co) ** 2).sum() / max((co**2).sum(), 1e-30))
    print(f"\nlive / capacity at {n0} keys: {lg / cg:.3f} of the time "
          f"({cg / lg:.1f}x faster); outputs agree: nse {err:.1e}")
    for n in lengths[1:]:
        print(f"live {n} / live {n0} keys: time x{res[(True, n)][0] / lg:.2f} "
              f"for x{n / n0:.0f} the keys")
    return 0 if err <= 5e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
