# SPDX-License-Identifier: Apache-2.0
"""The ``with tensorplay.cuda.device(i):`` context manager."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorplay._driver.context import current_device, device_index, set_device

if TYPE_CHECKING:
    from tensorplay._device import DeviceLike


class device:
    """Make ``device`` this thread's current CUDA device inside a ``with`` block.

    The previous current device is restored on exit (cuCtxSetCurrent on the
    device's primary context). ``None`` or a CPU device does nothing, as in
    PyTorch.

    Parameters
    ----------
    device : device, str, int or None
        The CUDA device: an index, ``"cuda:1"`` or a :class:`tensorplay.device`.
    """

    def __init__(self, device: DeviceLike) -> None:
        self._index: int | None = None
        self._prev: int | None = None
        if device is None or (isinstance(device, str) and device == "cpu") or \
                getattr(device, "type", None) == "cpu":
            return
        self._index = device_index(device)

    def __enter__(self) -> device:
        if self._index is not None:
            self._prev = current_device()
            set_device(self._index)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._index is not None:
            set_device(self._prev)
