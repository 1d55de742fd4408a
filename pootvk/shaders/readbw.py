"""A plain streaming-read kernel: the device's own read-bandwidth ceiling for benchmarks.

Each invocation sums vec4 words in a grid-stride loop, ``unroll`` independent loads per
step so several are in flight per thread, and writes one float, so the compiler cannot
drop the reads; the result buffer is tiny compared to what is read.
"""

from __future__ import annotations

from .common import buffer_block, header

READ_WG = 256


def generate_read(n_vec4: int, threads: int, unroll: int = 4) -> str:
    assert 1 <= unroll <= 4
    step = threads * unroll
    loads = "\n".join(
        f"        a{j} += src[i + {j * threads}u];" for j in range(unroll)
    )
    return (
        header(READ_WG)
        + buffer_block(0, "src", "vec4", readonly=True)
        + buffer_block(1, "dst", "float", readonly=False)
        + f"""
void main() {{
    uint gid = gl_GlobalInvocationID.x;
    vec4 a0 = vec4(0.0), a1 = vec4(0.0), a2 = vec4(0.0), a3 = vec4(0.0);
    uint i = gid;
    for (; i + {step - threads}u < {n_vec4}u; i += {step}u) {{
{loads}
    }}
    for (; i < {n_vec4}u; i += {threads}u) a0 += src[i];
    vec4 acc = (a0 + a1) + (a2 + a3);
    dst[gid] = acc.x + acc.y + acc.z + acc.w;
}}
"""
    )
