"""Element types gradops accepts, and the type each one accumulates in."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ._errors import InvalidArgumentError

bfloat16 = np.dtype(ml_dtypes.bfloat16)

#: Floating types of the convolution gradient ops, as TF registers them on GPU.
FLOAT_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(np.float16),
    bfloat16,
    np.dtype(np.float32),
    np.dtype(np.float64),
)

#: FractionalAvgPoolGrad: TF's int32/int64/float32/float64 plus the half types.
FRACTIONAL_POOL_DTYPES: tuple[np.dtype, ...] = FLOAT_DTYPES + (
    np.dtype(np.int32),
    np.dtype(np.int64),
)


def accumulator_dtype(dtype: np.dtype) -> np.dtype:
    """Type the convolution math runs in: float32 for the half types, else the type itself."""
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(np.float16), bfloat16):
        return np.dtype(np.float32)
    return dtype


def lowest(dtype: np.dtype):
    """Eigen::NumTraits<T>::lowest(): the most negative finite value of ``dtype``, where TF's
    running maxima start (ml_dtypes' finfo covers bfloat16)."""
    import ml_dtypes

    dtype = np.dtype(dtype)
    return dtype.type((np.iinfo if dtype.kind in "iu" else ml_dtypes.finfo)(dtype).min)


def dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name


def check_dtypes(op: str, allowed: tuple[np.dtype, ...], **tensors) -> np.dtype:
    """All ``tensors`` (name -> dtype) must share one dtype from ``allowed``; return it."""
    names = list(tensors)
    # Byte order is storage, not type: '>f4' is float32 (the data is made native later).
    first = np.dtype(tensors[names[0]]).newbyteorder("=")
    for name in names:
        dtype = np.dtype(tensors[name]).newbyteorder("=")
        if dtype not in allowed:
            raise InvalidArgumentError(
                f"{op}: {name} has dtype {dtype_name(dtype)}; supported dtypes are "
                + ", ".join(dtype_name(d) for d in allowed)
            )
        if dtype != first:
            raise InvalidArgumentError(
                f"{op}: {name} has dtype {dtype_name(dtype)} but {names[0]} has "
                f"{dtype_name(first)}; all tensors of one call must share a dtype"
            )
    return first
