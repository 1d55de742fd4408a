"""What one dependent GEMV level costs when its weights come from DRAM rather than the L2,
and whether reading the next level's weights early (a concurrent prefetch) hides it.

    python3 bench/chain_probe.py [--links 120] [--warm 1.0] [--reps 30] [--quick]

A chain ``x -> Linear(W_0) -> Linear(W_1) -> ...`` alternating 576->1536 and 1536->576 F16
weights (SmolLM2's FFN shapes), one recorded step, its GPU time from timestamps around the
whole recording (``timestamps="bounds"``), divided by the links. Cases, one run:

* ``shared``: two weight matrices reused by every link (3.5 MB: they stay in the L2);
* ``distinct``: one matrix per link (``--links`` x 1.77 MB: past the L2 when over ~60 MB,
  as in a 30-layer model whose 269 MB of weights are read once per token);
* ``prefetch+A``: ``distinct`` with a plain read kernel of link i+A's weights recorded next
  to link i (no hazard between them: they run concurrently, in link i's level).

Each output is checked against float64 numpy first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pootvk.access import Access  # noqa: E402
from pootvk.benchmark import SmClock, time_dispatches  # noqa: E402
from pootvk.ir import F16, F32  # noqa: E402
from pootvk.ops import Builder  # noqa: E402
from pootvk.runtime import build_replay, resolve_device  # noqa: E402
from pootvk.shaders.compiler import compile_glsl  # noqa: E402
from pootvk.shaders.readbw import READ_WG, generate_read  # noqa: E402
from pootvk.vk import BufferRange, Dispatch  # noqa: E402

SHAPES = ((1536, 576), (576, 1536))  # W [N, K]: 576 -> 1536, then 1536 -> 576


def chain(links: int, distinct: bool):
    b = Builder()
    x = b.input("x", (1, 576))
    ws = {}
    for i in range(links):
        name = f"w{i}" if distinct else f"w{i % 2}"
        if name not in ws:
            ws[name] = b.param(name, SHAPES[i % 2], F16)
        x = b.matmul(x, b.transpose(b.convert(ws[name], F32), (1, 0)))
    b.export("y", x)
    return b.build()


def weights(links: int, distinct: bool, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(links if distinct else 2):
        n, k = SHAPES[i % 2]
        out[f"w{i}"] = (rng.standard_normal((n, k), np.float32) / np.sqrt(k)).astype(np.float16)
    return out


def reference(x: np.ndarray, ws: dict[str, np.ndarray], links: int, distinct: bool):
    y = x.astype(np.float64)
    for i in range(links):
        y = y @ ws[f"w{i}" if distinct else f"w{i % 2}"].astype(np.float64).T
    return y


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--links", type=int, default=120)
    ap.add_argument("--warm", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--ahead", default="1,2")
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true", help="8 links, short warm (lavapipe)")
    a = ap.parse_args(argv)
    if a.quick:
        a.links, a.warm, a.reps = 8, 0.05, 3
    device = resolve_device(a.device)
    clock = SmClock(device.name)
    print(f"device: {device.name}; {clock.note or f'SM clock max {clock.max_mhz} MHz'}")
    x = np.random.default_rng(1).standard_normal((1, 576), np.float32)
    wbytes = [n * k * 2 for n, k in SHAPES]
    for distinct in (False, True):
        ws = weights(a.links, distinct)
        rp = build_replay(chain(a.links, distinct), device)
        try:
            rp.set_params(ws)
            y = rp.step({"x": x})["y"]
            ref = reference(x, ws, a.links, distinct)
            err = float(((y - ref) ** 2).sum() / (ref**2).sum())
            assert err < 5e-4, err
            ds = list(rp.recording.dispatches)
            assert len(ds) == a.links, [d.label for d in ds]
            cases = [("distinct" if distinct else "shared", ds)]
            if distinct:
                # The weight binding of link i: the READ range of its size.
                wr = [next(r for r, acc in zip(d.bindings, d.accesses, strict=True)
                           if acc == Access.READ and r.nbytes == wbytes[i % 2])
                      for i, d in enumerate(ds)]
                dst = device.create_buffer(4 * READ_WG * 512 * a.links, name="pf-dst")
                for ahead in (int(s) for s in a.ahead.split(",") if s):
                    seq = []
                    for i, d in enumerate(ds):
                        seq.append(d)
                        j = i + ahead
                        if j < len(ds):
                            n16 = wr[j].nbytes // 16
                            threads = min(READ_WG * 512, max(READ_WG, n16 // READ_WG * READ_WG))
                            pipe = device.compute_pipeline(
                                compile_glsl(generate_read(n16, threads, 1)), 2)
                            seq.append(Dispatch(
                                pipe, (wr[j], BufferRange(dst, 4 * threads * i, 4 * threads)),
                                (threads // READ_WG, 1, 1), f"prefetch w{j}",
                                access=(Access.READ, Access.WRITE)))
                    cases.append((f"prefetch+{ahead}", seq))
            for name, seq in cases:
                med, mhz, barriers = time_dispatches(device, seq, warm_s=a.warm, reps=a.reps,
                                                     clock=clock, program_order=True)
                mb = (a.links * sum(wbytes) / 2 if distinct else sum(wbytes)) / 1e6
                print(f"{name:12s} links {a.links:4d}  weights {mb:7.1f} MB  "
                      f"step {med:9.1f} us  per link {med / a.links:6.2f} us  "
                      f"barriers {barriers}  nse {err:.1e}  SM {mhz} MHz", flush=True)
            if distinct:
                dst.destroy()
        finally:
            rp.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
