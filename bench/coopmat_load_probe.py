"""How fast cooperative-matrix loads stream K/V on this device (issue 7's matrix kernel).

    python3 bench/coopmat_load_probe.py [--mb 134] [--warm 0.5] [--reps 20]

Each variant streams the same f16 rows [N, 128] once (16-key blocks, one subgroup per block
in turn) into 16x16x16 products against a constant, the shape of the matrix decode kernel's
QK^T, and reports GB/s against the read ceiling of the same run:

- ``global``: ``coopMatLoad`` straight from the storage buffer (f16vec4 elements), ``U``
  blocks per subgroup per step;
- ``staged``: the workgroup copies a 64-key tile with 16-byte loads into workgroup memory
  (rows padded by 16 bytes), then ``coopMatLoad`` from there;
- ``staged_pf``: the same with the next tile's 16-byte words loaded into registers while
  this one is multiplied.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pootvk.benchmark import ReadCeiling, SmClock, read_ceiling, time_dispatches  # noqa: E402
from pootvk.plan.decode_schedule import COOPMAT_SHAPE, lists_coopmat  # noqa: E402
from pootvk.shaders.compiler import compile_glsl  # noqa: E402
from pootvk.vk import BufferRange, Device, Dispatch  # noqa: E402

HEAD = """#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = {wg}) in;
layout(std430, binding = 0) readonly buffer B0 {{ f16vec4 k[]; }};
layout(std430, binding = 1) readonly buffer B1 {{ uvec4 k16[]; }};
layout(std430, binding = 2) writeonly buffer B2 {{ float o[]; }};
#define A16 coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define B16 coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
"""


def global_src(wg: int, rows_per_wg: int, unroll: int) -> str:
    nsg = wg // 32
    body = []
    for u in range(unroll):
        for d in range(8):
            body.append(f"{{ A16 a; coopMatLoad(a, k, (row + {u * 16}u) * 32u + {d * 4}u, 32u, "
                        "gl_CooperativeMatrixLayoutRowMajor); acc = coopMatMulAdd(a, bq, acc); }")
    return HEAD.format(wg=wg) + f"""
void main() {{
    uint row0 = gl_WorkGroupID.x * {rows_per_wg}u;
    ACC acc = ACC(0.0);
    B16 bq = B16(float16_t(0.01));
    for (uint it = 0u; it < {rows_per_wg // (16 * nsg * unroll)}u; ++it) {{
        uint row = row0 + (it * {nsg}u + gl_SubgroupID) * {16 * unroll}u;
        {' '.join(body)}
    }}
    coopMatStore(acc, o, (gl_WorkGroupID.x * {nsg}u + gl_SubgroupID) * 256u, 16u,
                 gl_CooperativeMatrixLayoutRowMajor);
}}
"""


def staged_src(wg: int, rows_per_wg: int, prefetch: bool) -> str:
    nsg = wg // 32
    tile = 16 * nsg
    words = tile * 16 // wg  # 16-byte words per lane per tile (128 halves a row = 16 words)
    ks = 34  # f16vec4 per padded row
    ld = "\n".join(f"        uvec4 w{i} = k16[(t0 + (lane + {i * wg}u) / 16u) * 16u + (lane + "
                   f"{i * wg}u) % 16u];" for i in range(words))
    st = "\n".join(f"        {{ uint x = lane + {i * wg}u; "
                   f"uint b = x / 16u * {ks}u + x % 16u * 2u; "
                   f"sK[b] = f16vec4(unpackFloat2x16(w{i}.x), unpackFloat2x16(w{i}.y)); "
                   f"sK[b + 1u] = f16vec4(unpackFloat2x16(w{i}.z), unpackFloat2x16(w{i}.w)); }}"
                   for i in range(words))
    mm = " ".join(f"{{ A16 a; coopMatLoad(a, sK, gl_SubgroupID * {16 * ks}u + {d * 4}u, {ks}u, "
                  "gl_CooperativeMatrixLayoutRowMajor); acc = coopMatMulAdd(a, bq, acc); }"
                  for d in range(8))
    if prefetch:
        loop = f"""
    uint t0 = row0;
{ld.replace('uvec4 w', 'uvec4 n').replace('        ', '    ')}
    for (uint it = 0u; it < {rows_per_wg // tile}u; ++it) {{
{''.join(f'        uvec4 w{i} = n{i};' for i in range(words))}
        t0 = row0 + min(it + 1u, {rows_per_wg // tile - 1}u) * {tile}u;
{ld.replace('uvec4 w', 'n').replace('= k16', '= k16')}
        barrier();
{st}
        barrier();
        {mm}
    }}"""
    else:
        loop = f"""
    for (uint it = 0u; it < {rows_per_wg // tile}u; ++it) {{
        uint t0 = row0 + it * {tile}u;
{ld}
        barrier();
{st}
        barrier();
        {mm}
    }}"""
    return HEAD.format(wg=wg) + f"""
shared f16vec4 sK[{tile * ks}];
void main() {{
    uint row0 = gl_WorkGroupID.x * {rows_per_wg}u;
    uint lane = gl_LocalInvocationIndex;
    ACC acc = ACC(0.0);
    B16 bq = B16(float16_t(0.01));
{loop}
    coopMatStore(acc, o, (gl_WorkGroupID.x * {nsg}u + gl_SubgroupID) * 256u, 16u,
                 gl_CooperativeMatrixLayoutRowMajor);
}}
"""


def open_coopmat_device() -> tuple[Device, SmClock, ReadCeiling] | None:
    """The default device, its SM clock and its read ceiling; or None (said in one line, the
    device closed) where it lists no 16x16x16 f16 -> f32 cooperative matrix: the
    tensor-core probes' common start."""
    dev = Device()
    if lists_coopmat(dev.profile):
        return dev, SmClock(dev.name), read_ceiling(dev)
    print(f"# {dev.name} lists no {COOPMAT_SHAPE} cooperative matrix "
          "(VK_KHR_cooperative_matrix): nothing to probe")
    dev.close()
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=134)
    ap.add_argument("--warm", type=float, default=0.5)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    started = open_coopmat_device()
    if started is None:
        return 2
    dev, clock, ceil = started
    print(f"# {dev.name}: read ceiling {ceil.gbps:.0f} GB/s", flush=True)
    rows = (a.mb << 20) // 256 // 8192 * 8192
    data = np.random.default_rng(0).standard_normal((rows, 128)).astype(np.float16)
    kb = dev.create_buffer(data.nbytes, name="k")
    kb.write(0, data)
    ob = dev.create_buffer(64 << 20, name="o")
    rng = BufferRange(kb, 0, kb.size)
    variants = []
    for wg, rpw in ((128, 2048), (128, 1024), (256, 2048), (128, 512)):
        for u in (1, 2, 4):
            variants.append((f"global wg={wg} rows/wg={rpw} unroll={u}", global_src(wg, rpw, u),
                             rows // rpw))
        for pf in (False, True):
            variants.append((f"staged{'_pf' if pf else ''} wg={wg} rows/wg={rpw}",
                             staged_src(wg, rpw, pf), rows // rpw))
    for name, src, groups in variants:
        try:
            pipe = dev.compute_pipeline(compile_glsl(src), 3, 0)
        except Exception as e:  # noqa: BLE001
            print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        d = Dispatch(pipe, (rng, rng, BufferRange(ob, 0, ob.size)), (groups, 1, 1), name)
        us, mhz, _ = time_dispatches(dev, [d], warm_s=a.warm, reps=a.reps, clock=clock)
        gbps = data.nbytes / (us * 1e3)
        print(f"{name:40} {us:8.1f} us {gbps:7.0f} GB/s {gbps / ceil.gbps:6.1%} {mhz} MHz",
              flush=True)
    kb.destroy()
    ob.destroy()
    dev.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
