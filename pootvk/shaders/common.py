"""Pieces every generated kernel shares: the header, buffer blocks, the folded-grid id."""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping

import numpy as np

from ..ir import DType
from ..ir.dtypes import device_bytes, storage_values
from ..plan.bindings import Access, Binding

GLSL_TYPE = {
    DType.F32: "float", DType.I32: "int", DType.U32: "uint", DType.BOOL: "uint",
    # 16-bit values are stored as raw 16-bit words (GL_EXT_shader_16bit_storage): kernels
    # copy them as they are or convert through F32 (shaders.prims: Convert)
    DType.F16: "uint16_t", DType.BF16: "uint16_t",
}
STORAGE_16BIT = "#extension GL_EXT_shader_16bit_storage : require\n"


def glsl_type(dt: DType) -> str:
    return GLSL_TYPE[dt]


def float_lit(x: float) -> str:
    """An exact GLSL float: inf/nan through their bit patterns, finite values round-tripped."""
    if math.isnan(x):
        return "uintBitsToFloat(0x7fc00000u)"
    if math.isinf(x):
        return "uintBitsToFloat(0x7f800000u)" if x > 0 else "uintBitsToFloat(0xff800000u)"
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return f"uintBitsToFloat(0x{bits:08x}u)"


def compute_type(dt: DType) -> str:
    """The GLSL type a kernel computes a ``dt`` value in: F16/BF16 in F32."""
    return "float" if dt.is_16bit else GLSL_TYPE[dt]


def stored_float(value: float, dt: DType) -> float:
    """A float literal as a ``dt`` slot stores it (rounded to F16/BF16, then widened)."""
    return float(storage_values(np.asarray(value, np.float64), dt))


def storage_bits(value: float, dt: DType) -> int:
    """The 16-bit word a F16/BF16 slot stores for ``value``."""
    return int(device_bytes(np.asarray([value], np.float32).astype(dt.numpy), dt)
               .view(np.uint16)[0])


def to_f32(x: str, src: DType) -> str:
    """A stored 16-bit word (``x``, a uint16_t expression) as the F32 value it holds."""
    if src is DType.F16:
        return f"unpackHalf2x16(uint({x})).x"
    return f"uintBitsToFloat(uint({x}) << 16)"  # BF16: the top half of an F32


def from_f32(x: str, dst: DType) -> str:
    """An F32 value as the 16-bit word of ``dst`` (round to nearest even, NaN stays NaN);
    BF16 needs ``BF16_ROUND`` in the source."""
    if dst is DType.F16:
        return f"uint16_t(packHalf2x16(vec2({x}, 0.0)) & 0xffffu)"
    return f"uint16_t(bf16_bits({x}))"


BF16_ROUND = """uint bf16_bits(float f) {
    uint b = floatBitsToUint(f);
    if (isnan(f)) return (b >> 16) | 0x40u;  // a quiet NaN stays NaN
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;  // round to nearest even
}
"""


def literal(value: float | int | bool, dt: DType) -> str:
    """A literal of ``dt``'s compute type: a 16-bit float is the F32 of its stored value."""
    if dt.is_16bit:
        return float_lit(stored_float(float(value), dt))
    if dt is DType.F32:
        return float_lit(float(value))
    if dt is DType.BOOL:
        return "1u" if value else "0u"
    if dt is DType.U32:
        return f"{int(value)}u"
    return f"int({int(value)})"


def header(local_size: int, storage16: bool = False) -> str:
    ext = STORAGE_16BIT if storage16 else ""
    return f"#version 450\n{ext}layout(local_size_x = {local_size}) in;\n"


def buffer_block(binding: int, name: str, elem: str, *, readonly: bool) -> str:
    access = "readonly " if readonly else ""
    return (
        f"layout(std430, set = 0, binding = {binding}) {access}buffer B{binding} "
        f"{{ {elem} {name}[]; }};\n"
    )


def declare_bindings(
    bindings: tuple[Binding, ...], elem: Mapping[str, str] | None = None
) -> str:
    """Buffer blocks for a request's bindings, in order; ``elem`` overrides the element type
    of some (vec4 views of f32 data)."""
    over = elem or {}
    return "".join(
        buffer_block(i, b.name, over.get(b.name, glsl_type(b.dtype)),
                     readonly=b.access is Access.READ)
        for i, b in enumerate(bindings)
    )


def group_id(gx: int) -> str:
    """The linear workgroup id over a (possibly folded 2-D) grid."""
    return f"(gl_WorkGroupID.y * {gx}u + gl_WorkGroupID.x)"


def strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))
