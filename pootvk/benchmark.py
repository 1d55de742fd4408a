"""Decode-attention benchmark: GB/s of K/V read, as a fraction of the device's own ceiling.

Everything is measured in one run on one device: the streaming-read ceiling (a plain read
kernel over a buffer of random words larger than any cache), the attention kernel's GPU time from
timestamps (K/V bytes / time), the whole step's wall time from Python, and the numpy
oracle's time on the same shapes. Only ratios leave this module's report.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from .ir import AttentionForm, Params
from .ir.prims import ATTENTION
from .ops import trace_decode_step
from .oracle import eval_rules, evaluate
from .runtime import build_replay
from .shaders.compiler import compile_glsl
from .shaders.readbw import READ_WG, generate_read
from .vk import BufferRange, Device, Dispatch, Recorder


@dataclass
class ReadCeiling:
    nbytes: int
    gbps: float


@dataclass
class DecodeResult:
    shape: tuple[int, int, int, int, int]  # B, Hq, Hkv, Lk, D
    kv_bytes: int
    attn_gbps: float
    ceiling_frac: float
    attn_us: float
    step_gpu_us: float
    step_wall_us: float
    numpy_us: float
    max_err: float
    nse: float

    @property
    def vs_numpy(self) -> float:
        return self.numpy_us / self.step_wall_us


def read_ceiling(device: Device, nbytes: int | None = None, reps: int = 10) -> ReadCeiling:
    """Best GB/s of a plain vec4 read kernel over ``nbytes`` of random words.

    Several launch shapes are tried (one or four loads in flight per invocation, about one
    or eight resident waves) and the best is the ceiling: no single shape is best on every
    driver, and a ceiling must not be flattered by a weak read kernel.
    """
    limit = device.profile.max_storage_buffer_range
    if nbytes is None:
        nbytes = min(limit, 1 << 30) if device.profile.device_type != "cpu" else 64 << 20
    nbytes = min(nbytes, limit) // 16 * 16
    units = device.profile.compute_units or 8
    src = device.create_buffer(nbytes, name="read-src")
    try:
        # Random words: a zero-filled buffer can read faster than DRAM allows on GPUs that
        # compress memory, which would flatter the ceiling.
        src.write(0, np.random.default_rng(0).bytes(nbytes))
        best = math.inf
        for groups, unroll in ((units * 8, 4), (units * 64, 4), (units * 64, 1)):
            threads = READ_WG * min(65535, max(1, groups))
            threads = min(threads, max(READ_WG, nbytes // 16 // READ_WG * READ_WG))
            best = min(best, _time_read(device, src, nbytes, threads, unroll, reps))
    finally:
        src.destroy()
    return ReadCeiling(nbytes, nbytes / best)


def _time_read(device: Device, src, nbytes: int, threads: int, unroll: int, reps: int) -> float:
    dst = device.create_buffer(threads * 4, name="read-dst")
    try:
        spv = compile_glsl(generate_read(nbytes // 16, threads, unroll))
        pipe = device.compute_pipeline(spv, 2)
        rec = Recorder(device).record(
            [Dispatch(pipe, (BufferRange(src, 0, nbytes), BufferRange(dst, 0, threads * 4)),
                      (threads // READ_WG, 1, 1), "read")],
            timestamps=True,
        )
        try:
            best = math.inf
            for _ in range(reps):
                rec.submit()
                best = min(best, rec.gpu_time_ns() or math.inf)
        finally:
            rec.destroy()
    finally:
        dst.destroy()
    return best


def bench_decode(
    device: Device,
    shape: tuple[int, int, int, int, int],
    ceiling: ReadCeiling,
    reps: int = 20,
) -> DecodeResult:
    """One decode step at (B, Hq, Hkv, Lk, D) with a full cache (position Lk - 1)."""
    b, hq, hkv, lk, d = shape
    g = trace_decode_step(b, hq, hkv, d, lk)
    rng = np.random.default_rng(0)
    rp = build_replay(g, device, timestamps=True)
    try:
        kc = rng.random((b, hkv, lk, d), dtype=np.float32) - 0.5
        vc = rng.random((b, hkv, lk, d), dtype=np.float32) - 0.5
        rp.set_state("k_cache", kc)
        rp.set_state("v_cache", vc)
        values = {
            "q": rng.standard_normal((b, hq, 1, d), dtype=np.float32),
            "k_new": rng.standard_normal((b, hkv, 1, d), dtype=np.float32),
            "v_new": rng.standard_normal((b, hkv, 1, d), dtype=np.float32),
            "pos": np.int32(lk - 1),
        }
        out = rp.step(values)["out"]
        attn, gpu, wall = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            rp.step(values)
            wall.append(time.perf_counter() - t0)
            times = rp.recording.dispatch_times_ns()
            attn.append(times[-1])
            gpu.append(rp.gpu_time_ns())
        ref = evaluate(g, {**values, "k_cache": kc, "v_cache": vc})["out"]
        # numpy's time for the same attention (the fused op's oracle on the written caches)
        kc2, vc2 = kc.copy(), vc.copy()
        kc2[:, :, lk - 1] = values["k_new"][:, :, 0]
        vc2[:, :, lk - 1] = values["v_new"][:, :, 0]
        form = AttentionForm(scale=1 / math.sqrt(d), n_rep=hq // hkv)
        t0 = time.perf_counter()
        eval_rules[ATTENTION]([values["q"], kc2, vc2], Params(form=form))
        numpy_s = time.perf_counter() - t0
    finally:
        rp.close()
    kv_bytes = b * hkv * lk * d * 4 * 2
    attn_ns = statistics.median(attn)
    gbps = kv_bytes / attn_ns
    err = np.abs(out - ref)
    return DecodeResult(
        shape=shape, kv_bytes=kv_bytes, attn_gbps=gbps, ceiling_frac=gbps / ceiling.gbps,
        attn_us=attn_ns / 1e3, step_gpu_us=statistics.median(gpu) / 1e3,
        step_wall_us=statistics.median(wall) * 1e6, numpy_us=numpy_s * 1e6,
        max_err=float(err.max()), nse=float(((out - ref) ** 2).sum() / (ref**2).sum()),
    )


CPU_SHAPES = [(1, 8, 8, 1024, 64), (1, 32, 8, 2048, 128), (4, 32, 8, 1024, 128),
              (1, 8, 1, 8192, 64)]
GPU_SHAPES = [(1, 32, 8, 4096, 128), (1, 32, 8, 32768, 128), (8, 32, 8, 8192, 128),
              (32, 32, 8, 4096, 128), (16, 64, 8, 16384, 128), (1, 8, 1, 65536, 64)]


def run(device: Device, shapes: list[tuple[int, int, int, int, int]] | None = None,
        out=sys.stdout) -> list[DecodeResult]:
    """Measure ``shapes`` (default: a set sized for the device) and print a markdown table."""
    if shapes is None:
        shapes = CPU_SHAPES if device.profile.device_type == "cpu" else GPU_SHAPES
    ceiling = read_ceiling(device)
    print(f"device: {device.name} ({device.profile.device_type}, {device.profile.driver})",
          file=out)
    print(f"streaming-read ceiling: {ceiling.gbps:.1f} GB/s over {ceiling.nbytes >> 20} MiB",
          file=out)
    print("| B | Hq | Hkv | Lk | D | K/V MiB | attn GB/s | of ceiling | attn us "
          "| step GPU us | step wall us | vs numpy | max err |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", file=out)
    results = []
    for s in shapes:
        r = bench_decode(device, s, ceiling)
        results.append(r)
        print(f"| {' | '.join(map(str, s))} | {r.kv_bytes / 2**20:.0f} | {r.attn_gbps:.1f} "
              f"| {r.ceiling_frac:.1%} | {r.attn_us:.1f} | {r.step_gpu_us:.1f} "
              f"| {r.step_wall_us:.1f} | {r.vs_numpy:.1f}x | {r.max_err:.1e} |", file=out,
              flush=True)
    return results
