# SPDX-License-Identifier: Apache-2.0
"""Named tuples returned by the reductions and sorts that give values and indices:
``tensorplay.return_types``, as ``torch.return_types``.

``tensorplay.max(x, dim)`` returns ``return_types.max(values, indices)``;
unpack it (``values, indices = x.max(0)``) or read its fields.
"""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

# Generic over the tensor type, so that this module imports no Tensor (the
# Tensor stub names return_types.max[Tensor]): no import circle
T = TypeVar("T")

__all__ = ["max", "min", "sort", "topk"]


class max(NamedTuple, Generic[T]):  # noqa: A001 - torch.return_types.max
    """The result of :func:`tensorplay.max` along a dimension."""

    #: The largest value of each slice along the dimension.
    values: T
    #: Where each largest value is along the dimension (int64; the first one on ties).
    indices: T


class min(NamedTuple, Generic[T]):  # noqa: A001 - torch.return_types.min
    """The result of :func:`tensorplay.min` along a dimension."""

    #: The smallest value of each slice along the dimension.
    values: T
    #: Where each smallest value is along the dimension (int64; the first one on ties).
    indices: T


class sort(NamedTuple, Generic[T]):
    """The result of :func:`tensorplay.sort`."""

    #: The values in sorted order along the dimension.
    values: T
    #: Where each value was along the dimension (int64; equal values keep their order).
    indices: T


class topk(NamedTuple, Generic[T]):
    """The result of :func:`tensorplay.topk`."""

    #: The ``k`` largest (or smallest) values along the dimension, in sorted order.
    values: T
    #: Where each value is along the dimension (int64; the lower index first on ties).
    indices: T
