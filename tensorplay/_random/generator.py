# SPDX-License-Identifier: Apache-2.0
"""Random number generators: ``tensorplay.Generator``, the default generators
and the seeding functions.

A generator is a Philox4x32-10 stream: a 64-bit seed and a 64-bit offset
(``tensorplay._kernels.philox`` defines the layout). A CPU generator keeps
both on the host. A CUDA generator keeps them in 32 bytes of device memory
from the device's ordinary pool (never a graph's): the random kernels read
seed and offset there and advance the offset themselves, so graph replays
and WHILE-body iterations draw fresh numbers with no host work, and eager
calls and replays continue one sequence. Seeding a CUDA generator launches
a one-thread kernel carrying the values (it can be captured); reading its
state copies the 16 bytes to the host (it cannot).
"""

from __future__ import annotations

import numbers
import os
import struct
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, overload

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._memory.allocator import allocate, note_capture_use
from tensorplay._driver.context import device_count, is_available, is_device_supported
from tensorplay._device import device as _device_cls
from tensorplay._kernels import random_kernels as _rk
from tensorplay._driver.memcpy import host_reads_blocked, memcpy_dtoh
from tensorplay._driver.stream import current_stream, current_stream_handle_of
from tensorplay._tensor.args import resolve_device
from tensorplay._tensor.tensor import Tensor, new_cpu
from tensorplay._kernels.philox import DEFAULT_SEED

if TYPE_CHECKING:
    from tensorplay._memory.allocator import DeviceAllocation
    from tensorplay._device import DeviceLike

__all__ = ["Generator", "DefaultGenerators", "default_generator", "default_generators", "manual_seed", "seed",
           "initial_seed", "get_rng_state", "set_rng_state", "generator_for", "default_cuda_generator",
           "seed_cuda_device", "cuda_devices", "cuda_initial_seed", "seed_value", "cpu_seed_and_offset",
           "cuda_state_ptr"]

_U64 = (1 << 64) - 1
STATE_NBYTES = 16          # what get_state() returns: seed, offset (little-endian uint64)


def seed_value(seed: int) -> int:
    """A seed as PyTorch takes it: an int in [-2**63, 2**64), negative ones wrapping to uint64."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    s = int(seed)
    if not -(1 << 63) <= s <= _U64:
        raise ValueError(f"seed must be in [-2**63, 2**64), got {s}")
    return s & _U64


def _nondeterministic_seed() -> int:
    return int.from_bytes(os.urandom(8), "little")


class Generator:
    """A Philox4x32-10 random number generator on the CPU or on one CUDA device.

    Pass it as ``generator=`` to the random functions. A new generator is
    seeded with 67280421310721 (PyTorch's default seed) and offset 0; every
    random op draws from the current offset and advances it by one.

    Parameters
    ----------
    device : device, str or int, optional
        ``"cpu"`` (the default), ``"cuda"`` (the current device) or
        ``"cuda:N"``. A CUDA generator keeps its state on that device (32
        bytes from the caching allocator's ordinary pool), written on the
        current stream, which is then waited for; it must be made outside a
        CUDA graph capture.

    Raises
    ------
    RuntimeError
        A CUDA generator made while a CUDA graph capture is open.
    CudaUnavailableError
        A CUDA generator without a usable GPU.
    """

    __slots__ = ("_device_index", "_seed", "_offset", "_state", "_default", "__weakref__")

    _device_index: int
    _seed: int
    _offset: int
    _state: DeviceAllocation | None
    _default: bool

    def __init__(self, device: DeviceLike = "cpu") -> None:
        self._init(resolve_device(device), DEFAULT_SEED, default=False)

    def _init(self, dev: int, seed: int, default: bool) -> None:
        self._device_index = dev
        self._seed = seed
        self._offset = 0
        self._default = default
        self._state = None if dev < 0 else _new_device_state(dev, seed, default)

    @classmethod
    def _make(cls, dev: int, seed: int, default: bool) -> Generator:
        g = cls.__new__(cls)
        g._init(dev, seed, default)
        return g

    # -------------------------------------------------------------- properties

    @property
    def device(self) -> _device_cls:
        """Where the state lives, a :class:`tensorplay.device` (``cpu`` or ``cuda:N``)."""
        i = self._device_index
        return _device_cls("cpu") if i < 0 else _device_cls("cuda", i)

    def __repr__(self) -> str:
        return f"<tensorplay.Generator device={self.device}>"

    # -------------------------------------------------------------- seeding

    def manual_seed(self, seed: int) -> Generator:
        """Seed the generator with ``seed`` and rewind its offset to 0; return ``self``.

        On CUDA a one-thread kernel on the current stream writes the state,
        so inside a CUDA graph capture the reseeding is captured too (each
        replay then starts from ``seed`` again).

        Parameters
        ----------
        seed : int
            In [-2**63, 2**64); negative seeds wrap around, as in PyTorch.

        Returns
        -------
        Generator
            ``self``.
        """
        self._write(seed_value(seed), 0)
        return self

    def seed(self) -> int:
        """Seed the generator from the operating system's entropy (os.urandom) and return the seed.

        Returns
        -------
        int
            The new seed, in [0, 2**64).
        """
        s = _nondeterministic_seed()
        self._write(s, 0)
        return s

    def initial_seed(self) -> int:
        """Return the seed the generator was last seeded with (or set by :meth:`set_state`).

        Returns
        -------
        int
            In [0, 2**64).
        """
        return self._seed

    # -------------------------------------------------------------- state

    def get_state(self) -> Tensor:
        """Return the state: a CPU uint8 tensor of 16 bytes, the seed and the offset (little-endian uint64).

        For a CUDA generator the state is copied from the device after the
        work queued on the current stream (cuMemcpyDtoHAsync, then a
        synchronize), so random work queued on other streams must be
        waited for first.

        Returns
        -------
        Tensor
            16 bytes, for :meth:`set_state`.

        Raises
        ------
        RuntimeError
            On a CUDA generator while a CUDA graph capture is open (the
            state on the device is what replays will read; it cannot be
            read back inside the capture).
        """
        if self._device_index < 0:
            raw = struct.pack("<QQ", self._seed, self._offset)
            return new_cpu(np.frombuffer(raw, dtype=np.uint8).copy(), dt.uint8)
        dev = self._device_index
        stream = current_stream_handle_of(dev)
        if host_reads_blocked(dev, stream):
            raise RuntimeError(f"Generator.get_state(): the state of a cuda:{dev} generator lives on the "
                               "device and cannot be read while a CUDA graph capture is open; read it "
                               "before or after the capture")
        out = np.empty(STATE_NBYTES, dtype=np.uint8)
        memcpy_dtoh(out.ctypes.data, self._device_state().ptr, STATE_NBYTES, dev, stream)
        return new_cpu(out, dt.uint8)

    def set_state(self, new_state: Tensor) -> Generator:
        """Set the state from a tensor :meth:`get_state` returned (of any generator); return ``self``.

        On CUDA a one-thread kernel on the current stream writes it (so this
        can be captured).

        Parameters
        ----------
        new_state : Tensor
            A CPU uint8 tensor of 16 bytes: seed, offset (little-endian uint64).

        Returns
        -------
        Generator
            ``self``.
        """
        if not isinstance(new_state, Tensor):
            raise TypeError(f"set_state expects a tensor from get_state(), got {type(new_state).__name__}")
        if new_state.dtype is not dt.uint8 or not new_state.is_cpu:
            raise TypeError(f"set_state expects a CPU uint8 tensor from get_state(), got a {new_state.dtype.name} "
                            f"tensor on {new_state.device}")
        if new_state.numel() != STATE_NBYTES:
            raise ValueError(f"set_state expects {STATE_NBYTES} bytes (seed, offset), got {new_state.numel()}")
        seed, offset = struct.unpack("<QQ", np.ascontiguousarray(new_state.numpy()).reshape(-1).tobytes())
        self._write(seed, offset)
        return self

    def _write(self, seed: int, offset: int) -> None:
        self._seed = seed
        if self._device_index < 0:
            self._offset = offset
            return
        dev = self._device_index
        _rk.launch_set_state(dev, cuda_state_ptr(self), seed, offset, current_stream_handle_of(dev))

    def _device_state(self) -> DeviceAllocation:
        """A CUDA generator's device memory (seed, offset, done-counter)."""
        state = self._state
        if state is None:
            raise RuntimeError(f"{self!r} has no device state")     # only CPU generators
        return state


# ------------------------------------------------------------------ for the random ops

def cpu_seed_and_offset(gen: Generator) -> tuple[int, int]:
    """(seed, offset) of CPU generator ``gen`` for one op, advancing its offset."""
    off = gen._offset
    gen._offset = (off + 1) & _U64
    return gen._seed, off


def cuda_state_ptr(gen: Generator) -> int:
    """The device address of CUDA generator ``gen``'s state, for one kernel on
    the current stream: a capture keeps the state alive; a user generator's
    state, used on another stream, is not reused before that stream's work."""
    state = gen._device_state()
    note_capture_use(state)
    if not gen._default:
        stream = current_stream_handle_of(gen._device_index)
        if not host_reads_blocked(gen._device_index, stream):
            state.record_stream(stream)
    return state.ptr


def _new_device_state(dev: int, seed: int, default: bool) -> DeviceAllocation:
    """32 bytes of ``dev``'s ordinary pool holding (seed, offset 0), written on
    the current stream, which is then waited for (never inside a capture)."""
    stream = current_stream_handle_of(dev)
    if host_reads_blocked(dev, stream):
        if default:
            raise RuntimeError(
                f"the default CUDA generator of cuda:{dev} is first used inside a CUDA graph capture; its "
                "state must be allocated outside captures: run the random work once before capturing "
                f"(or touch tensorplay.cuda.default_generators[{dev}] first)")
        raise RuntimeError("tensorplay.Generator: make CUDA generators outside CUDA graph captures (their "
                           "state is allocated from the device's ordinary pool, not the graph's)")
    state = allocate(_rk.STATE_BYTES, dev, stream)
    _rk.launch_set_state(dev, state.ptr, seed, 0, stream)
    # the first use may come on any stream: the state must be written by then
    current_stream(dev).synchronize()
    return state


# ------------------------------------------------------------------ default generators

default_generator = Generator._make(-1, DEFAULT_SEED, default=True)

_default_lock = threading.Lock()
_cuda_defaults: dict[int, Generator] = {}
_pending_seeds: dict[int, int] = {}     # seeds given before a device's generator was made


def default_cuda_generator(dev: int) -> Generator:
    """The default generator of CUDA device ``dev`` (an index), made on first
    use with the seed last given to the seeding functions (lazily, as
    PyTorch: seeding does not touch a device before it draws)."""
    g = _cuda_defaults.get(dev)
    if g is None:
        with _default_lock:
            g = _cuda_defaults.get(dev)
            if g is None:
                g = Generator._make(dev, _pending_seeds.pop(dev, DEFAULT_SEED), default=True)
                _cuda_defaults[dev] = g
    return g


class DefaultGenerators(Sequence[Generator]):
    """``tensorplay.cuda.default_generators``: the default generator of each
    CUDA device, by index (made on first access; empty without CUDA)."""

    def __len__(self) -> int:
        return device_count()

    @overload
    def __getitem__(self, index: int) -> Generator: ...
    @overload
    def __getitem__(self, index: slice) -> list[Generator]: ...

    def __getitem__(self, index: int | slice) -> Generator | list[Generator]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(f"default_generators indices are ints, got {type(index).__name__}")
        n = len(self)
        i = int(index)
        if not -n <= i < n:
            raise IndexError(f"default_generators index {i} out of range for {n} CUDA device(s)")
        return default_cuda_generator(i % n)

    def __repr__(self) -> str:
        return f"<tensorplay.cuda.default_generators: {len(self)} device(s)>"


default_generators = DefaultGenerators()


def generator_for(generator: Generator | None, dev: int, what: str) -> Generator:
    """The generator an op on device ``dev`` (-1: CPU) draws from: ``generator``
    checked against the device, or the device's default."""
    if generator is None:
        return default_generator if dev < 0 else default_cuda_generator(dev)
    if not isinstance(generator, Generator):
        raise TypeError(f"{what}: generator must be a tensorplay.Generator, got {type(generator).__name__}")
    if generator._device_index != dev:
        where = "cpu" if dev < 0 else f"cuda:{dev}"
        raise ValueError(f"{what}: the generator is on {generator.device}, the tensor on {where}")
    return generator


def cuda_initial_seed(dev: int) -> int:
    """The seed of device ``dev``'s default generator (without making it)."""
    with _default_lock:
        g = _cuda_defaults.get(dev)
        if g is None:
            return _pending_seeds.get(dev, DEFAULT_SEED)
    return g.initial_seed()


def seed_cuda_device(dev: int, s: int) -> None:
    """Seed device ``dev``'s default generator now, or when it is made."""
    with _default_lock:
        g = _cuda_defaults.get(dev)
        if g is None:
            _pending_seeds[dev] = s
            return
    g._write(s, 0)


def cuda_devices() -> list[int]:
    """The CUDA devices tensorplay can use (none without CUDA)."""
    if not is_available():
        return []
    return [i for i in range(device_count()) if is_device_supported(i)]


# ------------------------------------------------------------------ seeding functions

def manual_seed(seed: int) -> Generator:
    """Seed the CPU default generator and the default generator of every CUDA device with ``seed``.

    CUDA devices whose generator is not made yet take the seed when it is
    (so seeding does not initialise CUDA).

    Parameters
    ----------
    seed : int
        In [-2**63, 2**64); negative seeds wrap around, as in PyTorch.

    Returns
    -------
    Generator
        :data:`tensorplay.default_generator`.
    """
    s = seed_value(seed)
    default_generator._write(s, 0)
    for dev in cuda_devices():
        seed_cuda_device(dev, s)
    return default_generator


def seed() -> int:
    """Seed every default generator (CPU and CUDA) with one nondeterministic seed and return it.

    Returns
    -------
    int
        The seed, from os.urandom, in [0, 2**64).
    """
    s = default_generator.seed()
    for dev in cuda_devices():
        seed_cuda_device(dev, s)
    return s


def initial_seed() -> int:
    """Return the seed of the CPU default generator.

    Returns
    -------
    int
        In [0, 2**64).
    """
    return default_generator.initial_seed()


def get_rng_state() -> Tensor:
    """Return the CPU default generator's state (a 16-byte uint8 tensor; see :meth:`Generator.get_state`).

    Returns
    -------
    Tensor
        The state.
    """
    return default_generator.get_state()


def set_rng_state(new_state: Tensor) -> None:
    """Set the CPU default generator's state from :func:`get_rng_state`'s tensor.

    Parameters
    ----------
    new_state : Tensor
        A CPU uint8 tensor of 16 bytes.
    """
    default_generator.set_state(new_state)
