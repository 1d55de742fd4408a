"""A real-size Llama (SmolLM2-135M) on pootvk: prefill and decode speed, where a decode
step's GPU time goes, and the same model under torch (CUDA) and llama.cpp (CPU).

    python3 bench/model_generate.py --random          # SmolLM2-135M shapes, random F16 weights
    python3 bench/model_generate.py [--model PATH]    # the real file (default: smollm2)
    python3 bench/model_generate.py --quick           # a tiny random model (lavapipe smoke test)
        [--device D] [--prompt 512] [--positions 128,4096] [--steps 32] [--warm 1.0]
        [--orders level,program] [--json FILE]

Reported, for one device in one run:

* prefill: tokens/s of one prompt of ``--prompt`` tokens (default 512: the 512-row bucket,
  one recorded graph), wall and GPU time, median of repeated runs after ``--warm`` s;
* decode at each of ``--positions``: tokens/s (wall per step, host sampling excluded) and the
  GPU time per step, split by kernel family (attention, GEMV/matmul, norms/elementwise,
  other: gathers, reshapes, slices, cache writes) from per-dispatch timestamps, and the
  fraction of the read ceiling the whole step reaches: (weight bytes + K/V bytes of the
  live prefix) / step time / the device's measured read GB/s. tokens/s and the fraction
  come from the model's own recording (wall time per step: an upper bound on its GPU time,
  so the fraction is a lower bound); "step GPU" is that recording's own GPU time (one
  timestamp before its first and one after its last dispatch: wall minus it is the host's
  share of a step); the GPU time and its split come from the same graph
  recorded with a timestamp after every dispatch (sharing the model's buffers), which adds
  a cost of its own per dispatch;
* the plan: kernels (dispatches) per decode step and per layer, and the compute->compute
  barriers one decode step records in level order (the default: fewest barriers) and in
  the plan's order; ``--orders level,program`` times decode in both, one row each (the
  model's recording and its timed twin are recorded again in that order);
* torch eager F16 on CUDA (same config, same weights) where torch with CUDA imports, and
  llama-cpp-python (CPU, 2 threads) on the real file where it is installed; a missing one is
  a one-line note, never a failure.

Before anything is timed, a 16-token prefill and 2 decode steps are checked against the
numpy oracle (normalised squared error <= 5e-4): a fast wrong model is never reported.
Weights with ``--random`` have the file's exact shapes and dtypes after dequantisation (F16
matrices and embedding, F32 norms, tied LM head), so the times are the real model's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pootvk.benchmark import read_ceiling  # noqa: E402
from pootvk.ir import prims as P  # noqa: E402
from pootvk.llm import (  # noqa: E402
    SMOLLM2_135M,
    LlamaConfig,
    LlamaModel,
    OracleLlama,
    prefill_chunks,
    random_weights,
)
from pootvk.plan.decode_schedule import DecodeCombineRequest, DecodeRequest  # noqa: E402
from pootvk.plan.matmul_schedule import MatMulCombineRequest, MatMulRequest  # noqa: E402
from pootvk.plan.requests import (  # noqa: E402
    AttentionRequest,
    FusedReduceRequest,
    FusedRequest,
    PrimRequest,
    ReduceRequest,
)
from pootvk.runtime.program import Program  # noqa: E402

TOL = 5e-4
FAMILIES = ("attention", "gemv/matmul", "norms/elementwise", "other")
_ELEMENTWISE = {P.ADD, P.SUB, P.MUL, P.DIV, P.MAX, P.MIN, P.UNARY, P.REDUCE, P.CONVERT,
                P.SELECT, P.COMPARE}


def family(request: object) -> str:
    """A planned kernel's family, from its request (never from its label)."""
    if isinstance(request, (AttentionRequest, DecodeRequest, DecodeCombineRequest)):
        return "attention"
    if isinstance(request, (MatMulRequest, MatMulCombineRequest)):
        return "gemv/matmul"
    if isinstance(request, (FusedRequest, FusedReduceRequest, ReduceRequest)):
        return "norms/elementwise"  # fused elementwise chains, RMSNorm rows, reductions
    if isinstance(request, PrimRequest):
        return "norms/elementwise" if request.prim in _ELEMENTWISE else "other"
    return "other"


def _nse(a: np.ndarray, b: np.ndarray) -> float:
    d = a.astype(np.float64) - b
    return float((d * d).sum() / max(float((b.astype(np.float64) ** 2).sum()), 1e-30))


def check(model: LlamaModel, weights: dict) -> float:
    """Worst nse of a 16-token prefill and 2 decode steps against the oracle."""
    oracle = OracleLlama(model.cfg, weights)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, model.cfg.vocab, 16)]
    model.reset()
    errs = [_nse(model.prefill(prompt), oracle.prefill(prompt))]
    for t in (3, 5):
        errs.append(_nse(model.step(t), oracle.step(t)))
    model.reset()
    return max(errs)


def _timed(fn, warm_s: float, reps: int) -> list[float]:
    end = time.perf_counter() + warm_s
    fn()
    while time.perf_counter() < end:
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bench_prefill(model: LlamaModel, n: int, warm_s: float, reps: int) -> dict:
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, model.cfg.vocab, n)]
    model.reset()
    model.prepare(n)  # compile and record the buckets first

    def run() -> None:
        model.reset()
        model.prefill(tokens)

    wall = statistics.median(_timed(run, warm_s, reps))
    chunks = prefill_chunks(0, n, model.cfg.capacity, model.buckets)
    return {"tokens": n, "wall_ms": wall * 1e3, "tokens_per_s": n / wall,
            "chunks": [rows for _, rows in chunks]}


def bench_decode(model: LlamaModel, timed: Program, pos: int, warm_s: float, steps: int,
                 ceiling_gbps: float | None) -> dict:
    """Steps at positions pos .. pos + steps - 1 (the cache before pos holds whatever it
    holds: the step's cost depends on the length, not the values). tokens/s from the
    model's own recording (no timestamps); GPU time and its split from ``timed``, the same
    graph recorded with a timestamp after every dispatch, sharing the model's buffers."""
    cfg = model.cfg
    kernels = timed.plan.kernels
    end = time.perf_counter() + warm_s
    model.position = pos
    while True:
        model.step(1)
        model.position = pos
        if time.perf_counter() >= end:
            break
    walls: list[float] = []
    steps_gpu: list[float] = []  # the model's own recording: timestamps around it only
    token = 1
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model.step(token)
        walls.append(time.perf_counter() - t0)
        g = model.program.gpu_time_ns()
        if g:
            steps_gpu.append(g * 1e-9)
        token = int(np.argmax(logits))
    gpus: list[float] = []
    disp: list[list[float]] = []
    for i in range(steps):
        timed(token=np.array([token], np.int32), pos=np.int32(pos + i))
        g = timed.gpu_time_ns()
        if g:
            gpus.append(g * 1e-9)
        d = timed.dispatch_times_ns()
        if d:
            disp.append([t for _, t in d])
    wall = statistics.median(walls)
    gpu = statistics.median(gpus) if gpus else None
    fam = dict.fromkeys(FAMILIES, 0.0)
    med = np.median(np.array(disp), axis=0) if disp else None
    if med is not None:
        for k, t in zip(kernels, med, strict=False):
            fam[family(k.request)] += float(t) * 1e-6
    read = cfg.weight_bytes() + cfg.kv_bytes(pos + 1)
    # the untimed step's wall time bounds its GPU time from above (a timestamp after every
    # dispatch costs time of its own: ``gpu_ms`` is the timed twin's), so this fraction is
    # a lower bound on what the step reaches
    frac = read / wall / (ceiling_gbps * 1e9) if ceiling_gbps else None
    step_gpu = statistics.median(steps_gpu) if steps_gpu else None
    return {"position": pos, "tokens_per_s": 1 / wall, "wall_ms": wall * 1e3,
            "step_gpu_ms": None if step_gpu is None else step_gpu * 1e3,
            "gpu_ms": None if gpu is None else gpu * 1e3, "families_ms": fam,
            "dispatch_us": None if med is None else [float(t) * 1e-3 for t in med],
            "read_bytes": read, "read_fraction": frac}


def plan_counts(model: LlamaModel) -> dict:
    kernels = model.program.plan.kernels
    attn = sum(isinstance(k.request, (AttentionRequest, DecodeRequest)) for k in kernels)
    fams = {f: sum(family(k.request) == f for k in kernels) for f in FAMILIES}
    barriers = {}
    for order in ("program", "level"):  # leaves the model recorded in level order
        model.program.rerecord(program_order=order == "program")
        barriers[order] = model.program.barriers
    return {"kernels": len(kernels), "per_layer": len(kernels) / model.cfg.layers,
            "attention_kernels": attn, "families": fams, "barriers": barriers}


# --- peers ---------------------------------------------------------------------------------
def bench_torch(cfg: LlamaConfig, weights: dict, prompt: int, positions: list[int],
                steps: int) -> dict | str:
    """The same Llama in eager torch, F16 weights and cache on CUDA (HF's math: RMSNorm in
    F32, SDPA with GQA); CUDA-event times, median of ``steps``."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:
        return f"torch not importable ({type(e).__name__})"
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    dev, f16 = "cuda", torch.float16
    w = {n: torch.from_numpy(np.asarray(a)).to(dev, f16) for n, a in weights.items()
         if not n.startswith("rope")}
    hq, hkv, d, cap = cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.capacity
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d)
    ang = torch.arange(cap, device=dev, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos().to(f16), torch.cat([ang, ang], -1).sin().to(f16)
    kc = torch.zeros(cfg.layers, 1, hkv, cap, d, device=dev, dtype=f16)
    vc = torch.zeros_like(kc)

    def rms(x, g):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.eps)).to(f16) * g

    def rot(x, c, s):
        h = x.shape[-1] // 2
        return x * c + torch.cat([-x[..., h:], x[..., :h]], -1) * s

    @torch.inference_mode()
    def forward(tok, pos):
        t = tok.shape[0]
        x = w["embed"][tok]
        c, s = cos[pos:pos + t][None, None], sin[pos:pos + t][None, None]
        for i in range(cfg.layers):
            h = rms(x, w[f"l{i}.attn_norm"])
            q = (h @ w[f"l{i}.wq"].T).view(t, hq, d).transpose(0, 1)[None]
            k = (h @ w[f"l{i}.wk"].T).view(t, hkv, d).transpose(0, 1)[None]
            v = (h @ w[f"l{i}.wv"].T).view(t, hkv, d).transpose(0, 1)[None]
            q, k = rot(q, c, s), rot(k, c, s)
            kc[i, :, :, pos:pos + t], vc[i, :, :, pos:pos + t] = k, v
            o = F.scaled_dot_product_attention(q, kc[i, :, :, :pos + t], vc[i, :, :, :pos + t],
                                               is_causal=t > 1, enable_gqa=True)
            x = x + o[0].transpose(0, 1).reshape(t, hq * d) @ w[f"l{i}.wo"].T
            h = rms(x, w[f"l{i}.mlp_norm"])
            up = F.silu(h @ w[f"l{i}.w_gate"].T) * (h @ w[f"l{i}.w_up"].T)
            x = x + up @ w[f"l{i}.w_down"].T
        head = w["embed"] if cfg.tied_embeddings else w["lm_head"]
        return rms(x[-1:], w["norm"]) @ head.T

    def timed(fn, n):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e-3)
        return statistics.median(ts)

    toks = torch.randint(0, cfg.vocab, (prompt,), device=dev)
    one = torch.ones(1, dtype=torch.long, device=dev)
    out = {"device": torch.cuda.get_device_name(), "prefill_tokens_per_s":
           prompt / timed(lambda: forward(toks, 0), 10)}
    for p in positions:
        out[f"decode_{p}_tokens_per_s"] = 1 / timed(lambda p=p: forward(one, p), steps)
    return out


def bench_llama_cpp(path: str | None, prompt: int, steps: int) -> dict | str:
    """llama-cpp-python on the CPU (2 threads) over the real file: prompt and decode."""
    try:
        from llama_cpp import Llama
    except Exception as e:
        return f"llama-cpp-python not installed ({type(e).__name__})"
    if path is None:
        return "llama.cpp needs the real file (not --random)"
    llm = Llama(model_path=path, n_ctx=prompt + steps + 8, n_threads=2, verbose=False)
    toks = [int(t) for t in np.random.default_rng(2).integers(100, 40000, prompt)]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(toks)
    pre = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    dec = time.perf_counter() - t0
    return {"prefill_tokens_per_s": prompt / pre, "decode_tokens_per_s": steps / dec,
            "threads": 2}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--random", action="store_true",
                    help="SmolLM2-135M's shapes with random F16 weights (no file needed)")
    ap.add_argument("--model", default="smollm2", help="a packaged name or a GGUF path")
    ap.add_argument("--quick", action="store_true", help="a tiny random model (lavapipe)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--positions", default="128,4096")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warm", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=5, help="timed prefills")
    ap.add_argument("--orders", default="level",
                    help="decode timed with dispatches recorded in these orders: level "
                         "(the default recording), program (the plan's order)")
    ap.add_argument("--dump", default=None, metavar="START,COUNT",
                    help="print the per-dispatch GPU times (timed twin, first position) of "
                         "COUNT dispatches from START in the recorded order")
    ap.add_argument("--no-peers", action="store_true", help="skip torch and llama-cpp-python")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    positions = [int(x) for x in a.positions.split(",")]
    orders = a.orders.split(",")
    if any(o not in ("level", "program") for o in orders):
        ap.error(f"--orders takes level and/or program, not {a.orders!r}")
    if a.quick:
        a.prompt, positions, a.steps, a.warm, a.reps = 16, [8, 40], 4, 0.0, 2
    cap = max(positions) + a.steps + 1
    cap = max(cap, a.prompt + 1)
    cap = -(-cap // 64) * 64
    path = None
    t0 = time.perf_counter()
    if a.quick or a.random:
        cfg = replace(SMOLLM2_135M, capacity=cap) if a.random else LlamaConfig(
            layers=2, q_heads=3, kv_heads=1, head_dim=32, hidden=96, intermediate=256,
            vocab=512, capacity=cap, weight_dtype="float16", tied_embeddings=True)
        weights = random_weights(cfg, seed=0)
        model = LlamaModel(cfg, weights, a.device, timestamps="bounds")
        source = "random weights"
    else:
        from pootvk.llm.gguf import load_gguf

        gm = load_gguf(a.model, capacity=cap)
        cfg = replace(gm.config, tied_embeddings=gm.tied_embeddings)
        weights = {n: x for n, x in gm.weights.items() if n in cfg.weight_shapes()}
        model = LlamaModel(cfg, weights, a.device, timestamps="bounds")
        path, source = str(gm.path), str(gm.path)
    build_s = time.perf_counter() - t0
    dev = model.device
    print(f"device: {dev.name}")
    print(f"model: {source}; {cfg}")
    print(f"weights {cfg.weight_bytes() / 1e6:.1f} MB; decode graph built and recorded in "
          f"{build_s:.1f} s")
    counts = plan_counts(model)
    print(f"plan: {counts['kernels']} kernels per decode step ({counts['per_layer']:.1f} per "
          f"layer), by family {counts['families']}; barriers per decode step "
          f"{counts['barriers']['level']} in level order, {counts['barriers']['program']} in "
          "the plan's order")
    worst = check(model, weights)
    print(f"check: 16-token prefill + 2 decode steps vs the oracle, worst nse {worst:.2e}")
    if worst > TOL:
        print("FAIL: logits out of tolerance", file=sys.stderr)
        return 1
    timed = Program(model.graph, timestamps=True, share=model.program)
    ceiling = read_ceiling(dev)
    print(f"read ceiling: {ceiling.gbps:.1f} GB/s")
    pre = bench_prefill(model, a.prompt, a.warm, a.reps)
    print(f"prefill {a.prompt} tokens: {pre['tokens_per_s']:.1f} tokens/s (wall "
          f"{pre['wall_ms']:.2f} ms; graphs run: "
          + ", ".join(f"{n} x {rows} rows" for rows, n in
                      sorted(Counter(pre["chunks"]).items())) + ")")
    dec = []
    for order in orders:
        for prog in (model.program, timed):
            prog.rerecord(program_order=order == "program")
        dec += [{**bench_decode(model, timed, p, a.warm, a.steps, ceiling.gbps),
                 "order": order, "barriers": model.program.barriers} for p in positions]
    for prog in (model.program, timed):
        prog.rerecord(program_order=False)
    print("decode:")
    print(f"  {'order':>7} {'barriers':>8} {'position':>8} {'tokens/s':>9} {'wall ms':>8} "
          f"{'step GPU':>8} {'GPU ms':>8} " + " ".join(f"{f:>18}" for f in FAMILIES)
          + f" {'read ceiling':>12}")
    for r in dec:
        g = "n/a" if r["gpu_ms"] is None else f"{r['gpu_ms']:.3f}"
        sg = "n/a" if r["step_gpu_ms"] is None else f"{r['step_gpu_ms']:.3f}"
        fr = "n/a" if r["read_fraction"] is None else f"{r['read_fraction']:.1%}"
        print(f"  {r['order']:>7} {r['barriers']:>8} {r['position']:>8} "
              f"{r['tokens_per_s']:>9.1f} {r['wall_ms']:>8.3f} {sg:>8} {g:>8} "
              + " ".join(f"{r['families_ms'][f]:>15.3f} ms" for f in FAMILIES) + f" {fr:>12}")
    if a.dump and dec and dec[0]["dispatch_us"]:
        start, count = (int(x) for x in a.dump.split(","))
        rec = timed._replay.recording
        print(f"dispatches {start}..{start + count - 1} in recorded order ({dec[0]['order']}, "
              f"position {dec[0]['position']}): | = a barrier before it")
        for n in range(start, min(start + count, len(rec.order))):
            i = rec.order[n]
            d, k = rec.dispatches[i], timed.plan.kernels[i]
            print(f"  {n:4d} {'|' if rec.barrier_before[i] else ' '} "
                  f"{dec[0]['dispatch_us'][i]:7.2f} us  groups {d.groups}  {k.label:18s} "
                  f"{type(k.request).__name__}")
    peers: dict[str, dict | str] = {}
    if a.no_peers:
        peers = {"torch": "skipped (--no-peers)", "llama_cpp": "skipped (--no-peers)"}
    for name, fn in (("torch", lambda: bench_torch(cfg, weights, a.prompt, positions,
                                                   max(a.steps, 10))),
                     ("llama_cpp", lambda: bench_llama_cpp(path, a.prompt, a.steps))):
        if name in peers:
            continue
        if a.quick and name == "torch":
            peers[name] = "skipped (--quick)"
            continue
        try:  # a peer's failure is a note in the report, never the end of the run
            peers[name] = fn()
        except Exception as e:
            peers[name] = f"failed: {type(e).__name__}: {e}".splitlines()[0]
    for name, r in peers.items():
        if isinstance(r, str):
            print(f"{name}: {r}")
        else:
            print(f"{name}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in r.items()))
    timed.close()
    model.close()
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"device": dev.name, "config": cfg.__dict__, "plan": counts, "check_nse": worst,
             "read_ceiling_gbps": ceiling.gbps, "prefill": pre, "decode": dec,
             "peers": peers}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
