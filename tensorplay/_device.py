# SPDX-License-Identifier: Apache-2.0
"""``tensorplay.device``: where a tensor lives."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias


class device:
    """A device where tensors live: ``device('cpu')``, ``device('cuda')``, ``device('cuda:1')``.

    As ``torch.device``: ``device('cuda', 1)`` is ``device('cuda:1')``, and a
    device is equal to its string form (``device('cuda:0') == 'cuda:0'``).
    ``device('cuda')`` without an index means the current CUDA device.

    Parameters
    ----------
    type : str or device
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``, or a device to copy.
    index : int, optional
        The CUDA device index, when ``type`` has none.
    """

    __slots__ = {
        "type": 'The kind of device: ``"cpu"`` or ``"cuda"``.',
        "index": "The CUDA device index, or None (the CPU, or the current CUDA device).",
    }
    type: Literal["cpu", "cuda"]
    index: int | None

    def __init__(self, type: str | device, index: int | None = None) -> None:
        if isinstance(type, device):
            if index is not None:
                raise ValueError("index given twice")
            self.type, self.index = type.type, type.index
            return
        if not isinstance(type, str):
            raise TypeError(f"device must be a str, int or device, got {builtins_type(type).__name__}")
        s = type.strip()
        if ":" in s:
            if index is not None:
                raise ValueError(f"device string {s!r} already has an index")
            s, _, idx = s.partition(":")
            try:
                index = int(idx)
            except ValueError:
                raise ValueError(f"bad device index in {type!r}") from None
        if s not in ("cpu", "cuda"):
            raise ValueError(f"unknown device type {s!r}; expected 'cpu' or 'cuda'")
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(f"device index must be an int, got {index!r}")
            if index < 0:
                raise ValueError(f"device index must be non-negative, got {index}")
            if s == "cpu" and index != 0:
                raise ValueError("the CPU device has no index other than 0")
            if s == "cpu":
                index = None
        self.type = "cpu" if s == "cpu" else "cuda"
        self.index = index

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device(type={self.type!r}" + (f", index={self.index})" if self.index is not None else ")")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = device(other)
            except (TypeError, ValueError):
                return False
        if not isinstance(other, device):
            return NotImplemented
        return self.type == other.type and self.index == other.index

    def __hash__(self) -> int:
        return hash((self.type, self.index))


import builtins as _builtins
builtins_type = _builtins.type


def as_device(spec: Any) -> device:
    """Normalise ``spec`` to a device; ints mean CUDA device indices."""
    if isinstance(spec, device):
        return spec
    if spec is None:
        return device("cpu")
    if isinstance(spec, bool):
        raise TypeError(f"expected a device, got {spec!r}")
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"device index must be non-negative, got {spec}")
        return device("cuda", spec)
    if isinstance(spec, str):
        return device(spec)
    typ, idx = getattr(spec, "type", None), getattr(spec, "index", None)
    if isinstance(typ, str):   # torch.device and the like
        return device(typ, idx)
    raise TypeError(f"expected a device ('cpu', 'cuda', 'cuda:N', int), got {builtins_type(spec).__name__}")


#: What a device parameter accepts: published as ``tensorplay.types.DeviceLike``,
#: defined here, on the lowest floor, for the driver and memory floors' annotations.
DeviceLike: TypeAlias = device | str | int | None
