# SPDX-License-Identifier: Apache-2.0
"""The multi-tensor copy kernel's table, shared by staging (stage_and_launch)
and rebinding (rebind_and_launch): its capacities, its entries and grid, and
the check of a static tensor both take."""

from tensorplay._tensor.base cimport DEVICE_CUDA, TensorBase

# The table sizes the copy kernel is built for, smallest first.
COPY_CAPACITIES = (8, 32, MAX_COPY_ENTRIES)


cdef Py_ssize_t copy_capacity(Py_ssize_t entries) noexcept:
    """The smallest table size of COPY_CAPACITIES holding ``entries`` (the largest beyond)."""
    for cap in COPY_CAPACITIES:
        if cap >= entries:
            return cap
    return MAX_COPY_ENTRIES


cdef TensorBase static_tensor(object obj, int device, str api, str what):
    """``obj`` as the TensorBase a graph call keeps for a static tensor:
    TypeError unless a tensor, ValueError unless on cuda:``device``."""
    if not isinstance(obj, TensorBase):
        raise TypeError(f"{api}: {what} is a {type(obj).__name__}, not a tensor")
    cdef TensorBase t = <TensorBase>obj
    if t._device_type != DEVICE_CUDA or t._device_index != device:
        raise ValueError(f"{api}: {what} must live on cuda:{device}")
    return t
