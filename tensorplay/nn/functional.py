# SPDX-License-Identifier: Apache-2.0
"""Functions on tensors used by neural networks, as in ``torch.nn.functional``."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from tensorplay._ops.distributions import apply_dropout
from tensorplay._ops.softmax import softmax_along

if TYPE_CHECKING:
    from tensorplay._random.generator import Generator
    from tensorplay._tensor.aliases import DTypeLike
    from tensorplay._tensor.tensor import Tensor

__all__ = ["dropout", "softmax", "log_softmax"]


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, *,
            generator: Generator | None = None) -> Tensor:
    """Zero each element of ``input`` with probability ``p`` and scale the others by ``1 / (1 - p)``.

    As ``torch.nn.functional.dropout``; the draw is
    :func:`tensorplay.dropout`'s (one 32-bit draw per element, kept when
    ``w * 2**-32 < 1 - p``).

    Parameters
    ----------
    input : Tensor
        A floating tensor.
    p : float, optional
        The probability of zeroing an element, in [0, 1].
    training : bool, optional
        False returns ``input`` itself.
    inplace : bool, optional
        Write the result into ``input`` (and return it).
    generator : Generator, optional
        Draw from this generator (on ``input``'s device); default the
        device's default generator.

    Returns
    -------
    Tensor
        The result.

    Raises
    ------
    ValueError
        For ``p`` outside [0, 1].
    """
    result: Tensor = apply_dropout(input, p, training, inplace, generator, "dropout")
    return result


def _softmax_dim(name: str, ndim: int, stacklevel: int) -> int:
    """PyTorch's implicit dimension of a softmax called without ``dim`` (deprecated there too)."""
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                  f"as an argument.", UserWarning, stacklevel=stacklevel)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: DTypeLike = None) -> Tensor:
    """Return the softmax of ``input`` along ``dim``, as ``torch.nn.functional.softmax``.

    :func:`tensorplay.softmax`; without ``dim`` (deprecated, as in
    PyTorch) a UserWarning is issued and the dimension is 0 for 0-, 1- and
    3-d tensors, else 1.

    Parameters
    ----------
    input : Tensor
        A floating tensor (or pass a floating ``dtype``).
    dim : int, optional
        The dimension the softmax is taken along.
    _stacklevel : int, optional
        The stack level of the warning issued without ``dim``.
    dtype : dtype, str or None, optional
        Cast ``input`` to this floating dtype first; the result has it.

    Returns
    -------
    Tensor
        The result, ``input``'s shape.
    """
    if dim is None:
        dim = _softmax_dim("softmax", input.ndim, _stacklevel)
    result: Tensor = softmax_along("softmax", input, dim, dtype)
    return result


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: DTypeLike = None) -> Tensor:
    """Return the logarithm of the softmax of ``input`` along ``dim``, as ``torch.nn.functional.log_softmax``.

    :func:`tensorplay.log_softmax`; without ``dim`` as :func:`softmax`.

    Parameters
    ----------
    input : Tensor
        A floating tensor (or pass a floating ``dtype``).
    dim : int, optional
        The dimension the log-softmax is taken along.
    _stacklevel : int, optional
        The stack level of the warning issued without ``dim``.
    dtype : dtype, str or None, optional
        Cast ``input`` to this floating dtype first; the result has it.

    Returns
    -------
    Tensor
        The result, ``input``'s shape.
    """
    if dim is None:
        dim = _softmax_dim("log_softmax", input.ndim, _stacklevel)
    result: Tensor = softmax_along("log_softmax", input, dim, dtype)
    return result
