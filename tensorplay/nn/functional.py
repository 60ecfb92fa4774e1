# SPDX-License-Identifier: Apache-2.0
"""Functions on tensors used by neural networks, as in ``torch.nn.functional``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorplay._ops.distributions import apply_dropout

if TYPE_CHECKING:
    from tensorplay._random.generator import Generator
    from tensorplay._tensor.tensor import Tensor

__all__ = ["dropout"]


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
