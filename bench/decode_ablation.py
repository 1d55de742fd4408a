"""Where a decode kernel's tail goes: the planned kernel against copies that return early.

    python3 bench/decode_ablation.py [--shape B,Hq,Hkv,Lk] [--kv f16] [--variant JSON]
        [--cut NAME ...] [--out-host] [--rounds 3] [--reps 20] [--warm 0.7]

Why: with no profiler on the lent GPU, and clock reads that perturb the kernel they time
(``bench/decode_timeline.py``: 157 against 137 us), the cost of each phase after the key
loop is measured by difference. Each cut inserts ``if (nit < 1000000u) return;`` at one
point of the generated source (the condition is never true, so nothing before the cut is
dead code the compiler could drop) and is timed against the whole kernel in one process,
the variants alternated round by round (a lent machine's clock and its atomics differ
from call to call, so only same-call differences mean anything). A cut kernel's output
is wrong by design; the whole kernel's is checked against float64 numpy.

Cuts, in kernel order (the register-fed kernel's fold has three barriers; the scalar
kernel's more):

- ``loop``: right after the key loop;
- ``bar1``, ``bar2``: after the first / second workgroup barrier that follows it;
- ``stores``: after the split's partial stores, before the fused combine's arrival;
- ``arrival``: after the arrival's fence and barrier, before the atomic;
- ``combine``: after the atomic, before the last workgroup's combine;
- ``fold2``: not a cut; the code between the first two barriers runs twice in a loop
  that is not unrolled, to tell a cold first pass (instruction fetch) from the work.

``--out-host`` puts the output in host memory, as an export of a plan is; ``--unmapped``
allocates every buffer from device memory the host cannot map (on a ReBAR machine the
runtime otherwise takes the host-visible device-local type). H200 findings are in
BENCHMARKS.md (session 24).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_probe import Launch, decode_specs, dense_case, nse, warm_repeat  # noqa: E402
from pootvk.benchmark import SmClock  # noqa: E402
from pootvk.plan.decode_schedule import choose_decode_schedule  # noqa: E402
from pootvk.vk import Device  # noqa: E402

#: the key loop's first line: the workgroup's step count, or (the register-fed kernel with
#: tiles in turn) each subgroup's walk over its blocks
LOOPS = ("    for (uint it = 0u; it < nit; ++it) {", "    while (tb < NB) {")
CUT = "    if (nit < 1000000u) return;"


def _loop_end(lines: list[str]) -> int:
    start = next(i for i, ln in enumerate(lines) if ln.startswith(LOOPS))
    return next(j for j in range(start + 1, len(lines)) if lines[j] == "    }")


def _barriers(lines: list[str]) -> list[int]:
    end = _loop_end(lines)
    return [k for k in range(end, len(lines)) if lines[k] == "    barrier();"]


def _arrival(lines: list[str]) -> int:
    """The line of the fused combine's first statement (``if (nact == 1u) return;``)."""
    at = next((k for k, ln in enumerate(lines) if "no partial to combine" in ln), None)
    if at is None:
        raise SystemExit("this kernel has no fused combine (unsplit, or two launches): "
                         "the stores, arrival and combine cuts need one")
    return at


def cut(src: str, name: str) -> str:
    lines = src.split("\n")
    if name == "none":
        return src
    if name == "loop":
        at = _loop_end(lines) + 1
    elif name in ("bar1", "bar2"):
        at = _barriers(lines)[int(name[-1]) - 1] + 1
    elif name == "stores":
        at = _arrival(lines)
    elif name in ("arrival", "combine"):
        a = _arrival(lines)
        marker = "barrier();" if name == "arrival" else "if (s_last == 0u)"
        at = next(k for k in range(a, len(lines)) if lines[k].strip().startswith(marker)) + 1
    elif name == "fold2":
        b1, b2 = _barriers(lines)[:2]
        lines[b1 + 1:b2] = ["    uint nrep = 1u + min(nit, 1u);",
                            "    [[dont_unroll]] for (uint rep = 0u; rep < nrep; ++rep) {",
                            *lines[b1 + 1:b2], "    }"]
        return "\n".join(lines)
    else:
        raise SystemExit(f"unknown cut {name!r}")
    lines.insert(at, CUT)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="1,32,8,32768", help="B,Hq,Hkv,Lk (D=128, Lq=1)")
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--variant", default="{}", help="JSON schedule overrides ('splits' forces)")
    ap.add_argument("--cut", nargs="*", default=["none", "loop", "bar1", "bar2", "stores",
                                                 "arrival", "combine"])
    ap.add_argument("--out-host", action="store_true")
    ap.add_argument("--unmapped", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warm", type=float, default=0.7)
    args = ap.parse_args(argv)
    b, hq, hkv, lk = (int(x) for x in args.shape.split(","))
    d = 128
    dev = Device()
    dev.allow_mapped_device_memory = not args.unmapped
    clock = SmClock(dev.name)
    case = dense_case(dev, b, hq, hkv, lk, d, args.kv, out_host=args.out_host)
    bufs, nbytes = case.bufs, case.kv_bytes
    counter = bufs["counter"].buffer
    ov = json.loads(args.variant)
    splits = ov.pop("splits", None)
    req = choose_decode_schedule(case.problem, dev.profile, has_subgroup_shuffle=True,
                                 force_splits=splits, overrides=ov or None)
    where = (" out in host memory" if args.out_host else "") + \
        (" unmapped device memory" if args.unmapped else "")
    print(f"{args.shape} {args.kv}{where}: "
          f"{req.describe()}", flush=True)
    # launches a warm-up submit records (decode_probe's rule; one on a CPU device, whose
    # launches take milliseconds)
    wrep = 1 if dev.profile.device_type == "cpu" else warm_repeat(nbytes)
    launches = {}
    for name in args.cut:
        specs = decode_specs(req, bufs)
        specs[0] = (cut(specs[0][0], name), *specs[0][1:])
        lau = Launch(dev, specs, repeat=wrep, calls=10)
        bufs["out"].buffer.write(0, np.full(b * hq * d, np.nan, np.float32))
        counter.write(0, np.zeros(counter.size // 4, np.uint32))  # a cut may leave it set
        lau.rec.submit(wait=True)
        launches[name] = (lau, nse(case.read_out(), case.ref))
    times: dict[str, list[tuple[float, int | None]]] = {n: [] for n in args.cut}
    # the memory clock, power and clock-event reasons after each timing: the fused
    # combine's arrival cost 0.5 us on some runs and 4.5-4.9 us on others of the same
    # code (BENCHMARKS.md, session 24), with the SM clock at its maximum in both
    state: list[tuple[int | None, float | None, int | None]] = []
    for _ in range(args.rounds):
        for name in args.cut:
            counter.write(0, np.zeros(counter.size // 4, np.uint32))
            lau = launches[name][0]
            lau.warm(args.warm)
            ns, _per = lau.time(args.reps)
            times[name].append((ns / 1e3, clock.sm_mhz()))
            state.append((clock.mem_mhz(), clock.power_w(), clock.event_reasons()))
    for name in args.cut:
        us = [t for t, _ in times[name]]
        med = statistics.median(us)
        err = launches[name][1]
        check = f"nse {err:.1e}" if name == "none" else "(cut: output not checked)"
        print(f"  {name:8} {med:8.1f} us ({', '.join(f'{x:.1f}' for x in us)}) "
              f"{nbytes / med / 1e3:6.0f} GB/s  MHz {[m for _, m in times[name]]}  {check}",
              flush=True)
    mems = sorted({m for m, _, _ in state if m is not None})
    watts = [w for _, w, _ in state if w is not None]
    reasons = sorted({r for _, _, r in state if r is not None})
    print(f"  memory clock MHz {mems or 'n/a'}; power W "
          f"{f'{min(watts):.0f}-{max(watts):.0f}' if watts else 'n/a'}; clock-event "
          f"reasons {[hex(r) for r in reasons] or 'n/a'}", flush=True)
    for lau, _ in launches.values():
        lau.destroy()
    case.destroy()
    dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
