# SPDX-License-Identifier: Apache-2.0
"""The CUDA devices' default random number generators: ``tensorplay.cuda.manual_seed`` and friends.

Each CUDA device has one default :class:`tensorplay.Generator`, made on
first use (its state is 32 bytes of device memory, which must be allocated
outside CUDA graph captures). Seeding a device whose generator is not made
yet records the seed for when it is, so seeding does not initialise CUDA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorplay._driver.context import is_available
from tensorplay._random.generator import (DefaultGenerators, cuda_devices, cuda_initial_seed, default_cuda_generator,
                                 default_generators, seed_cuda_device, seed_value)
from tensorplay._tensor.args import resolve_device

if TYPE_CHECKING:
    from tensorplay._tensor.tensor import Tensor
    from tensorplay.types import DeviceLike

__all__ = ["default_generators", "get_rng_state", "initial_seed", "manual_seed", "manual_seed_all",
           "set_rng_state"]

default_generators: DefaultGenerators = default_generators


def _index(device: DeviceLike) -> int:
    """The CUDA device index of ``device`` (None: the current device)."""
    dev = resolve_device("cuda" if device is None else device)
    if dev < 0:
        raise ValueError(f"expected a CUDA device, got {device!r}")
    return dev


def manual_seed(seed: int) -> None:
    """Seed the default generator of the current CUDA device.

    Silently does nothing without CUDA, as in PyTorch.

    Parameters
    ----------
    seed : int
        In [-2**63, 2**64); negative seeds wrap around.
    """
    s = seed_value(seed)
    if is_available():
        seed_cuda_device(_index(None), s)


def manual_seed_all(seed: int) -> None:
    """Seed the default generator of every CUDA device (nothing without CUDA).

    Parameters
    ----------
    seed : int
        In [-2**63, 2**64); negative seeds wrap around.
    """
    s = seed_value(seed)
    for dev in cuda_devices():
        seed_cuda_device(dev, s)


def initial_seed() -> int:
    """Return the seed of the current CUDA device's default generator.

    Returns
    -------
    int
        In [0, 2**64).
    """
    return cuda_initial_seed(_index(None))


def get_rng_state(device: DeviceLike = None) -> Tensor:
    """Return the state of a CUDA device's default generator.

    The 16 bytes are copied from the device after the current stream's
    work (a synchronizing copy; not inside a CUDA graph capture).

    Parameters
    ----------
    device : device, str, int or None, optional
        Default the current device.

    Returns
    -------
    Tensor
        A CPU uint8 tensor of 16 bytes: seed, offset (little-endian uint64).
    """
    return default_cuda_generator(_index(device)).get_state()


def set_rng_state(new_state: Tensor, device: DeviceLike = None) -> None:
    """Set the state of a CUDA device's default generator.

    A one-thread kernel on the current stream writes it, so this can be
    captured in a CUDA graph.

    Parameters
    ----------
    new_state : Tensor
        A CPU uint8 tensor of 16 bytes from :func:`get_rng_state` or
        :meth:`tensorplay.Generator.get_state`.
    device : device, str, int or None, optional
        Default the current device.
    """
    default_cuda_generator(_index(device)).set_state(new_state)
