"""Element types of the IR and how each is stored."""

from __future__ import annotations

from enum import Enum

import numpy as np


class DType(Enum):
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I32 = "i32"
    U32 = "u32"
    BOOL = "bool"

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.BF16)

    @property
    def is_int(self) -> bool:
        return self in (DType.I32, DType.U32)

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype the oracle computes in (BF16 is emulated in F32)."""
        return np.dtype(_NUMPY[self])

    @property
    def device_itemsize(self) -> int:
        """Bytes per element in a Vulkan buffer (Bool is stored as a 32-bit word)."""
        return {DType.F16: 2, DType.BF16: 2}.get(self, 4)

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__


_NUMPY = {
    DType.F32: np.float32,
    DType.F16: np.float16,
    DType.BF16: np.float32,
    DType.I32: np.int32,
    DType.U32: np.uint32,
    DType.BOOL: np.bool_,
}

F32, F16, BF16, I32, U32, BOOL = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32, DType.BOOL


def from_numpy(dt: np.dtype) -> DType:
    dt = np.dtype(dt)
    for d, n in _NUMPY.items():
        if d is not DType.BF16 and np.dtype(n) == dt:
            return d
    raise TypeError(f"numpy dtype {dt} has no pootvk DType")
