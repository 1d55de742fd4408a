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
    def is_16bit(self) -> bool:
        """Stored as 16-bit words (F16, BF16); kernels compute such values in F32."""
        return self in (DType.F16, DType.BF16)

    @property
    def is_int(self) -> bool:
        return self in (DType.I32, DType.U32)

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype the oracle holds values in (BF16 emulated in F32). The oracle
        computes F16/BF16 operands in F32 and rounds each result once, as kernels do."""
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


def _bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def is_float_array(arr: np.ndarray) -> bool:
    """A numpy floating array, or an ``ml_dtypes.bfloat16`` one (numpy kind 'V')."""
    return np.issubdtype(arr.dtype, np.floating) or arr.dtype.name == "bfloat16"


def storage_values(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """Values as a ``dtype`` slot holds them in the oracle: rounded to the storage type
    (BF16 rounded to bfloat16, then held in float32, as ``DType.numpy`` says). An array
    already of the storage type is returned as it is, not copied (K/V can be a GiB)."""
    if dtype is DType.BF16:
        return np.asarray(arr).astype(_bfloat16()).astype(np.float32)
    return np.asarray(arr).astype(dtype.numpy, copy=False)


def device_bytes(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """The array as the device stores it: BOOL a 32-bit word, BF16 its 16 bits."""
    if dtype is DType.BOOL:
        return np.asarray(arr).astype(np.uint32)
    if dtype is DType.BF16:
        return np.asarray(arr, np.float32).astype(_bfloat16()).view(np.uint16)
    return arr


def device_numpy(dtype: DType) -> np.dtype:
    """The numpy dtype of the device's raw elements (what a buffer read returns)."""
    return np.dtype({DType.BOOL: np.uint32, DType.BF16: np.uint16}.get(dtype, _NUMPY[dtype]))


def from_device(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Raw device elements to the oracle's values of ``dtype``."""
    if dtype is DType.BOOL:
        return raw.astype(np.bool_)
    if dtype is DType.BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw
