"""Driver statistics (registers, spills, local memory, instructions...) of generated kernels.

    python3 bench/kernel_stats.py [--device N] [--quick] [--no-decode] [--no-gemv]
                                  [--no-model] [--json FILE]

Why: a kernel's time can be set by its register allocation rather than its bytes (the H200's
grouped decode kernel grows super-linearly with rows per workgroup at Dk=576, a suspected
spill). The driver knows: with POOTVK_PIPELINE_STATS=1 (this script's Device sets it in its
Config, whatever the environment says) pipelines are created with
VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR and ``Pipeline.statistics()`` returns what the
driver reports through VK_KHR_pipeline_executable_properties, names as the driver gives them.

One table row per kernel variant, planned for the live device's profile:

- decode attention (``choose_decode_schedule(..., overrides=...)`` then
  ``generate_decode``): D=128 (B=1, Hq=32, Hkv=8, Lk=32768) F16 and F32, and the MLA shape
  (B=1, Hq=128, Hkv=1, Dk=576 = 512 + shared 64, Dv=512, F16); the planner's schedule, then
  every combination of rows_per_wg 1/2/4/8 (those dividing the group), lanes_per_key 8/16/32
  and local_size 128/256 that the schedule accepts; the partial kernel and (where the
  schedule has one) the combine kernel;
- GEMV/GEMM: the planner's kernels for ``x[M, K] @ W`` (W stored [K, N] and [N, K], F16 and
  F32) at (K, N) = (576, 1536) and (4096, 14336), M = 1 and 512;
- the kernels of the test model (``LlamaConfig(layers=1)``, F16 weights): fused and
  elementwise ones included, each distinct request once.

Columns: GLSL source lines, then every statistic any row reported (in first-seen order).
Without the extension (lavapipe) the table keeps the GLSL lines and says why there are no
statistics. ``--quick`` (lavapipe, CI): small shapes and a few variants.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gemv import graph as gemv_graph  # noqa: E402
from pootvk.config import config  # noqa: E402
from pootvk.errors import (  # noqa: E402
    AttentionLds,
    DtypeLowering,
    PipelineStatisticsUnavailable,
    ShapeError,
)
from pootvk.ir import F16, F32  # noqa: E402
from pootvk.llm import LlamaConfig, trace_llama  # noqa: E402
from pootvk.passes import compile_graph  # noqa: E402
from pootvk.plan import DecodeProblem, DecodeRequest, plan_graph  # noqa: E402
from pootvk.plan.decode_schedule import choose_decode_schedule  # noqa: E402
from pootvk.shaders.attention_decode import generate_decode  # noqa: E402
from pootvk.shaders.compiler import compile_glsl  # noqa: E402
from pootvk.shaders.generate import generate  # noqa: E402
from pootvk.vk import Device  # noqa: E402

#: (name, B, Hq, Hkv, Lk, Dk, shared, Dv, kv dtype)
DECODE = [
    ("d128-f16", 1, 32, 8, 32768, 128, 0, 128, "f16"),
    ("d128-f32", 1, 32, 8, 32768, 128, 0, 128, "f32"),
    ("mla-f16", 1, 128, 1, 32768, 576, 64, 512, "f16"),
]
QUICK_DECODE = [
    ("d64-f32", 1, 8, 2, 1024, 64, 0, 64, "f32"),
    ("mla-small-f16", 1, 8, 1, 1024, 96, 32, 64, "f16"),
]
ROWS, LANES, LOCALS = (1, 2, 4, 8), (8, 16, 32), (128, 256)
QUICK_OVERRIDES = [{"rows_per_wg": 1}, {"rows_per_wg": 2, "lanes_per_key": 8}]
GEMV = [(576, 1536), (4096, 14336)]
QUICK_GEMV = [(256, 384)]
GEMM_ROWS, QUICK_GEMM_ROWS = 512, 16


class Row(NamedTuple):
    kernel: str
    variant: str
    schedule: str
    glsl_lines: int
    stats: dict[str, int | float | bool]


class Collector:
    """Compiles each distinct source once into a pipeline and reads its statistics."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.rows: list[Row] = []
        self.unavailable: str | None = None
        self._seen: dict[str, dict[str, int | float | bool]] = {}

    def add(self, kernel: str, variant: str, schedule: str, src: str, n_bindings: int,
            push_words: int) -> None:
        stats = self._seen.get(src)
        if stats is None:
            pipe = self.device.compute_pipeline(compile_glsl(src), n_bindings, push_words)
            try:
                stats = pipe.statistics()
            except PipelineStatisticsUnavailable as e:
                self.unavailable, stats = str(e), {}
            pipe.destroy()  # the table needs the numbers, not hundreds of live pipelines
            self._seen[src] = stats
        self.rows.append(Row(kernel, variant, schedule, len(src.splitlines()), stats))
        print(f"  {kernel:<22} {variant:<24} {_fmt_stats(stats)}", flush=True)


def _fmt_stats(stats: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in stats.items()) or "-"


def _short(r: DecodeRequest) -> str:
    return (f"rows={r.rows_per_wg} lanes={r.lanes_per_key} wg={r.local_size} "
            f"kpi={r.keys_per_iter} load={r.load_elems} splits={r.splits}"
            f"{' sg' if r.subgroup else ''}{' scatter' if r.dot_reduce == 'scatter' else ''}"
            f"{' lazy' if r.lazy_rescale else ''}")


def decode_rows(c: Collector, quick: bool) -> None:
    prof = c.device.profile
    for name, b, hq, hkv, lk, dk, s, dv, kv in QUICK_DECODE if quick else DECODE:
        p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=1, lk=lk, dk=dk, dv=dv,
                          scale=1 / math.sqrt(dk), kv_dtype=kv, dk_shared=s)
        group = hq // hkv
        overrides: list[dict] = [{}]
        if quick:
            overrides += QUICK_OVERRIDES
        else:
            overrides += [
                {"rows_per_wg": r, "lanes_per_key": ln, "local_size": ls}
                for r, ln, ls in itertools.product(ROWS, LANES, LOCALS) if group % r == 0
            ]
        seen: set[DecodeRequest] = set()
        for ov in overrides:
            label = "plan" if not ov else " ".join(
                f"{k.split('_')[0]}={v}" for k, v in ov.items())
            try:
                req = choose_decode_schedule(p, prof, has_subgroup_shuffle=prof.subgroup_shuffle,
                                             overrides=ov or None)
            except (ShapeError, AttentionLds, DtypeLowering) as e:
                print(f"  {name:<22} {label:<24} refused: {type(e).__name__}: {e}")
                continue
            if ov and req in seen:  # the schedule clamped it to an earlier variant
                print(f"  {name:<22} {label:<24} same request as an earlier row ({_short(req)})")
                continue
            seen.add(req)
            srcs = generate_decode(req)
            c.add(f"{name} partial", label, _short(req), srcs[0], len(req.bindings()),
                  len(req.push_constants()))
            if len(srcs) > 1:
                c.add(f"{name} combine", label, _short(req), srcs[1],
                      len(req.combine_bindings()), 0)


def plan_rows(c: Collector, kernel: str, graph) -> None:  # type: ignore[no-untyped-def]
    """Every distinct kernel the planner makes for ``graph`` on the live profile."""
    plan = plan_graph(compile_graph(graph), c.device.profile)
    seen = set()
    for k in plan.kernels:
        if k.request in seen:
            continue
        seen.add(k.request)
        describe = getattr(k.request, "describe", None)
        c.add(kernel, k.label, describe() if describe else type(k.request).__name__,
              generate(k.request), len(k.bindings), len(k.request.push_constants()))


def matmul_graph(m: int, k: int, n: int, dt, layout: str):  # type: ignore[no-untyped-def]
    """The graph bench/gemv.py times: x[m, k] @ W stored [k, n] ("kn") or [n, k] ("nk")."""
    return gemv_graph(k, n, dt, layout, rows=m)


def gemv_rows(c: Collector, quick: bool) -> None:
    for (k, n), m, (dn, dt), layout in itertools.product(
        QUICK_GEMV if quick else GEMV, (1, QUICK_GEMM_ROWS if quick else GEMM_ROWS),
        (("f16", F16), ("f32", F32)), ("kn", "nk"),
    ):
        plan_rows(c, f"mm M={m} {k}x{n} {dn} {layout}", matmul_graph(m, k, n, dt, layout))


def model_rows(c: Collector) -> None:
    plan_rows(c, "model L=1 f16", trace_llama(LlamaConfig(layers=1, weight_dtype="float16")))


def print_table(rows: list[Row]) -> None:
    names: list[str] = []
    for r in rows:
        names += [n for n in r.stats if n not in names]
    head = ["kernel", "variant", "glsl", *names, "schedule"]
    body = [[r.kernel, r.variant, str(r.glsl_lines),
             *(str(r.stats.get(n, "")) for n in names), r.schedule] for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head) - 1)]
    for line in [head, *body]:
        print(" | ".join(x.ljust(w) for x, w in zip(line, widths, strict=False)) + " | "
              + line[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true", help="small shapes, few variants")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--no-gemv", action="store_true")
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args(argv)
    # POOTVK_PIPELINE_STATS=1 for this script's own Device (not the process-wide one).
    device = Device(a.device, dataclasses.replace(config(), pipeline_stats=True))
    try:
        return _run(a, device)
    finally:
        device.close()


def _run(a: argparse.Namespace, device: Device) -> int:
    p = device.profile
    print(f"device: {device.name} ({p.device_type}, {p.driver} {p.extra.get('driver_info', '')}"
          f"); pipeline statistics: "
          f"{'captured' if device.captures_pipeline_statistics else 'not available'}")
    c = Collector(device)
    if not a.no_decode:
        decode_rows(c, a.quick)
    if not a.no_gemv:
        gemv_rows(c, a.quick)
    if not a.no_model:
        model_rows(c)
    print()
    if c.unavailable:
        print(f"no statistics: {c.unavailable}")
    print_table(c.rows)
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"device": device.name, "driver": p.driver, "unavailable": c.unavailable,
             "rows": [r._asdict() for r in c.rows]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
