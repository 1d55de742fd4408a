"""Decode-attention probe: the grouped split-KV kernels against the read ceiling, one run.

    python3 bench/decode_probe.py [--shapes B,Hq,Hkv,Lk ...] [--dtypes f32,f16] [--tune]
                                  [--variants JSON] [--paged [--paged-block 16]]
                                  [--warm 1.0] [--reps 50] [--json FILE]

Measured in one run on one device: the streaming-read ceiling
(``pootvk.benchmark.read_ceiling``), then for every shape (D=128, Lq=1) and K/V dtype the
grouped decode kernels (partial [+ combine]) and, for F32, the existing streaming kernel.
Each configuration is warmed by >= ``--warm`` seconds of back-to-back launches (the H200
idles at 345 MHz and needs the load to clock up), then timed as the median GPU time
(timestamps, first to last launch) of >= ``--reps`` submits. Every output is checked
against a float64 numpy reference (normalised squared error <= 5e-4). The SM clock is logged
through NVML where ``pynvml`` imports. ``--tune`` also times schedule variants (lanes per
key, workgroup size, keys per step, split counts, shared-memory reduction) per shape.
``--paged`` also times the paged-key kernels (issue 11) on the same keys held in pools
[S, Hkv, D] whose ``--paged-block``-key blocks are shuffled over the pool (1: every key its
own random slot), read through an i32 map [B, Lk]: the same schedule, only the address
differs; the summary compares them with the dense kernels of the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pootvk.benchmark import SmClock, per_launch_ns, read_ceiling  # noqa: E402
from pootvk.plan.decode_schedule import (  # noqa: E402
    DecodeProblem,
    DecodeRequest,
    choose_decode_schedule,
)
from pootvk.plan.requests import AttentionRequest, fold_grid  # noqa: E402
from pootvk.plan.schedule import choose_lanes  # noqa: E402
from pootvk.shaders.attention import generate_attention  # noqa: E402
from pootvk.shaders.attention_decode import generate_decode  # noqa: E402
from pootvk.shaders.compiler import compile_glsl  # noqa: E402
from pootvk.vk import BufferRange, Device, Dispatch, Recorder  # noqa: E402

SHAPES = [(1, 32, 8, 4096), (1, 32, 8, 32768), (1, 32, 8, 131072), (8, 32, 8, 8192),
          (1, 32, 32, 32768), (32, 32, 8, 2048), (1, 8, 1, 65536)]
D = 128
L2_BYTES = 60 << 20
TOL = 5e-4


# --- labels ---------------------------------------------------------------------------------


def _matrix_tag(matrix: int | None, feed: str | None) -> str:
    """" regfed" / " staged" for the tensor-core kernels, "" for the scalar one."""
    if not matrix:
        return ""
    return " regfed" if feed == "registers" else " staged"


# --- data -----------------------------------------------------------------------------------


def to_storage(x: np.ndarray, kv: str) -> np.ndarray:
    if kv == "f32":
        return x
    if kv == "f16":
        return x.astype(np.float16)
    bits = x.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_storage(x: np.ndarray, kv: str) -> np.ndarray:
    if kv == "bf16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """float64 attention, one (batch, KV head) at a time (the caches can be GBs)."""
    b, hq, lq, _ = q.shape
    hkv = k.shape[1]
    n_rep = hq // hkv
    out = np.empty((b, hq, lq, v.shape[3]), np.float64)
    for bi in range(b):
        for g in range(hkv):
            kk = k[bi, g].astype(np.float64)
            qq = q[bi, g * n_rep:(g + 1) * n_rep].reshape(n_rep * lq, -1).astype(np.float64)
            s = qq @ kk.T * scale
            s -= s.max(-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(-1, keepdims=True)
            o = p @ v[bi, g].astype(np.float64)
            out[bi, g * n_rep:(g + 1) * n_rep] = o.reshape(n_rep, lq, -1)
    return out


def nse(got: np.ndarray, ref: np.ndarray) -> float:
    d = got.astype(np.float64) - ref
    return float((d**2).sum() / max((ref**2).sum(), 1e-30))


def paged_map(rng: np.random.Generator, b: int, lk: int, block: int) -> tuple[int, np.ndarray]:
    """(pool slots S, read [B, Lk] i32): every row's ``block``-key blocks at shuffled places
    of a pool of exactly the blocks they need."""
    nblk = -(-lk // block)
    table = rng.permutation(b * nblk).reshape(b, nblk)
    read = (table[:, :, None] * block + np.arange(block)).reshape(b, nblk * block)[:, :lk]
    return b * nblk * block, np.ascontiguousarray(read, dtype=np.int32)


def to_pool(x: np.ndarray, read: np.ndarray, slots: int) -> np.ndarray:
    """The pool [S, Hkv, D] holding x [B, Hkv, Lk, D]'s key t of row b at slot read[b, t]."""
    b, hkv, lk, d = x.shape
    pool = np.zeros((slots, hkv, d), x.dtype)
    pool[read.reshape(-1)] = x.transpose(0, 2, 1, 3).reshape(b * lk, hkv, d)
    return pool


# --- launches -------------------------------------------------------------------------------


class Launch:
    """Recorded launches of one kernel configuration over bound buffers."""

    def __init__(self, device: Device, specs: list[tuple[str, list[BufferRange], tuple]],
                 repeat: int = 1, calls: int = 1) -> None:
        dispatches = []
        for src, ranges, grid, push in specs:
            pipe = device.compute_pipeline(compile_glsl(src), len(ranges), len(push))
            dispatches.append(Dispatch(pipe, tuple(ranges), (grid[0], grid[1], 1), "decode",
                                       push=push))
        self.calls, self.n = calls, len(dispatches)
        self.rec = Recorder(device).record(dispatches * calls, timestamps=True)
        self.warm_rec = Recorder(device).record(dispatches * repeat) if repeat > 1 else None

    def warm(self, seconds: float) -> None:
        t_end = time.perf_counter() + seconds
        rec = self.warm_rec or self.rec
        while time.perf_counter() < t_end:
            rec.submit(wait=True)

    def time(self, reps: int) -> tuple[float, list[float]]:
        """(median GPU ns first-to-last, median per-dispatch ns), over ``calls`` copies of
        the launches recorded back to back (each behind the barrier its hazards need, as in
        a step) and divided by ``calls``: what a replayed step pays per launch, without the
        start of a submit (torch's CUDA graph and llama.cpp's perf mode time this way)."""
        tot, per = [], []
        for _ in range(reps):
            self.rec.submit(wait=True)
            tot.append(self.rec.gpu_time_ns() / self.calls)
            per.append(per_launch_ns(self.rec.dispatch_times_ns(), self.n, self.calls))
        med = [statistics.median(x) for x in zip(*per, strict=True)]
        return statistics.median(tot), med

    def destroy(self) -> None:
        self.rec.destroy()
        if self.warm_rec is not None:
            self.warm_rec.destroy()


def query_buffers(device: Device, q: np.ndarray, hkv: int, dv: int, length: int) -> tuple:
    """(q, out, partial, counter, len) buffers of a [B, Hq, 1, D] query: q written, room for
    up to 64 splits' partials, the fused combine's counters zeroed, every row's live
    length ``length``."""
    b, hq = q.shape[:2]
    qb = device.create_buffer(q.nbytes, name="q")
    qb.write(0, q)
    out = device.create_buffer(b * hq * dv * 4, name="out")
    part = device.create_buffer(b * hq * 64 * (dv + 2) * 4, name="partial")
    counter = device.create_buffer(b * hkv * hq * 4, name="counter")
    counter.write(0, np.zeros(b * hkv * hq, np.uint32))
    lens = device.create_buffer(b * 4, name="len")
    lens.write(0, np.full(b, length, np.int32))
    return qb, out, part, counter, lens


def warm_repeat(kv_bytes: int) -> int:
    """Launches a warm-up submit records: a short shape's submit would be mostly host time."""
    return min(2000, max(1, int(200e3 / max(1.0, kv_bytes / 4e3))))


class DenseCase(NamedTuple):
    """One dense decode case bound on a device (Lq 1, Dk = Dv = d): its problem, the float64
    reference and the buffers ``decode_specs`` binds (q, k, v, out, partial, counter, len;
    every row's length the full Lk)."""

    problem: DecodeProblem
    ref: np.ndarray
    bufs: dict[str, BufferRange]
    kv_bytes: int

    def read_out(self) -> np.ndarray:
        p = self.problem
        return self.bufs["out"].buffer.read_array(0, (p.b, p.hq, 1, p.dv), np.float32)

    def destroy(self) -> None:
        for r in self.bufs.values():
            r.buffer.destroy()


def dense_case(device: Device, b: int, hq: int, hkv: int, lk: int, d: int, kv: str, *,
               out_host: bool = False, seed: int = 0) -> DenseCase:
    """Random q [B, Hq, 1, d] and K/V [B, Hkv, Lk, d] (uniform in [-0.5, 0.5), stored as
    ``kv``) on ``device``, with ``query_buffers``' output, partials, counters and lengths;
    ``out_host`` puts the output in host memory, as a plan's export is."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hq, 1, d), dtype=np.float32)
    ks = to_storage(rng.random((b, hkv, lk, d), dtype=np.float32) - 0.5, kv)
    vs = to_storage(rng.random((b, hkv, lk, d), dtype=np.float32) - 0.5, kv)
    scale = 1.0 / math.sqrt(d)
    ref = reference(q, from_storage(ks, kv), from_storage(vs, kv), scale)
    qb, out, part, counter, lens = query_buffers(device, q, hkv, d, lk)
    if out_host:
        out.destroy()
        out = device.create_buffer(b * hq * d * 4, host_visible=True, name="out")
    kb, vb = (device.create_buffer(x.nbytes, name=n) for x, n in ((ks, "k"), (vs, "v")))
    kb.write(0, ks)
    vb.write(0, vs)
    bufs = {name: BufferRange(x, 0, x.size) for name, x in (
        ("q", qb), ("k", kb), ("v", vb), ("out", out), ("partial", part),
        ("counter", counter), ("len", lens))}
    p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=1, lk=lk, dk=d, dv=d, scale=scale, kv_dtype=kv)
    return DenseCase(p, ref, bufs, ks.nbytes + vs.nbytes)


def decode_specs(req: DecodeRequest, bufs: dict[str, BufferRange]) -> list[tuple]:
    srcs = generate_decode(req)
    specs = [(srcs[0], [bufs[b.name] for b in req.bindings()], req.grid,
              req.push_constants())]
    if req.launches == 2:
        specs.append((srcs[1], [bufs[b.name] for b in req.combine_bindings()],
                      req.combine_grid, ()))
    return specs


def streaming_request(p: DecodeProblem, device: Device) -> AttentionRequest:
    prof = device.profile
    return AttentionRequest(
        b=p.b, hq=p.hq, hkv=p.hkv, lq=p.lq, lk=p.lk, dk=p.dk, dv=p.dv, scale=p.scale,
        softcap=None, mask=None, lanes=choose_lanes(p.dv, prof), vec=4,
        grid=fold_grid(p.b * p.hq * p.lq, prof.max_grid),
        keys_per_step=2 if prof.device_type == "cpu" else 4,
    )


# --- one shape ------------------------------------------------------------------------------

TUNE_VARIANTS: list[dict] = [
    {"prefetch": False}, {"fused_combine": False},
    {"lanes_per_key": 4}, {"lanes_per_key": 8}, {"lanes_per_key": 16},
    {"local_size": 128}, {"local_size": 512},
    {"keys_per_iter": 1}, {"keys_per_iter": 4},
    {"lanes_per_key": 8, "keys_per_iter": 4}, {"lanes_per_key": 8, "local_size": 512},
    {"f16_convert": "fp16"}, {"subgroup": False},
]
TUNE_SPLITS = [2, 4]  # times the default split count
LITE_VARIANTS: list[dict] = [{"local_size": 128}, {"local_size": 512}, {"lanes_per_key": 16},
                             {"keys_per_iter": 2}, {"fused_combine": False},
                             {"fused_combine": True}]


SL = {"dot_reduce": "scatter", "lazy_rescale": True}


def exp_candidates(base: DecodeRequest, kv: str) -> list[tuple[dict, int | None]]:
    """``--exp``: the old kernel (butterfly dots, eager rescale) against the reduce-scatter
    dot reduction and the lazy rescale, with schedule variants around them."""
    old = {"dot_reduce": "butterfly", "lazy_rescale": False}
    c: list[tuple[dict, int | None]] = [
        (old, None), ({"dot_reduce": "scatter", "lazy_rescale": False}, None),
        ({"dot_reduce": "butterfly", "lazy_rescale": True}, None), (SL, None),
        ({**SL, "keys_per_iter": 4}, None), ({**SL, "lanes_per_key": 16}, None),
        ({**SL, "local_size": 128}, None),
    ]
    if kv == "f16":
        c.append(({**SL, "f16_convert": "fp16"}, None))
    if base.splits > 1:
        c.append((SL, min(64, base.splits * 2)))
    if base.lk <= 8192 and base.splits > 1:  # the small L2-resident shape
        for sp in (2, 4, 8, 32):
            c.append((SL, sp))
        c += [({**SL, "fused_combine": False}, None), ({**SL, "local_size": 512}, None),
              ({**SL, "fused_combine": False}, 32), ({**SL, "local_size": 128}, 8),
              ({**SL, "local_size": 128}, 32)]
    return c


def run_shape(device, shape, kvs, args, ceiling_gbps, clock, results):
    b, hq, hkv, lk = shape
    D = args.d  # noqa: N806 (the module default, overridden by --d)
    live = args.live  # keys each row attends (the rest of the capacity lk is never read)
    rng = np.random.default_rng(sum(shape))
    t0 = time.perf_counter()
    q = rng.standard_normal((b, hq, 1, D), dtype=np.float32)
    k32 = rng.random((b, hkv, lk, D), dtype=np.float32) - 0.5
    v32 = rng.random((b, hkv, lk, D), dtype=np.float32) - 0.5
    scale = 1.0 / math.sqrt(D)
    qb, out, part, counter, lens = query_buffers(device, q, hkv, D, live or lk)
    rng_ok = True
    print(f"# shape {shape}: data {time.perf_counter() - t0:.1f}s", flush=True)
    for kv in kvs:
        ks, vs = to_storage(k32, kv), to_storage(v32, kv)
        kb = device.create_buffer(ks.nbytes, name="k")
        vb = device.create_buffer(vs.nbytes, name="v")
        kb.write(0, ks)
        vb.write(0, vs)
        n = live or lk
        ref = reference(q, from_storage(ks[:, :, :n], kv), from_storage(vs[:, :, :n], kv), scale)
        pbufs, pooled = {}, []
        if args.paged:  # the same keys in pools, blocks shuffled
            slots, read = paged_map(np.random.default_rng(7), b, lk, args.paged_block)
            for name, x in (("k", ks), ("v", vs), ("read", read)):
                arr = to_pool(x, read, slots) if name != "read" else read
                buf = device.create_buffer(arr.nbytes, name=f"paged:{name}")
                buf.write(0, arr)
                pooled.append(buf)
                pbufs[name] = BufferRange(buf, 0, buf.size)
            del arr
        del ks, vs
        bufs = {"q": BufferRange(qb, 0, qb.size), "k": BufferRange(kb, 0, kb.size),
                "v": BufferRange(vb, 0, vb.size), "out": BufferRange(out, 0, out.size),
                "partial": BufferRange(part, 0, part.size),
                "counter": BufferRange(counter, 0, counter.size),
                "len": BufferRange(lens, 0, lens.size)}
        p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=1, lk=lk, dk=D, dv=D, scale=scale,
                          kv_dtype=kv, live_len=bool(live))
        kv_bytes = p.kv_bytes * (live or lk) // lk  # the bytes read: the live keys
        fits = "L2" if kv_bytes <= L2_BYTES else "HBM"

        def measure(name, specs, reps, warm, req=None, kv=kv, ref=ref, kv_bytes=kv_bytes,
                    fits=fits):
            nonlocal rng_ok
            out.write(0, np.full(b * hq * D, np.nan, np.float32))
            lau = Launch(device, specs, repeat=warm_repeat(kv_bytes), calls=args.calls)
            try:
                lau.rec.submit(wait=True)
                got = out.read_array(0, (b, hq, 1, D), np.float32)
                err = nse(got, ref)
                if not err <= TOL:
                    rng_ok = False
                lau.warm(warm)
                ns, per = lau.time(reps)
            finally:
                lau.destroy()
            mhz = clock.sm_mhz()
            gbps = kv_bytes / ns
            row = {"shape": shape, "kv": kv, "kernel": name, "us": ns / 1e3,
                   "per_dispatch_us": [x / 1e3 for x in per], "gbps": gbps,
                   "frac": gbps / ceiling_gbps, "nse": err, "sm_mhz": mhz, "fits": fits,
                   "request": None if req is None else asdict(req)}
            results.append(row)
            sched = "" if req is None else (
                f"splits={req.splits} lpk={req.lanes_per_key} wg={req.local_size} "
                f"kpi={req.keys_per_iter} {'sg' if req.subgroup else 'sh'}"
                f"{' nopf' if not req.prefetch else ''}"
                f"{' 2launch' if req.launches == 2 else ''}"
                f"{' combine2' if req.combine_rounds == 2 else ''}"
                f"{' fp16cvt' if req.f16_convert == 'fp16' else ''}"
                f"{' qwg' if req.q_workgroup else ''}"
                f"{_matrix_tag(req.matrix, req.matrix_feed)}")
            flag = "" if err <= TOL else "  <-- WRONG"
            print(f"{b},{hq},{hkv},{lk} {kv:4} {name:10} {ns / 1e3:9.1f} us {gbps:7.0f} GB/s "
                  f"{gbps / ceiling_gbps:6.1%} [{'+'.join(f'{x / 1e3:.1f}' for x in per)}] "
                  f"nse={err:.1e} {mhz}MHz {fits} {sched}{flag}", flush=True)
            return row

        best = None
        if args.tune and kv in args.tune_dtypes.split(","):
            base = choose_decode_schedule(p, device.profile, has_subgroup_shuffle=True)
            seen = set()
            if args.variants:
                cands = [({k: v for k, v in d.items() if k != "splits"}, d.get("splits"))
                         for d in json.loads(args.variants)]
            elif args.exp:
                cands = exp_candidates(base, kv)
            elif args.lite:
                cands = [({}, None)] + [(v, None) for v in LITE_VARIANTS] + \
                    [({}, 2 if base.splits == 1 else min(64, base.splits * 2))]
            else:
                cands = [({}, None)] + [(v, None) for v in TUNE_VARIANTS] + \
                    [({}, min(64, base.splits * f)) for f in TUNE_SPLITS if base.splits > 1]
            first = True
            for ov, sp in cands:
                if "f16_convert" in ov and kv != "f16":
                    continue
                if "fused_combine" in ov and base.splits == 1:
                    continue
                try:
                    req = choose_decode_schedule(p, device.profile, has_subgroup_shuffle=True,
                                                 force_splits=sp, overrides=ov)
                except Exception as e:  # noqa: BLE001
                    print(f"# skip {ov} splits={sp}: {str(e)[:80]}")
                    continue
                if req in seen:
                    continue
                seen.add(req)
                row = measure("tune", decode_specs(req, bufs), args.tune_reps,
                              args.warm if first else args.tune_warm, req)
                first = False
                if best is None or row["us"] < best[0]:
                    best = (row["us"], ov, sp)
            print(f"# best {shape} {kv}: {best} (default splits={base.splits})", flush=True)
        req = choose_decode_schedule(p, device.profile, has_subgroup_shuffle=True)
        if not args.exp:
            measure("grouped", decode_specs(req, bufs), args.reps, args.warm, req)
        if kv == "f32" and not args.no_streaming and not live:
            sreq = streaming_request(p, device)
            specs = [(generate_attention(sreq), [bufs["q"], bufs["k"], bufs["v"], bufs["out"]],
                      sreq.grid, sreq.push_constants())]
            measure("streaming", specs, max(10, args.reps // 5), args.warm)
        if args.paged:
            slots = pbufs["k"].size // (hkv * D * (4 if kv == "f32" else 2))
            preq = choose_decode_schedule(replace(p, pool_slots=slots), device.profile,
                                          has_subgroup_shuffle=True)
            assert preq == replace(req, pool_slots=slots)  # the schedule of the dense shapes
            measure("paged", decode_specs(preq, {**bufs, **pbufs}), args.reps, args.warm, preq)
            if kv == "f32" and not args.no_streaming and not live:
                sreq = replace(streaming_request(p, device), pool_slots=slots)
                pb = {**bufs, **pbufs, "o": bufs["out"]}
                specs = [(generate_attention(sreq), [pb[x.name] for x in sreq.bindings()],
                          sreq.grid, sreq.push_constants())]
                measure("paged_str", specs, max(10, args.reps // 5), args.warm)
            for buf in pooled:
                buf.destroy()
        kb.destroy()
        vb.destroy()
    for x in (out, part, qb, counter, lens):
        x.destroy()
    return rng_ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="*", default=None, help="B,Hq,Hkv,Lk (D=128, Lq=1)")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--warm", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--lite", action="store_true", help="a few variants around the default")
    ap.add_argument("--exp", action="store_true",
                    help="with --tune: the dot-reduction / rescale variants (exp_candidates)")
    ap.add_argument("--tune-reps", type=int, default=20)
    ap.add_argument("--tune-dtypes", default="f32,f16")
    ap.add_argument("--tune-warm", type=float, default=0.3)
    ap.add_argument("--no-streaming", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--calls", type=int, default=1,
                    help="time this many launches recorded back to back, per launch")
    ap.add_argument("--d", type=int, default=D, help="head dim (Dk = Dv)")
    ap.add_argument("--live", type=int, default=0,
                    help="live keys per row (the live form over a capacity of Lk); 0: Lk")
    ap.add_argument("--paged", action="store_true",
                    help="also time the paged-key kernels on the same keys in shuffled pools")
    ap.add_argument("--paged-block", type=int, default=16,
                    help="keys per pool block (--paged; 1: every key its own random slot)")
    ap.add_argument("--variants", default=None,
                    help='with --tune: a JSON list of schedule overrides, e.g. '
                         '\'[{"rows_per_wg": 1}, {"lanes_per_key": 16, "splits": 8}]\'')
    args = ap.parse_args(argv)
    # a shape may name its own dtypes: B,Hq,Hkv,Lk/f32+f16
    specs = [(s.split("/") + [""])[:2] for s in args.shapes] if args.shapes \
        else [(",".join(map(str, s)), "") for s in SHAPES]
    shapes = [(tuple(int(x) for x in s.split(",")), d.split("+") if d else
               args.dtypes.split(",")) for s, d in specs]
    device = Device()
    clock = SmClock(device.name)
    print(f"# device: {device.name} ({device.profile.device_type}, "
          f"{device.profile.extra.get('driver_info')}), CUs={device.profile.compute_units}, "
          f"max SM clock {clock.max_mhz} MHz", flush=True)
    t0 = time.perf_counter()
    ceil = read_ceiling(device)
    print(f"# read ceiling: {ceil.gbps:.0f} GB/s over {ceil.nbytes >> 20} MiB "
          f"({time.perf_counter() - t0:.1f}s, SM {clock.sm_mhz()} MHz)", flush=True)
    results: list[dict] = []
    ok = True
    for s, kvs in shapes:
        ok &= run_shape(device, s, kvs, args, ceil.gbps, clock, results)
    # final table
    print(f"\nceiling {ceil.gbps:.0f} GB/s; D={args.d}, Lq=1, live={args.live or 'Lk'}; "
          "fraction = K/V bytes read / time / ceiling")
    print("| B,Hq,Hkv,Lk | K/V | fits | grouped us | GB/s | of ceiling | schedule "
          "| streaming of ceiling | SM MHz |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if r["kernel"] != "grouped":
            continue
        st = next((x for x in results if x["kernel"] == "streaming" and x["shape"] == r["shape"]
                   and x["kv"] == r["kv"]), None)
        q = r["request"]
        fused = q["fused_combine"] and q["splits"] > 1
        mat = _matrix_tag(q.get("matrix"), q.get("matrix_feed"))
        sched = (f"splits={q['splits']} lpk={q['lanes_per_key']} wg={q['local_size']} "
                 f"kpi={q['keys_per_iter']}{' fused' if fused else ''}{mat}")
        print(f"| {','.join(map(str, r['shape']))} | {r['kv']} | {r['fits']} | {r['us']:.1f} "
              f"| {r['gbps']:.0f} | {r['frac']:.1%} | {sched} | "
              f"{'-' if st is None else format(st['frac'], '.1%')} | {r['sm_mhz']} |")
    if args.paged:
        print(f"\npaged keys: blocks of {args.paged_block} shuffled over the pool; same schedule")
        print("| B,Hq,Hkv,Lk | K/V | dense us | paged us | paged/dense | streaming dense us "
              "| streaming paged us |")
        print("|---|---|---|---|---|---|---|")

        def us(kernel, r):
            x = next((x for x in results if x["kernel"] == kernel and x["shape"] == r["shape"]
                      and x["kv"] == r["kv"]), None)
            return None if x is None else x["us"]

        for r in results:
            if r["kernel"] != "grouped" or us("paged", r) is None:
                continue
            s_d, s_p = us("streaming", r), us("paged_str", r)
            print(f"| {','.join(map(str, r['shape']))} | {r['kv']} | {r['us']:.1f} "
                  f"| {us('paged', r):.1f} | {us('paged', r) / r['us']:.3f} "
                  f"| {'-' if s_d is None else f'{s_d:.1f}'} "
                  f"| {'-' if s_p is None else f'{s_p:.1f}'} |")
    if args.exp:
        print("\n| B,Hq,Hkv,Lk | K/V | us | of ceiling | schedule |")
        print("|---|---|---|---|---|")
        for r in results:
            q = r["request"]
            print(f"| {','.join(map(str, r['shape']))} | {r['kv']} | {r['us']:.1f} "
                  f"| {r['frac']:.1%} | {q['splits']}sp lpk{q['lanes_per_key']} "
                  f"wg{q['local_size']} kpi{q['keys_per_iter']} {q['dot_reduce']} "
                  f"{'lazy' if q['lazy_rescale'] else 'eager'}"
                  f"{' fused' if q['fused_combine'] and q['splits'] > 1 else ''}"
                  f"{' fp16cvt' if q['f16_convert'] == 'fp16' else ''} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"ceiling_gbps": ceil.gbps, "results": results},
                                              indent=1, default=str))
    device.close()
    print("all outputs match the reference" if ok else "SOME OUTPUTS ARE WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
