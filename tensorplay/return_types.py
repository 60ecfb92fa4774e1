# SPDX-License-Identifier: Apache-2.0
"""Named tuples returned by the reductions that give values and indices:
``tensorplay.return_types``, as ``torch.return_types``.

``tensorplay.max(x, dim)`` returns ``return_types.max(values, indices)``;
unpack it (``values, indices = x.max(0)``) or read its fields.
"""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

# Generic over the tensor type, so that this module imports no Tensor (the
# Tensor stub names return_types.max[Tensor]): no import circle
T = TypeVar("T")

__all__ = ["max", "min"]


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
