"""Where a step of the tensor-core (staged) decode kernel spends its cycles: MLA shape.

    python3 bench/mla_phases.py [--shape B,Hq,Hkv,Lk,Dk,s,Dv] [--variant JSON ...]
                                [--warm 0.5] [--reps 20]

Why: the staged kernel's step (16 keys of the MLA shape: copy, scores, softmax, P V) costs
~2.6 us, several times its products at the device's measured cooperative-matrix rate
(``bench/coopmat_peak.py``), and the lent GPU has no profiler. This probe instruments the
generated kernel's key loop: subgroup 0 of every workgroup reads the SM clock
(``clock2x32ARB``, VK_KHR_shader_clock's subgroup clock) before and after every workgroup
barrier of a step and sums each phase's cycles over the steps, so each line says how many
cycles a step spends computing (``work``) or waiting at the barrier (``wait``) in each phase.
The instrumented kernel's time is printed beside the plain one's (the clock reads cost a
little), and its partial output is checked against float64 numpy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.mla_decode import TOL, make_inputs, nse, reference  # noqa: E402
from pootvk.benchmark import SmClock, time_dispatches  # noqa: E402
from pootvk.config import config  # noqa: E402
from pootvk.errors import PipelineStatisticsUnavailable  # noqa: E402
from pootvk.plan.decode_schedule import (  # noqa: E402
    DecodeProblem,
    choose_decode_schedule,
    matrix_supported,
)
from pootvk.shaders.attention_decode import generate_decode  # noqa: E402
from pootvk.shaders.compiler import compile_glsl  # noqa: E402
from pootvk.vk import BufferRange, Device, Dispatch  # noqa: E402

LOOP = "for (uint it = 0u; it < nit;"


def instrument(src: str, binding: int) -> tuple[str, list[str]]:
    """``src`` with SM-clock reads around each barrier of the key loop's body (its first
    unrolled step), the cycles per phase summed in registers and written per workgroup into
    binding ``binding``; also the phase names."""
    lines = src.split("\n")
    first_ext = next(i for i, ln in enumerate(lines) if ln.startswith("#extension"))
    lines.insert(first_ext, "#extension GL_ARB_shader_clock : require")
    main = next(i for i, ln in enumerate(lines) if ln.startswith("void main()"))
    lines.insert(main, f"layout(set = 0, binding = {binding}) buffer Ph {{ uint ph[]; }};")
    loop = next(i for i, ln in enumerate(lines) if ln.strip().startswith(LOOP))
    indent = len(lines[loop]) - len(lines[loop].lstrip())
    body = indent + 4
    out: list[str] = []
    npro = 0  # clock reads before the prologue's own barriers
    for ln in lines[:loop]:
        if ln.startswith("    barrier();"):
            out.append(f"    uint c_pro{npro} = clock2x32ARB().x;")
            npro += 1
        out.append(ln)
    # the step's own barriers (the rare rescale branch's, deeper, are part of a phase)
    end, d = loop, 0
    for end in range(loop, len(lines)):
        d += lines[end].count("{") - lines[end].count("}")
        if d == 0:
            break
    leads = [len(ln) - len(ln.lstrip()) for ln in lines[loop:end]
             if ln.strip().startswith("barrier();")]
    base = min(leads)
    names: list[str] = []
    k = 0
    depth = 0
    for i in range(loop, len(lines)):
        ln = lines[i]
        s = ln.strip()
        if i == loop:
            out.append(ln)
            out.append(" " * body + "uint cp = clock2x32ARB().x;")
            depth = 1
            continue
        if depth == 0:
            out.append(ln)
            continue
        lead = len(ln) - len(ln.lstrip())
        if s.startswith("barrier();") and lead == base and depth > 0:
            out.append(" " * lead + f"{{ uint c = clock2x32ARB().x; p{k} += c - cp; cp = c; }}")
            names.append(f"work {len(names) // 2 + 1}")
            k += 1
            out.append(ln)
            out.append(" " * lead + f"{{ uint c = clock2x32ARB().x; p{k} += c - cp; cp = c; }}")
            names.append(f"wait {len(names) // 2 + 1}")
            k += 1
            continue
        depth += ln.count("{") - ln.count("}")
        out.append(ln)
        if depth == 0:  # the loop closed
            out.append("    uint c_loop_end = clock2x32ARB().x;")
    # the end of main: the epilogue's cycles, then the record (a workgroup that returns
    # early writes none)
    close = max(i for i, ln in enumerate(out) if ln == "}")
    rec = ["    if (gl_LocalInvocationIndex == 0u) {",
           f"        uint pw = (gl_WorkGroupID.y * gl_NumWorkGroups.x + "
           f"gl_WorkGroupID.x) * {k + 4 + npro}u;"]
    rec += [f"        ph[pw + {j}u] = p{j};" for j in range(k)]
    rec += [f"        ph[pw + {k}u] = c_loop - c_start;  // prologue",
            f"        ph[pw + {k + 1}u] = c_loop_end - c_loop;  // the loop",
            f"        ph[pw + {k + 2}u] = clock2x32ARB().x - c_loop_end;  // epilogue",
            f"        ph[pw + {k + 3}u] = max(nit, 1u);"]
    rec += [f"        ph[pw + {k + 4 + j}u] = c_pro{j} - c_start;" for j in range(npro)]
    rec += ["    }"]
    out[close:close] = rec
    decl = [f"    uint p{j} = 0u;" for j in range(k)] + ["    uint c_loop = clock2x32ARB().x;"]
    out[loop:loop] = decl
    main_at = next(i for i, ln in enumerate(out) if ln.startswith("void main()"))
    out.insert(main_at + 1, "    uint c_start = clock2x32ARB().x;")
    return "\n".join(out), names, npro


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="1,128,1,32768,576,64,512")
    ap.add_argument("--variant", action="append", default=None,
                    help="JSON schedule overrides (repeatable); the planner's first")
    ap.add_argument("--warm", type=float, default=0.5)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    b, hq, hkv, lk, dk, s, dv = map(int, a.shape.split(","))
    dev = Device(None, replace(config(), shader_clock=True, pipeline_stats=True))
    if not dev.shader_clock:
        print(f"# {dev.name}: no VK_KHR_shader_clock: nothing to probe")
        dev.close()
        return 2
    p = DecodeProblem(b=b, hq=hq, hkv=hkv, lq=1, lk=lk, dk=dk, dv=dv, scale=dk ** -0.5,
                      kv_dtype="f16", dk_shared=s)
    if not matrix_supported(p, dev.profile, has_subgroup_shuffle=True):
        print(f"# {dev.name}: the tensor-core decode kernel cannot run here (no "
              "VK_KHR_cooperative_matrix 16x16x16 f16 -> f32, see matrix_supported)")
        dev.close()
        return 2
    clock = SmClock(dev.name)
    q, kn, kp, v = make_inputs((b, hq, hkv, lk, dk, s, dv), np.float16, separate_v=True)
    ref = reference(q, kn, kp, v)
    bufs = {}
    for name, arr in (("q", q), ("k", kn), ("k_shared", kp), ("v", v)):
        buf = dev.create_buffer(arr.nbytes, name=name)
        buf.write(0, arr)
        bufs[name] = buf
    bufs["partial"] = dev.create_buffer(b * hq * 64 * (dv + 2) * 4, name="partial")
    bufs["out"] = dev.create_buffer(b * hq * dv * 4, name="out")
    bufs["counter"] = dev.create_buffer(b * hq * 4, name="counter")
    bufs["counter"].write(0, np.zeros(b * hq, np.uint32))
    ph = dev.create_buffer(1 << 20, name="phases")
    variants = [{}] + [json.loads(x) for x in (a.variant or [])]
    worst = 0.0
    print(f"# {dev.name}; shape {a.shape}; cycles per step (SM clock), subgroup 0, median "
          "over workgroups", flush=True)
    for ov in variants:
        r = choose_decode_schedule(p, dev.profile, has_subgroup_shuffle=True,
                                   overrides={"matrix": 16, **ov})
        srcs = generate_decode(r)
        pb = [BufferRange(bufs[x.name], 0, bufs[x.name].size) for x in r.bindings()]
        pipe = dev.compute_pipeline(compile_glsl(srcs[0]), len(pb), len(r.push_constants()))
        try:
            stats = ", ".join(f"{k}={v}" for k, v in pipe.statistics().items())
        except PipelineStatisticsUnavailable as e:
            stats = f"no statistics ({e})"
        ds = [Dispatch(pipe, tuple(pb), (*r.grid, 1), "partial", push=r.push_constants())]
        isrc, names, npro = instrument(srcs[0], len(pb))
        ipb = (*pb, BufferRange(ph, 0, ph.size))
        ids = [Dispatch(dev.compute_pipeline(compile_glsl(isrc), len(ipb),
                                             len(r.push_constants())),
                        ipb, (*r.grid, 1), "instrumented", push=r.push_constants())]
        if r.launches == 2:
            cb = tuple(BufferRange(bufs[x.name], 0, bufs[x.name].size)
                       for x in r.combine_bindings())
            comb = Dispatch(dev.compute_pipeline(compile_glsl(srcs[1]), 2, 0), cb,
                            (*r.combine_grid, 1), "combine")
            ds.append(comb)
            ids.append(comb)
        us, mhz, _ = time_dispatches(dev, ds, warm_s=a.warm, reps=a.reps, clock=clock)
        ius, _, _ = time_dispatches(dev, ids, warm_s=0.1, reps=a.reps, clock=clock)
        err = nse(bufs["out"].read_array(0, ref.shape, np.float32), ref)
        worst = max(worst, err)
        pus, _, _ = time_dispatches(dev, ds[:1], warm_s=0.1, reps=a.reps, clock=clock)
        words = len(names) + 4 + npro
        raw = ph.read_array(0, (r.workgroups, words), np.uint32).astype(np.float64)
        raw = raw[raw[:, len(names) + 3] > 0]  # workgroups that wrote their record
        steps = raw[:, len(names) + 3]
        per = raw[:, :len(names)] / steps[:, None]
        pro, loop_c, epi = (float(np.median(raw[:, len(names) + i])) for i in range(3))
        print(f"\n{json.dumps(ov) if ov else 'planner'}: {r.describe().split(' mask=none ')[-1]}")
        print(f"  driver: {stats}")
        f = mhz or 1980
        print(f"  plain {us:.1f} us (partial kernel alone {pus:.1f}), instrumented {ius:.1f} "
              f"us at {mhz} MHz; nse {err:.1e}; steps per workgroup {statistics.median(steps):.0f}")
        print(f"  per workgroup (median): prologue {pro / f:.2f} us, loop {loop_c / f:.2f} us, "
              f"epilogue {epi / f:.2f} us; prologue barriers reached at "
              + ", ".join(f"{np.median(raw[:, len(names) + 4 + j]) / f:.2f}"
                          for j in range(npro)) + " us")
        total = 0.0
        for j, name in enumerate(names):
            med = float(np.median(per[:, j]))
            total += med
            print(f"  {name:8} {med:8.0f} cycles")
        print(f"  step     {total:8.0f} cycles = {total / f:.2f} us at {f} MHz")
    for buf in (*bufs.values(), ph):
        buf.destroy()
    dev.close()
    if not worst <= TOL:
        print(f"# an output missed the float64 reference (nse {worst:.1e} > {TOL:g})")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
