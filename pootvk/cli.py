"""The ``pootvk`` console command: ``devices``, ``demo``, ``bench``, ``plan``, ``generate``."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .errors import PootvkError


class _Parser(argparse.ArgumentParser):
    """Argument errors are one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be at least 1")
    return n


def non_negative_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not x >= 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number >= 0")
    return x


def bench_shape(text: str) -> tuple[int, ...]:
    """B,Hq,Hkv,Lk,D: five positive integers."""
    try:
        s = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: want B,Hq,Hkv,Lk,D (five positive integers)") from None
    if len(s) != 5 or min(s) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: want B,Hq,Hkv,Lk,D (five positive integers)")
    return s


def _devices(args: argparse.Namespace) -> int:
    from .vk import physical_devices

    for d in physical_devices():
        p = d.profile
        cu = f", {p.compute_units} compute units" if p.compute_units else ""
        cm = p.extra.get("coopmat") or ()
        tc = (f", cooperative matrices {'; '.join(cm)} (tensor-core decode)" if cm else
              ", no cooperative matrices")
        print(
            f"[{d.index}] {d.name} ({d.device_type}, {p.driver}, Vulkan {p.api_version}): "
            f"{p.max_workgroup_memory // 1024} KiB workgroup memory, "
            f"grid {p.max_grid[0]}, binding range {p.max_storage_buffer_range >> 20} MiB, "
            f"subgroup {p.subgroup_size}{cu}{tc}"
        )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .ir.prims import ATTENTION
    from .llm import DecodeLoop
    from .oracle import evaluate

    b, hq, hkv, d, cap = args.batch, args.q_heads, args.kv_heads, args.head_dim, args.capacity
    steps = min(args.steps, cap)
    loop = DecodeLoop(b, hq, hkv, d, cap, device=args.device, softcap=args.softcap)
    print(f"demo: decode loop B={b} Hq={hq} Hkv={hkv} D={d} capacity={cap} on "
          f"{loop.device.name}; {len(loop.plan.kernels)} kernels per step, "
          f"attention fused: {loop.plan.graph.count(ATTENTION) == 1}")
    rng = np.random.default_rng(args.seed)
    kc = np.zeros((b, hkv, cap, d), np.float32)
    vc = np.zeros_like(kc)
    worst_nse, worst_abs, gpu_s = 0.0, 0.0, 0.0
    t0 = last = time.perf_counter()
    for i in range(steps):
        q = rng.standard_normal((b, hq, 1, d), dtype=np.float32)
        kn = rng.standard_normal((b, hkv, 1, d), dtype=np.float32)
        vn = rng.standard_normal((b, hkv, 1, d), dtype=np.float32)
        t = time.perf_counter()
        out = loop.step(q, kn, vn)
        gpu_s += time.perf_counter() - t
        ref = evaluate(loop.graph, {"q": q, "k_new": kn, "v_new": vn, "k_cache": kc,
                                    "v_cache": vc, "pos": np.int32(i)})
        kc, vc = ref["k_cache"], ref["v_cache"]
        diff = out - ref["out"]
        worst_nse = max(worst_nse, float((diff**2).sum() / (ref["out"] ** 2).sum()))
        worst_abs = max(worst_abs, float(np.abs(diff).max()))
        now = time.perf_counter()
        if now - last > 0.2 or i == steps - 1:
            last = now
            print(f"\r  step {i + 1}/{steps}  max abs err {worst_abs:.2e}  "
                  f"{(i + 1) / gpu_s:.0f} steps/s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    ok = worst_nse <= 5e-4
    print(f"demo: {steps} steps, {loop.recordings} recording, {steps / gpu_s:.0f} steps/s "
          f"(step only; {time.perf_counter() - t0:.1f} s with the oracle), max abs err "
          f"{worst_abs:.2e}, worst normalised sq err {worst_nse:.1e}: "
          f"{'OK' if ok else 'FAILED'}")
    loop.close()
    return 0 if ok and loop.recordings == 1 else 1


def bench_dtype(text: str) -> str:
    from .benchmark import DTYPE_ALIASES

    try:
        return DTYPE_ALIASES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: want one of {', '.join(DTYPE_ALIASES)}") from None


def _bench(args: argparse.Namespace) -> int:
    from .benchmark import matplotlib_missing, run
    from .runtime import resolve_device

    if args.plot:
        missing = matplotlib_missing()
        if missing:  # before minutes of measuring, not after
            print(f"pootvk bench: error: {missing}", file=sys.stderr)
            return 2
    shapes = list(dict.fromkeys(args.shape)) if args.shape else None
    dtypes = list(dict.fromkeys(args.dtype)) if args.dtype else None
    run(resolve_device(args.device), shapes, dtypes, quick=args.quick, warm_s=args.warm,
        reps=args.reps, calls=args.calls, json_path=args.json, plot_path=args.plot)
    return 0


def _split_note(req: object) -> str:
    s = getattr(req, "dk_shared", 0)
    return f", split key (k_shared {s} wide, read once for every head)" if s else ""


def kernel_summary(req: object) -> str:
    """One line for a planned kernel: its schedule, launch shape and split count."""
    from .plan import (
        AttentionRequest,
        DecodeCombineRequest,
        DecodeRequest,
        FusedReduceRequest,
        FusedRequest,
        FusedUpdateRequest,
        GroupRequest,
        PrimRequest,
        ReduceRequest,
        ScatterRequest,
    )
    from .plan.topk import TopKRequest

    if isinstance(req, GroupRequest):
        return (f"group of {len(req.parts)} independent launches as one "
                f"({'+'.join(map(str, req.part_groups))} workgroups x {req.local_size}): "
                + "; ".join(kernel_summary(p) for p in req.parts))
    if isinstance(req, DecodeRequest) and req.matrix:
        extra = ", fused combine" if req.splits > 1 and req.fused_combine else ""
        extra += ", tiles in turn" if req.interleave else ""
        feed = "register-fed" if req.matrix_feed == "registers" else "staged"
        return (f"tensor-core split-KV ({feed} cooperative matrices "
                f"{req.matrix}x{req.matrix}x{req.matrix}): {req.workgroups} workgroups x "
                f"{req.local_size} lanes ({req.rows_per_wg} rows each, {req.tile} keys/step"
                f"{', query hi+lo' if req.q_split else ''}), splits={req.splits}{extra}, "
                f"K/V {req.kv_dtype}, {req.shared_bytes} B workgroup memory{_split_note(req)}")
    if isinstance(req, TopKRequest):
        what = f"block top-{req.k} (blocks of {req.block_size})" if req.block_size else \
            f"top-{req.k}"
        return (f"{what} radix selection: {req.rows} rows of {req.n} x {req.lanes} lanes "
                f"({'row in registers' if req.per_lane else 'row re-read per pass'}, "
                f"{'subgroup' if req.subgroup else 'shared-memory'} scans)")
    if isinstance(req, DecodeRequest):
        extra = ", fused combine" if req.splits > 1 and req.fused_combine else ""
        extra += ", tiles in turn" if req.interleave else ""
        if req.select_block:
            extra += (f", selected blocks of {req.select_block} (top {req.select_k} + own, "
                      f"{(req.select_k + 1) * req.select_block} keys a row)")
        return (f"grouped split-KV: {req.workgroups} workgroups x {req.local_size} lanes "
                f"({req.lanes_per_key} lanes/key, {req.rows_per_wg} rows each, "
                f"{'subgroup' if req.subgroup else 'shared-memory'} reduction), "
                f"splits={req.splits}{extra}, K/V {req.kv_dtype}{_split_note(req)}")
    if isinstance(req, DecodeCombineRequest):
        p = req.partial
        return f"split combine: {p.combine_threads} invocations, splits={p.splits}"
    if isinstance(req, AttentionRequest):
        return (f"streaming: {req.workgroups} workgroups x {req.lanes} lanes, splits=1, "
                f"{req.keys_per_step} keys/step{_split_note(req)}")
    if isinstance(req, PrimRequest):
        return f"{req.prim}: {req.threads} invocations"
    if isinstance(req, FusedRequest):
        return f"fused {req.body}: {req.threads} invocations"
    if isinstance(req, FusedUpdateRequest):
        return f"fused update {req.body}: {req.threads} invocations, in place"
    if isinstance(req, FusedReduceRequest):
        what = "row" if req.epilogue is not None else "reduce"
        return f"fused {what} ({req.op.value}): {req.rows} workgroups x {req.lanes} lanes"
    if isinstance(req, ReduceRequest | ScatterRequest):
        return f"{req.describe()}: {req.grid[0] * req.grid[1]} workgroups x {req.local_size}"
    return repr(req)


def _plan(args: argparse.Namespace) -> int:
    """The plan a user would get for one attention shape: no device needed."""
    from .ir import BF16, F16, F32
    from .ops import trace_attention
    from .passes import compile_graph
    from .plan import BufferRole, plan_graph, recorded_profile, recorded_profiles
    from .runtime import linear_prologues

    if args.profile not in recorded_profiles():
        print(f"pootvk plan: error: no recorded profile {args.profile!r}; known: "
              f"{sorted(recorded_profiles())}", file=sys.stderr)
        return 2
    prof = recorded_profile(args.profile)
    b, hq, hkv, lk, d = args.shape
    s, dv = args.k_shared, args.dv or args.shape[4]
    kv = {"float32": F32, "float16": F16, "bfloat16": BF16}[args.kv_dtype]
    if s is not None and not 1 <= s < d:
        print(f"pootvk plan: error: --k-shared {s} must be in [1, D={d})", file=sys.stderr)
        return 2
    pool = args.pool_slots
    if pool is not None and s is not None:
        print("pootvk plan: error: --pool-slots and --k-shared are separate key layouts",
              file=sys.stderr)
        return 2
    g = trace_attention((b, hq, args.lq, d), (b, hkv, lk, d - (s or 0)), (b, hkv, lk, dv),
                        kv_dtype=kv, k_shared_shape=None if s is None else (b, 1, lk, s),
                        pool_slots=pool)
    plan = plan_graph(compile_graph(g, linear_prologues=linear_prologues(prof)), prof)
    split = "" if s is None else f" (k {d - s} + k_shared {s})"
    if pool is not None:
        split = f" (paged: pools of {pool} slots read through read [{b},{lk}])"
    print(f"plan for {prof.name} (recorded profile {args.profile}, "
          f"{prof.compute_units or '?'} compute units): attention B={b} Hq={hq} Hkv={hkv} "
          f"Lq={args.lq} Lk={lk} D={d}{split} Dv={dv} K/V {args.kv_dtype}")
    for i, k in enumerate(plan.kernels):
        print(f"  k{i} {k.label}: {kernel_summary(k.request)}")
    scratch = [p.item for p in plan.arena.placements.values() if p.item.scratch]
    persistent = [b for b in plan.buffers.values() if b.role is BufferRole.SCRATCH]
    print(f"  scratch: {sum(i.nbytes for i in scratch)} B in the arena (split partials), "
          f"{sum(b.nbytes for b in persistent)} B persistent (combine counters)")
    kv_read = sum(plan.buffers[n].nbytes for n in ("in:k", "in:k_shared", "in:v")
                  if n in plan.buffers)
    pooled = ""
    if pool is not None:  # the keys visited, not the pools that hold them
        pooled = f" of pools holding {kv_read} B, through a {b * lk * 4} B read map"
        kv_read = b * hkv * lk * (d + dv) * kv.device_itemsize
    print(f"  arena: {len(plan.arena.sizes)} buffer(s), peak {plan.arena.peak_bytes} B; "
          f"K/V read: {kv_read} B{pooled}")
    if args.verbose:
        print(plan)
    return 0


def _generate(args: argparse.Namespace) -> int:
    """Stream a model's continuation of the prompt, then the prefill and decode rates; with
    several prompts, generate them together (``llm.TextEngine``) and print each."""
    from .llm import load
    from .llm.gguf import stderr_progress

    if len(args.prompt) > 1:
        return _generate_many(args)
    args.prompt = args.prompt[0]

    # a progress line rewritten in place, on a terminal only (a refusal stays one line)
    t0 = time.perf_counter()
    tm = load(args.model, args.device, context=args.context,
              progress=stderr_progress if sys.stderr.isatty() else None)
    with tm:
        load_s = time.perf_counter() - t0
        if not args.chat:
            print(args.prompt, end="", flush=True)
        for piece in tm.stream(args.prompt, args.max_tokens, temperature=args.temperature,
                               top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                               chat=args.chat):
            print(piece, end="", flush=True)
        print()
        st = tm.stats
        print(f"{tm.name} on {tm.model.device.name}: loaded in {load_s:.1f} s; prompt "
              f"{st.prompt_tokens} tokens at {st.prefill_tokens_per_s:.1f} tokens/s, "
              f"generated {st.generated} tokens at {st.decode_tokens_per_s:.1f} tokens/s",
              file=sys.stderr)
    return 0


def _generate_many(args: argparse.Namespace) -> int:
    """Several prompts through the batched engine: each continuation printed under its
    prompt, then the aggregate rate (sampling as for one prompt; ``--seed`` s gives prompt i
    the seed s + i)."""
    from .llm.generate import load_engine
    from .llm.gguf import stderr_progress
    from .llm.sampling import check_sampling

    check_sampling(args.temperature, args.top_k, args.top_p)
    # the pool the prompts need at most: a byte-level BPE token spans at least one byte (the
    # chat template adds at most its own length), rounded up to whole 16-token blocks
    extra = 256 if args.chat else 0
    pool = sum(-(-(len(p.encode()) + extra + args.max_tokens) // 16) * 16
               for p in args.prompt)
    t0 = time.perf_counter()
    te = load_engine(args.model, args.device, context=args.context,
                     max_batch=min(len(args.prompt), 8), pool_tokens=pool,
                     progress=stderr_progress if sys.stderr.isatty() else None)
    with te:
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        texts = te.generate(args.prompt, args.max_tokens, chat=args.chat,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            seed=args.seed)
        wall = time.perf_counter() - t0
        n = te.generated_tokens
        for i, (prompt, text) in enumerate(zip(args.prompt, texts, strict=True)):
            print(f"[{i}] {prompt}{text}" if not args.chat else f"[{i}] {text}")
        print(f"{te.name} on {te.engine.decode.device.name}: loaded in {load_s:.1f} s; "
              f"{len(args.prompt)} prompts together, {n} tokens generated in "
              f"{wall:.2f} s ({n / wall:.1f} tokens/s, prefills included)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="pootvk", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("devices", help="list Vulkan devices and their limits")
    demo = sub.add_parser("demo", help="a decode loop checked against the numpy oracle")
    demo.add_argument("--steps", type=positive_int, default=256)
    demo.add_argument("--batch", type=positive_int, default=2)
    demo.add_argument("--q-heads", type=positive_int, default=8)
    demo.add_argument("--kv-heads", type=positive_int, default=2)
    demo.add_argument("--head-dim", type=positive_int, default=64)
    demo.add_argument("--capacity", type=positive_int, default=256)
    demo.add_argument("--softcap", type=float, default=None)
    demo.add_argument("--seed", type=int, default=0)
    bench = sub.add_parser("bench", help="decode-attention GB/s against the read ceiling")
    bench.add_argument("--shape", action="append", type=bench_shape,
                       help="B,Hq,Hkv,Lk,D (repeatable; default: issue 7's shapes on a GPU)")
    bench.add_argument("--dtype", action="append", type=bench_dtype,
                       help="K/V dtype: float32 | float16 (repeatable; default both)")
    bench.add_argument("--quick", action="store_true",
                       help="tiny shapes, short warm-up (CI)")
    bench.add_argument("--warm", type=non_negative_float, default=None,
                       help="seconds of back-to-back runs before timing each case (default 1)")
    bench.add_argument("--reps", type=positive_int, default=None,
                       help="timed replays per case, median reported (default 50)")
    bench.add_argument("--calls", type=positive_int, default=None,
                       help="launches timed back to back per replay, per launch (default 10; "
                            "2 with --quick)")
    bench.add_argument("--json", metavar="FILE", help="write every number to FILE")
    bench.add_argument("--plot", metavar="FILE.png",
                       help="K/V GB/s against Lk for every series (needs matplotlib)")
    for p in (demo, bench, sub.choices["devices"]):
        p.add_argument("--device", default=None, help="index or name substring")
    plan = sub.add_parser("plan", help="print the plan for an attention shape (no device)")
    plan.add_argument("--profile", default="nvidia_h200",
                      help="a recorded profile: amd_rdna3_radv, intel_arc_anv, lavapipe, "
                      "mobile_16k, nvidia_h200")
    plan.add_argument("--shape", type=bench_shape, required=True, help="B,Hq,Hkv,Lk,D")
    plan.add_argument("--kv-dtype", choices=("float32", "float16", "bfloat16"),
                      default="float32")
    plan.add_argument("--lq", type=positive_int, default=1, help="query rows")
    plan.add_argument("--dv", type=positive_int, default=None, help="value width (default D)")
    plan.add_argument("--k-shared", type=positive_int, default=None, metavar="S",
                      help="split key (latent attention): k has width D - S, and k_shared "
                      "[B,1,Lk,S] is read once for every head")
    plan.add_argument("--pool-slots", type=positive_int, default=None, metavar="S",
                      help="paged key: k/v are pools [S,Hkv,D] read through a slot map "
                      "[B,Lk] declared in [0,S)")
    plan.add_argument("--verbose", action="store_true", help="also print the whole plan")
    gen = sub.add_parser("generate", help="stream a model's continuation of a prompt "
                         "(several prompts: generated together)")
    gen.add_argument("prompt", nargs="+")
    gen.add_argument("--max-tokens", type=positive_int, default=64)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--model", default="smollm2",
                     help="a packaged model name (smollm2) or a llama GGUF file")
    gen.add_argument("--device", default=None, help="index or name substring")
    gen.add_argument("--context", type=positive_int, default=2048,
                     help="KV cache rows (prompt + generated tokens)")
    gen.add_argument("--temperature", type=non_negative_float, default=0.0,
                     help="0: greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0: no cut")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        return {"devices": _devices, "demo": _demo, "bench": _bench, "plan": _plan,
                "generate": _generate}[args.cmd](args)
    except PootvkError as e:
        print(f"pootvk: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
