"""A plain streaming-read kernel: the device's own read-bandwidth ceiling for benchmarks.

Each invocation sums vec4 words in a grid-stride loop and writes one float, so the compiler
cannot drop the reads; the result buffer is tiny compared to what is read.
"""

from __future__ import annotations

from .common import buffer_block, header

READ_WG = 256


def generate_read(n_vec4: int, threads: int) -> str:
    return (
        header(READ_WG)
        + buffer_block(0, "src", "vec4", readonly=True)
        + buffer_block(1, "dst", "float", readonly=False)
        + f"""
void main() {{
    uint gid = gl_GlobalInvocationID.x;
    vec4 acc = vec4(0.0);
    for (uint i = gid; i < {n_vec4}u; i += {threads}u) acc += src[i];
    dst[gid] = acc.x + acc.y + acc.z + acc.w;
}}
"""
    )
