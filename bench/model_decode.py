"""Decode throughput of the Llama-shaped test model: replay against re-recording each step.

    python3 bench/model_decode.py [--quick] [--layers 4 --hidden 256 --intermediate 512
        --q-heads 8 --kv-heads 2 --head-dim 64 --vocab 512 --capacity 512]
        [--dtype float32|float16] [--steps 64] [--warmup 4] [--warm 1.0] [--check 4]
        [--json FILE]

One model (``pootvk.llm.LlamaModel``: seeded random weights, recorded once) decodes greedily
in two modes on the same device:

* replay: the one recording is resubmitted every token (what pootvk does);
* rerecord: the command buffer is recorded again before every token (descriptor sets and
  commands), what a runtime without replay pays;
* program order: replay with the dispatches recorded in the plan's order instead of level
  by level (``vk.hazards.level_order``); the plan line gives both orders' barrier counts.

Each mode first steps back to back for ``--warm`` seconds (GPU clocks up). For each mode it
prints tokens/s (wall time per token, host argmax included), the median
GPU time per token (timestamps) and the host time per token (wall minus GPU). ``--check N``
first compares N steps' logits with the numpy oracle (normalised squared error <= 5e-4) so
a fast wrong answer is never reported. ``--quick`` is a tiny model for lavapipe.
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

from pootvk.benchmark import SmClock  # noqa: E402
from pootvk.llm import LlamaConfig, LlamaModel, OracleLlama, random_weights  # noqa: E402

TOL = 5e-4


def _nse(a: np.ndarray, b: np.ndarray) -> float:
    d = a.astype(np.float64) - b
    return float((d * d).sum() / max(float((b.astype(np.float64) ** 2).sum()), 1e-30))


def warm(model: LlamaModel, seconds: float) -> None:
    """Step back to back for ``seconds``: a GPU idles at a low clock until it has load (the
    H200 at 345 of 1980 MHz), and an unwarmed step is timed at that clock."""
    token, end = 1, time.perf_counter() + seconds
    while time.perf_counter() < end:
        if model.position >= model.cfg.capacity:
            model.reset()
        token = int(np.argmax(model.step(token)))


def run_mode(model: LlamaModel, steps: int, warmup: int, rerecord: bool,
             warm_s: float = 0.0, clock: SmClock | None = None) -> dict:
    warm(model, warm_s)
    model.reset()
    token = 1
    walls, gpus = [], []
    for i in range(warmup + steps):
        if model.position >= model.cfg.capacity:
            model.reset()
        t0 = time.perf_counter()
        if rerecord:
            model.program.rerecord()
        logits = model.step(token)
        token = int(np.argmax(logits))
        wall = time.perf_counter() - t0
        if i >= warmup:
            walls.append(wall)
            g = model.program.gpu_time_ns()
            if g is not None:
                gpus.append(g * 1e-9)
    wall = statistics.median(walls)
    gpu = statistics.median(gpus) if gpus else None
    return {
        "tokens_per_s": 1.0 / wall,
        "wall_ms": wall * 1e3,
        "gpu_ms": None if gpu is None else gpu * 1e3,
        "host_ms": None if gpu is None else (wall - gpu) * 1e3,
        "recordings": model.recordings,
        "sm_mhz": None if clock is None else clock.sm_mhz(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model (lavapipe)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--q-heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--capacity", type=int, default=512)
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--check", type=int, default=4, help="steps checked against the oracle")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--warm", type=float, default=1.0, help="s of back-to-back steps first")
    a = ap.parse_args(argv)
    if a.quick:
        a.layers, a.hidden, a.intermediate, a.vocab, a.capacity = 2, 128, 256, 256, 64
        a.q_heads, a.kv_heads, a.head_dim, a.steps, a.warmup = 4, 2, 32, 16, 2
        a.warm = min(a.warm, 0.1)
    cfg = LlamaConfig(layers=a.layers, q_heads=a.q_heads, kv_heads=a.kv_heads,
                      head_dim=a.head_dim, hidden=a.hidden, intermediate=a.intermediate,
                      vocab=a.vocab, capacity=a.capacity, weight_dtype=a.dtype)
    weights = random_weights(cfg, seed=0)
    t0 = time.perf_counter()
    model = LlamaModel(cfg, weights, a.device, timestamps=True)
    build_s = time.perf_counter() - t0
    plan = model.program.plan
    barriers = {}
    for order in ("program", "level"):  # leaves the model recorded in level order
        model.program.rerecord(program_order=order == "program")
        barriers[order] = model.program.barriers
    print(f"device: {model.program.device.profile.name}")
    print(f"model: {cfg}")
    print(f"plan: {len(plan.kernels)} kernels, arena peak {plan.arena.peak_bytes} B "
          f"(colouring saves {plan.arena_saved_bytes} B); built and recorded in {build_s:.2f} s; "
          f"barriers per step {barriers['level']} in level order, {barriers['program']} in the "
          "plan's order")
    worst = None
    if a.check:
        oracle = OracleLlama(cfg, weights)
        errs = [_nse(model.step(t), oracle.step(t)) for t in range(1, a.check + 1)]
        worst = max(errs)
        print(f"check: {a.check} steps vs the oracle, worst normalised squared error "
              f"{worst:.2e}")
        if worst > TOL:
            print("FAIL: logits out of tolerance", file=sys.stderr)
            return 1
    clock = SmClock(model.program.device.profile.name)
    results = {}
    for mode, rer in (("replay", False), ("program order", False), ("rerecord", True)):
        model.program.rerecord(program_order=mode == "program order")
        r = run_mode(model, a.steps, a.warmup, rer, a.warm, clock)
        r["barriers"] = model.program.barriers
        results[mode] = r
        gpu = "n/a" if r["gpu_ms"] is None else f"{r['gpu_ms']:.3f}"
        host = "n/a" if r["host_ms"] is None else f"{r['host_ms']:.3f}"
        print(f"{mode:<13} {r['tokens_per_s']:9.1f} tokens/s  wall {r['wall_ms']:8.3f} ms/token"
              f"  gpu {gpu} ms  host {host} ms  ({r['barriers']} barriers; recordings so far "
              f"{r['recordings']}; "
              f"SM clock {'n/a' if r['sm_mhz'] is None else str(r['sm_mhz']) + ' MHz'})")
    rp, rr = results["replay"], results["rerecord"]
    if rp["host_ms"] is not None and rr["host_ms"] is not None:
        print(f"host time per token: replay {rp['host_ms']:.3f} ms vs re-record "
              f"{rr['host_ms']:.3f} ms ({rr['host_ms'] / max(rp['host_ms'], 1e-9):.2f}x)")
    model.close()
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"config": cfg.__dict__, "kernels": len(plan.kernels), "build_s": build_s,
             "barriers": barriers,
             "check_nse": worst, **results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
