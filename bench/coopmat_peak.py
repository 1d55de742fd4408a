"""How many tensor-core FLOP/s cooperative matrices reach on this device (issue 8's MLA goal).

    python3 bench/coopmat_peak.py [--warm 0.5] [--reps 20] [--iters 2048]

The MLA decode shape (Hq=128 query heads over one latent KV head, Dk=576, Dv=512, 32k keys,
f16) does 9.1 GFLOP against 71.3 MB of K/V: at 0.7 of the read ceiling the products alone
must run at ~400 TFLOP/s. This probe measures what VK_KHR_cooperative_matrix
(16x16x16 f16 x f16 -> f32, subgroup scope) sustains here, with no memory traffic at all:

- ``regs``: every operand in registers, ``acc`` independent accumulators per subgroup
  (``acc_i = A B + acc_i`` in turn, so products do not wait on each other);
- ``shared``: the A operand loaded from workgroup memory before each product (what the
  staged decode kernel does for every K block and every P V tile), B in registers.

It prints TFLOP/s per variant and, for the best, the fraction of the read ceiling the MLA
shape could at most reach if its products ran at that rate and nothing else cost time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.coopmat_load_probe import open_coopmat_device  # noqa: E402
from pootvk.benchmark import time_dispatches  # noqa: E402
from pootvk.shaders.compiler import compile_glsl  # noqa: E402
from pootvk.vk import BufferRange, Dispatch  # noqa: E402

#: The MLA decode shape of issue 8: FLOPs of S = Q K^T and O = P V, and the K/V bytes read.
MLA_FLOP = 2 * 128 * 32768 * (576 + 512)
MLA_BYTES = 32768 * (512 + 64 + 512) * 2

HEAD = """#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = {wg}) in;
layout(std430, binding = 0) readonly buffer B0 {{ f16vec4 src[]; }};
layout(std430, binding = 1) writeonly buffer B1 {{ float o[]; }};
#define A16 coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define B16 coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define ROW gl_CooperativeMatrixLayoutRowMajor
shared f16vec4 sA[{tiles} * 16 * 4];
"""


def source(wg: int, acc: int, iters: int, shared_a: bool, tiles: int = 8) -> str:
    """One kernel: every subgroup runs ``iters`` x ``acc`` 16x16x16 products."""
    body = [f"ACC c{i} = ACC(0.0);" for i in range(acc)]
    body.append("A16 a; coopMatLoad(a, sA, 0u, 4u, ROW);")
    body.append("B16 b; coopMatLoad(b, src, 64u, 4u, ROW);")
    loop = []
    for i in range(acc):
        if shared_a:
            loop.append(f"coopMatLoad(a, sA, ((it + {i}u) % {tiles}u) * 64u, 4u, ROW);")
        loop.append(f"c{i} = coopMatMulAdd(a, b, c{i});")
    tail = [f"c0 = c0 + c{i};" for i in range(1, acc)]
    return HEAD.format(wg=wg, tiles=tiles) + f"""
void main() {{
    for (uint i = gl_LocalInvocationIndex; i < {tiles * 64}u; i += {wg}u) sA[i] = src[i % 64u];
    barrier();
    {chr(10).join('    ' + x for x in body)}
    for (uint it = 0u; it < {iters}u; ++it) {{
        {chr(10).join('        ' + x for x in loop)}
    }}
    {chr(10).join('    ' + x for x in tail)}
    coopMatStore(c0, o, (gl_WorkGroupID.x * {wg // 32}u + gl_SubgroupID) * 256u, 16u, ROW);
}}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warm", type=float, default=0.5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--iters", type=int, default=2048)
    a = ap.parse_args(argv)
    started = open_coopmat_device()
    if started is None:
        return 2
    dev, clock, ceil = started
    cu = dev.profile.compute_units or 1
    print(f"# {dev.name}: read ceiling {ceil.gbps:.0f} GB/s, {cu} compute units", flush=True)
    src = dev.create_buffer(1 << 16, name="src")
    src.write(0, bytes(1 << 16))
    out = dev.create_buffer(64 << 20, name="o")
    best = 0.0
    for shared_a in (False, True):
        for wg in (128, 256):
            for acc in (1, 2, 4, 8):
                groups = cu * 8
                if groups * (wg // 32) * 256 * 4 > out.size:
                    continue
                name = f"{'shared' if shared_a else 'regs'} wg={wg} acc={acc}"
                pipe = dev.compute_pipeline(compile_glsl(source(wg, acc, a.iters, shared_a)),
                                            2, 0)
                d = Dispatch(pipe, (BufferRange(src, 0, src.size), BufferRange(out, 0, out.size)),
                             (groups, 1, 1), name)
                us, mhz, _ = time_dispatches(dev, [d], warm_s=a.warm, reps=a.reps, clock=clock)
                flop = groups * (wg // 32) * a.iters * acc * 2 * 16 * 16 * 16
                tf = flop / (us * 1e-6) / 1e12
                best = max(best, tf)
                print(f"{name:28} {us:9.1f} us {tf:7.1f} TFLOP/s {mhz} MHz", flush=True)
    floor_us = MLA_FLOP / (best * 1e12) * 1e6
    ceil_us = MLA_BYTES / (ceil.gbps * 1e3)
    print(f"# best {best:.1f} TFLOP/s: the MLA decode shape's products alone take "
          f">= {floor_us:.1f} us, its K/V read {ceil_us:.1f} us at the ceiling: at most "
          f"{ceil_us / max(floor_us, ceil_us):.0%} of the read ceiling (goal 70%)")
    src.destroy()
    out.destroy()
    dev.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
