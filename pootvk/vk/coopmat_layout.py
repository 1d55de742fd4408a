"""Which element layout the device's 16x16x16 f16 cooperative matrices use.

VK_KHR_cooperative_matrix leaves the mapping from a lane's element index to a (row, column)
of the matrix to the implementation. The register-fed decode kernel
(``pootvk.shaders.attention_decode_regfed``) writes K/V words straight into elements, so it
is correct only on a layout it is written for. This module reads the layout back from the
device itself: one 32-lane dispatch loads a matrix whose element (r, c) holds 16 r + c for
each use (A, B, accumulator) and writes every lane's elements out. The answer goes into the
device's profile as ``extra["coopmat_layout"]``; the planner reads only that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .device import Device

#: NVIDIA's layout (the mma.m16n8k16 fragments), lane l = 4 lr + lc, element i:
#: A and the accumulator: row lr + 8 (i >> 2), column 2 lc + (i & 1) + 8 ((i >> 1) & 1);
#: B: row 2 lc + (i & 1) + 8 ((i >> 1) & 1), column lr + 8 (i >> 2).
NV_MMA = "nv_mma"
OTHER = "other"

_GLSL = """#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) readonly buffer B0 { float16_t mh[]; };
layout(std430, binding = 1) readonly buffer B1 { float mf[]; };
layout(std430, binding = 2) writeonly buffer B2 { float o[]; };
void main() {
    uint l = gl_SubgroupInvocationID;
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c;
    coopMatLoad(a, mh, 0u, 16u, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(b, mh, 0u, 16u, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(c, mf, 0u, 16u, gl_CooperativeMatrixLayoutRowMajor);
    if (l == 0u) { o[3072] = float(a.length()); o[3073] = float(b.length());
                   o[3074] = float(c.length()); }
    for (int i = 0; i < a.length() && i < 32; ++i) o[l * 32u + uint(i)] = float(a[i]);
    for (int i = 0; i < b.length() && i < 32; ++i) o[1024u + l * 32u + uint(i)] = float(b[i]);
    for (int i = 0; i < c.length() && i < 32; ++i) o[2048u + l * 32u + uint(i)] = float(c[i]);
}
"""


def nv_mma_elements(use: str) -> np.ndarray:
    """[32 lanes, 8 elements] of 16 row + column in NVIDIA's layout for ``use`` (A, B, C)."""
    out = np.zeros((32, 8), np.int64)
    for ln in range(32):
        lr, lc = ln >> 2, ln & 3
        for i in range(8):
            minor = 2 * lc + (i & 1) + 8 * ((i >> 1) & 1)
            major = lr + 8 * (i >> 2)
            r, c = (minor, major) if use == "B" else (major, minor)
            out[ln, i] = 16 * r + c
    return out


def classify(lengths: tuple[int, int, int], elems: np.ndarray) -> str:
    """NV_MMA when every use's [32, length] elements (A, B, C stacked) match it, else OTHER."""
    if lengths != (8, 8, 8):
        return OTHER
    want = np.stack([nv_mma_elements(u) for u in "ABC"])
    return NV_MMA if np.array_equal(elems[:, :, :8].astype(np.int64), want) else OTHER


def probe_coopmat_layout(device: Device) -> str:
    """The layout of ``device``'s 16x16x16 f16 matrices (NV_MMA or OTHER), read back by one
    dispatch. Only for a device that lists that matrix shape."""
    from pootvk.shaders.compiler import compile_glsl

    from .pipeline import Pipeline
    from .recorder import BufferRange, Dispatch, Recorder

    vals = np.arange(256, dtype=np.float32)
    pipe: Pipeline | None = None
    bufs = [device.create_buffer(512, name="coopmat layout f16"),
            device.create_buffer(1024, name="coopmat layout f32"),
            device.create_buffer(3076 * 4, name="coopmat layout out")]
    try:
        bufs[0].write(0, vals.astype(np.float16))
        bufs[1].write(0, vals)
        bufs[2].write(0, np.full(3076, -1.0, np.float32))
        # its own pipeline, destroyed here: a probe run once at open leaves nothing in the
        # device's pipeline cache (a fresh Device owns only its transfer pool, fence and
        # pipeline cache)
        pipe = Pipeline(device, compile_glsl(_GLSL), 3, 0)
        d = Dispatch(pipe, tuple(BufferRange(b, 0, b.size) for b in bufs), (1, 1, 1),
                     "coopmat layout")
        rec = Recorder(device).record([d])
        try:
            rec.submit(wait=True)
        finally:
            rec.destroy()
        out = bufs[2].read_array(0, (3076,), np.float32)
    finally:
        if pipe is not None:
            pipe.destroy()
        for b in bufs:
            b.destroy()
    lengths = tuple(int(x) for x in out[3072:3075])
    return classify(lengths, out[:3072].reshape(3, 32, 32))  # type: ignore[arg-type]
