# SPDX-License-Identifier: Apache-2.0
"""The annotation aliases that need no Tensor: what a parameter of the tensor
core accepts. ``tensorplay.types`` publishes them (with the ones that name
Tensor); the Tensor stub imports them from here, so that it imports neither
``tensorplay.types`` nor the random generators, which import Tensor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, TypeAlias

import numpy as np

from tensorplay._dtypes import dtype

__all__ = ["Activation", "DTypeLike", "Dims", "GeneratorLike", "Number", "Size"]

#: A Python scalar operand: ``bool``, ``int`` or ``float``.
Number: TypeAlias = bool | int | float

#: A dtype: a :class:`tensorplay.dtype`, its name (``"float16"``), a NumPy
#: dtype, a Python type (``bool``, ``int``, ``float``), or None (the default).
DTypeLike: TypeAlias = dtype | str | type | np.dtype[Any] | None

#: A shape: one int or a sequence of ints.
Size: TypeAlias = int | Sequence[int]

#: The dimensions a reduction runs over: one, several, or None (all).
Dims: TypeAlias = int | Sequence[int] | None

#: The activation fused into a matrix product (:func:`tensorplay.linear`,
#: :func:`tensorplay.addmm`): ``"relu"``, ``"gelu"`` (the tanh approximation) or None.
Activation: TypeAlias = Literal["relu", "gelu"] | None


class GeneratorLike(Protocol):
    """A random number generator as the tensor methods take one
    (:class:`tensorplay.Generator`)."""

    def manual_seed(self, seed: int) -> Any:
        """Seed the generator."""
        ...

    def initial_seed(self) -> int:
        """The seed the generator started from."""
        ...
