"""The 16-bit rounding helpers the generated kernels call, on the device, against numpy.

``f16_round`` rounds in integer arithmetic because NVIDIA's compiler folds
``unpackHalf2x16(packHalf2x16(x))`` into ``x`` (seen on the H200: a fused F16 reduction that
must round 1 + 2**-12 to 1 returned 2**-12). This checks the helper itself on every value
class: normals, ties to even, the largest finite value and the overflow threshold,
subnormals and their ties, signed zeros, infinities and NaN.
"""

from __future__ import annotations

import numpy as np

from pootvk.shaders.common import BF16_ROUND, F16_ROUND
from pootvk.shaders.compiler import compile_glsl
from pootvk.vk import BufferRange, Dispatch, Recorder

SRC = ("#version 450\nlayout(local_size_x = 64) in;\n"
       "layout(std430, binding = 0) readonly buffer A { float x[]; };\n"
       "layout(std430, binding = 1) writeonly buffer B { float y[]; };\n"
       "layout(std430, binding = 2) writeonly buffer C { float z[]; };\n"
       + F16_ROUND + BF16_ROUND
       + "void main() {\n    uint i = gl_GlobalInvocationID.x;\n    if (i >= {n}u) return;\n"
       "    y[i] = f16_round(x[i]);\n    z[i] = uintBitsToFloat(bf16_bits(x[i]) << 16);\n}\n")


def _values() -> np.ndarray:
    rng = np.random.default_rng(7)
    ulp = np.float32(2.0**-10)
    special = [0.0, -0.0, 1.0, 1.0 + 2.0**-12, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11,
               1.0 + ulp + 2.0**-11, 65504.0, 65519.0, 65520.0, -65520.0, 1e9,
               2.0**-14, 2.0**-14 - 2.0**-25, 2.0**-24, 2.0**-25, 3 * 2.0**-25, 2.0**-26,
               -(2.0**-25), 6.0e-8, np.inf, -np.inf, np.nan]
    rand = np.concatenate([rng.standard_normal(400) * 10.0 ** rng.integers(-9, 6, 400),
                           rng.standard_normal(100) * 2.0**-20])
    return np.array(special + list(rand), np.float32)


def _bf16(x: np.ndarray) -> np.ndarray:
    import ml_dtypes

    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def test_rounding_helpers_match_numpy(device):
    x = _values()
    n = x.size
    pipe = device.compute_pipeline(compile_glsl(SRC.replace("{n}", str(n))), 3)
    a = device.create_buffer(n * 4, host_visible=True, name="x")
    y = device.create_buffer(n * 4, host_visible=True, name="y")
    z = device.create_buffer(n * 4, host_visible=True, name="z")
    rec = Recorder(device).record([Dispatch(pipe, (BufferRange(a), BufferRange(y), BufferRange(z)),
                                            (-(-n // 64), 1, 1), "round16")])
    try:
        a.write(0, x)
        rec.submit()
        got16, gotb = y.read_array(0, n, np.float32), z.read_array(0, n, np.float32)
    finally:
        rec.destroy()
        for buf in (a, y, z):
            buf.destroy()
    with np.errstate(over="ignore"):  # 65520 and up round to inf, as intended
        want16 = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got16, want16)  # NaN == NaN here; signs of zeros checked:
    assert np.array_equal(np.signbit(got16), np.signbit(want16))
    np.testing.assert_array_equal(gotb, _bf16(x))
