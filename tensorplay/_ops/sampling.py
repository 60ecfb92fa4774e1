# SPDX-License-Identifier: Apache-2.0
"""Random permutations and categorical sampling: ``randperm`` and
``multinomial``, on the CPU (NumPy) and CUDA (generated NVRTC kernels),
capturable, with the same values on both for the same generator state.

Every call draws its random numbers with one call of the random core
(``rand`` or ``randint``: one generator offset step) and turns them into
the result deterministically: randperm sorts random 62-bit keys
(``sort_kernels``), multinomial computes the exponential-race keys or the
inverse CDF (``sampling_kernels``, whose NumPy twins the CPU path runs).
"""

from __future__ import annotations

import numbers
import struct

import numpy as np

from tensorplay import _dtypes as dt
from tensorplay._driver.memcpy import host_reads_blocked, memcpy_dtoh
from tensorplay._driver.stream import current_stream_handle_of
from tensorplay._tensor.args import resolve_device
from tensorplay._tensor.creation import empty, from_numpy, zeros
from tensorplay._tensor.tensor import Tensor, empty_cuda
from tensorplay._kernels import cache as _kernels
from tensorplay._kernels import sampling_kernels as _sk
from tensorplay._kernels import sort_kernels as _sort
from tensorplay._ops.reduce import argmin

from tensorplay._ops.distributions import rand, randint

# randperm's keys: uniform in [0, 2**62) (two permutations of one call tie
# with probability about n**2 / 2**63; ties go to the lower position).
RANDPERM_KEY_BOUND = 2 ** 62

# Significand bits of the floating dtypes: the integers up to 2**digits are exact.
_DIGITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


# ------------------------------------------------------------------ the CUDA sort

def sort_rows(keys, rows: int, n: int):
    """Sort each row of the contiguous CUDA int64 ``keys`` (rows x n, compared
    as unsigned 64-bit words) with its positions, ties to the lower position;
    return the positions in sorted order, (rows, padded) int64, padding last.

    A fixed sequence of launches for given ``rows`` and ``n``
    (``sort_kernels.sort_steps``): capturable."""
    dev = keys._device_index
    padded = _sort.padded_length(n)
    total = rows * padded
    key = empty_cuda((total,), dt.int64, dev)
    idx = empty_cuda((total,), dt.int64, dev)
    kp, ip = key.data_ptr(), idx.data_ptr()
    for step in _sort.sort_steps(padded):
        f = _sort.sort_function(step[0], dev)
        if step[0] == "block":
            f.launch(-(-total // _sort.TILE), _sort.TILE_THREADS,
                     struct.pack("<QQQqqqq", keys.data_ptr(), kp, ip, n, padded, total, step[1]), 0, None)
        elif step[0] == "global":
            pairs = total // 2
            f.launch(_kernels.grid_for(pairs, dev), _kernels.BLOCK,
                     struct.pack("<QQqqqq", kp, ip, pairs, padded, step[1], step[2]), 0, None)
        else:
            f.launch(total // _sort.TILE, _sort.TILE_THREADS, struct.pack("<QQqq", kp, ip, padded, step[1]), 0, None)
    return idx.view(rows, padded)


# ------------------------------------------------------------------ randperm

def permutation_from_keys(keys):
    """The positions of the 1-D int64 ``keys`` (non-negative) in increasing
    order of key, ties to the lower position: ``np.argsort(kind="stable")``
    on the CPU, :func:`sort_rows` on CUDA."""
    if keys.is_cpu:
        return from_numpy(np.argsort(keys.numpy(), kind="stable"))
    n = keys.shape[0]
    return sort_rows(keys.contiguous(), 1, n)[0, :n]


def _check_out(op, out, shape, dtype, device_index):
    if not isinstance(out, Tensor):
        raise TypeError(f"{op}: out must be a Tensor, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"{op}: out has shape {out.shape}, the result has shape {shape}")
    if out.dtype is not dtype:
        raise TypeError(f"{op}: out has dtype {out.dtype.name}, the result is {dtype.name}")
    if out._device_index != device_index:
        raise ValueError(f"{op}: out is on {out.device}, the result on "
                         f"{'cpu' if device_index < 0 else f'cuda:{device_index}'}")


def randperm(n, *, generator=None, out=None, dtype=None, device=None):
    """Return a random permutation of the integers ``0`` to ``n - 1``.

    The permutation sorts ``n`` random keys, ``randint(0, 2**62, (n,))``
    drawn from ``generator`` (one offset step), ties broken by position:
    the CPU and CUDA give the same permutation for the same generator
    state. ``n = 0`` draws nothing.

    Parameters
    ----------
    n : int
        The number of integers, at least 0.
    generator : Generator, optional
        The generator to draw from; by default the device's default generator.
    out : Tensor, optional
        Write the permutation here: shape ``(n,)``, its dtype and device
        are the result's unless given.
    dtype : dtype, str or None, optional
        The result dtype (default int64; ``out``'s when ``out`` is given):
        an integer or floating dtype holding ``n - 1`` exactly, not bool.
    device : device, str, int or None, optional
        Where the result lives (default the CPU; ``out``'s when ``out`` is given).

    Returns
    -------
    Tensor
        The permutation, shape ``(n,)``.

    Raises
    ------
    TypeError
        If ``n`` is not an int, or ``dtype`` is bool.
    ValueError
        If ``n`` is negative or ``n - 1`` does not fit ``dtype`` exactly.

    Notes
    -----
    On CUDA the keys are sorted by a bitonic sort (generated NVRTC
    kernels, about ``log2(n)**2 / 2`` steps, most in shared memory) on the
    current stream; the sequence of launches depends on ``n`` only, so a
    CUDA graph can capture it and each replay draws a new permutation.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"randperm: n must be an int, got {type(n).__name__}")
    n = int(n)
    if n < 0:
        raise ValueError(f"randperm: n must be non-negative, got {n}")
    if dtype is not None:
        d = dt.as_dtype(dtype)
    else:
        d = out.dtype if isinstance(out, Tensor) else dt.int64
    if d is dt.bool_:
        raise TypeError("randperm: the result dtype cannot be bool")
    top = n - 1
    if d.kind == "f":
        if top > 2 ** _DIGITS[d.name]:
            raise ValueError(f"randperm: n = {n} is too large for {d.name}, which holds the integers "
                             f"exactly up to 2**{_DIGITS[d.name]}")
    elif top > np.iinfo(d.numpy_dtype).max:
        raise ValueError(f"randperm: n = {n} is too large for {d.name} (largest value "
                         f"{np.iinfo(d.numpy_dtype).max})")
    if device is None and isinstance(out, Tensor):
        dev = out._device_index
    else:
        dev = resolve_device(device)
    if out is not None:
        _check_out("randperm", out, (n,), d, dev)
    where = "cpu" if dev < 0 else f"cuda:{dev}"
    if n == 0:
        result = empty((0,), dtype=d, device=where)
    else:
        keys = randint(0, RANDPERM_KEY_BOUND, (n,), generator=generator, dtype=dt.int64, device=where)
        order = permutation_from_keys(keys)
        result = order if d is dt.int64 else order.to(d)
    if out is None:
        return result
    out.copy_(result)
    return out


# ------------------------------------------------------------------ multinomial

def status_message(status: int) -> str:
    """The error message of the first problem a status word reports."""
    for bit, message in _sk.STATUS_MESSAGES.items():
        if status & bit:
            return f"multinomial: {message}"
    raise ValueError(f"no problem in status {status}")


def _raise_for_status(status, dev):
    """Read the kernels' status word and raise for a problem; skipped while a
    capture is open (a host read would end it)."""
    stream = current_stream_handle_of(dev)
    if host_reads_blocked(dev, stream):
        return
    host = np.zeros(1, dtype=np.int32)
    memcpy_dtoh(host.ctypes.data, status.data_ptr(), 4, dev, stream)
    if host[0]:
        raise ValueError(status_message(int(host[0])))


def multinomial(input, num_samples, replacement=False, *, generator=None, out=None):
    """Draw ``num_samples`` categories from the distribution each row of ``input`` gives.

    ``input`` holds non-negative weights (probabilities up to a factor,
    summing to anything positive): one distribution (1-D) or one per row
    (2-D). With ``replacement=False`` a row's samples are distinct.

    Without replacement, each category ``i`` gets the key ``E_i / w_i``
    with ``E_i = -log(1 - u_i)`` exponential from a uniform ``u_i`` (one
    ``rand`` of the row's shape, float64), and the sample is the categories
    of the ``num_samples`` smallest keys, smallest first (the exponential
    race, the Gumbel-top-k trick). With replacement, each sample is the
    first category whose cumulative weight (float64, in a fixed chunked
    order) exceeds ``u`` times the row's total, for one uniform ``u`` per
    sample. The CPU and CUDA compute these with the same float64
    operations, so they give the same samples for the same generator state.
    Each call takes one generator offset step.

    Parameters
    ----------
    input : Tensor
        The weights, floating, 1-D or 2-D (rows of categories).
    num_samples : int
        The number of samples per row, at least 1; without replacement at
        most the number of categories of positive weight.
    replacement : bool, optional
        Draw with replacement (default False).
    generator : Generator, optional
        The generator to draw from; by default the device's default generator.
    out : Tensor, optional
        Write the samples here (int64, the result's shape, ``input``'s device).

    Returns
    -------
    Tensor
        The category indices, int64: shape ``(num_samples,)`` for 1-D
        ``input``, ``(rows, num_samples)`` for 2-D.

    Raises
    ------
    TypeError
        If ``input`` is not a floating tensor or ``num_samples`` is not an int.
    ValueError
        If ``input`` is not 1-D or 2-D or has no categories, if
        ``num_samples`` is below 1 or, without replacement, above the
        number of categories; and for a weight that is negative, infinite
        or NaN, a row without a positive weight (or whose sum overflows),
        or, without replacement, a row with fewer positive weights than
        ``num_samples``.

    Notes
    -----
    On CUDA: a key kernel and a bitonic sort of each row (for one sample,
    an argmin), or one inverse-CDF kernel, on the current stream. The checks
    of the weights' values run on the device; outside a capture the call then
    waits for them (a 4-byte read, as PyTorch's ``multinomial`` reads its
    checks). Inside a CUDA graph capture they are not read: invalid weights
    count as zero and the samples are meaningless but in range.
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"multinomial: input must be a Tensor, got {type(input).__name__}")
    if input.dtype.kind != "f":
        raise TypeError(f"multinomial: the probability tensor must be floating, got {input.dtype.name}")
    if input.ndim not in (1, 2):
        raise ValueError(f"multinomial: the probability tensor must be 1-D or 2-D, got {input.ndim}-D")
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral):
        raise TypeError(f"multinomial: num_samples must be an int, got {type(num_samples).__name__}")
    if not isinstance(replacement, (bool, np.bool_)):
        raise TypeError(f"multinomial: replacement must be a bool, got {type(replacement).__name__}")
    k = int(num_samples)
    if k < 1:
        raise ValueError(f"multinomial: num_samples must be at least 1, got {k}")
    n = input.shape[-1]
    rows = 1 if input.ndim == 1 else input.shape[0]
    if n == 0:
        raise ValueError("multinomial: the probability tensor has no categories")
    if not replacement and k > n:
        raise ValueError(f"multinomial: cannot draw {k} samples without replacement from {n} categories")
    shape = (k,) if input.ndim == 1 else (rows, k)
    dev = input._device_index
    if out is not None:
        _check_out("multinomial", out, shape, dt.int64, dev)
    if rows == 0:
        result = empty(shape, dtype=dt.int64, device=input.device)
    elif dev < 0:
        result = _multinomial_cpu(input, rows, n, k, bool(replacement), generator).reshape(shape)
    else:
        result = _multinomial_cuda(input, rows, n, k, bool(replacement), generator).reshape(shape)
    if out is None:
        return result
    out.copy_(result)
    return out


def _check_values(weights, k, replacement):
    """Raise for what the weights' values get wrong (host weights, rows x n float64)."""
    status = _sk.row_status(weights, k, replacement)
    if status:
        raise ValueError(status_message(status))


def _multinomial_cpu(input, rows, n, k, replacement, generator):
    w = input.numpy().astype(np.float64).reshape(rows, n)
    _check_values(w, k, replacement)            # before drawing: a failed call takes no offset step
    u = rand(rows, k if replacement else n, generator=generator, dtype=dt.float64, device="cpu")
    return sample_from_uniforms(from_numpy(w), u, k, replacement, check=False)


def _multinomial_cuda(input, rows, n, k, replacement, generator):
    u = rand(rows, k if replacement else n, generator=generator, dtype=dt.float64, device=input.device)
    return sample_from_uniforms(input.reshape(rows, n), u, k, replacement)


def sample_from_uniforms(weights, uniforms, num_samples, replacement, *, check=True):
    """The samples (rows x k, int64) multinomial draws from ``weights``
    (rows x n, floating) with the float64 ``uniforms`` in [0, 1) it drew:
    rows x n of them without replacement, rows x k with. CPU or CUDA (both
    tensors on one device); the same values on both.

    With ``check``, raise ValueError for invalid weights: on the CPU first,
    on CUDA after the kernels (skipped while a capture is open)."""
    rows, n = weights.shape
    k = num_samples
    if uniforms.dtype is not dt.float64 or uniforms.shape != (rows, k if replacement else n):
        raise ValueError(f"sample_from_uniforms: the uniforms must be float64 of shape "
                         f"{(rows, k if replacement else n)}, got {uniforms.dtype.name} {uniforms.shape}")
    if weights.is_cpu:
        w = weights.numpy().astype(np.float64)
        u = uniforms.numpy()
        if check:
            _check_values(w, k, replacement)
        if replacement:
            return from_numpy(_sk.inverse_cdf(w, u))
        order = np.argsort(_sk.race_keys(w, u), axis=1, kind="stable")
        return from_numpy(np.ascontiguousarray(order[:, :k]))
    dev = weights._device_index
    w = weights.contiguous()
    u = uniforms.contiguous()
    status = zeros(1, dtype=dt.int32, device=weights.device)
    if replacement:
        picks = inverse_cdf_cuda(w, u, k, status)
    else:
        keys = race_keys_cuda(w, u, k, status)
        if k == 1:
            # the first smallest key, what the sort would put first (keys are non-negative int64)
            picks = argmin(keys, dim=1, keepdim=True)
        else:
            picks = sort_rows(keys, rows, n)[:, :k].contiguous()
    if check:
        _raise_for_status(status, dev)
    return picks


def race_keys_cuda(weights, uniforms, num_samples, status):
    """The exponential-race keys (rows x n, int64) of contiguous CUDA
    ``weights`` and float64 ``uniforms`` (both rows x n); the kernel ORs
    the rows' problems into the int32 ``status``."""
    rows, n = weights.shape
    dev = weights._device_index
    keys = empty_cuda((rows, n), dt.int64, dev)
    f = _sk.race_keys_function(weights.dtype, dev)
    f.launch(rows, 256, struct.pack("<QQQQqq", weights.data_ptr(), uniforms.data_ptr(), keys.data_ptr(),
                                    status.data_ptr(), n, num_samples), 0, None)
    return keys


def inverse_cdf_cuda(weights, uniforms, num_samples, status):
    """The samples with replacement (rows x k, int64) of contiguous CUDA
    ``weights`` (rows x n) for float64 ``uniforms`` (rows x k); the kernel
    ORs the rows' problems into the int32 ``status``."""
    rows, n = weights.shape
    dev = weights._device_index
    picks = empty_cuda((rows, num_samples), dt.int64, dev)
    f = _sk.inverse_cdf_function(weights.dtype, dev)
    f.launch(rows, _sk.CDF_CHUNKS,
             struct.pack("<QQQQqqq", weights.data_ptr(), uniforms.data_ptr(), picks.data_ptr(),
                         status.data_ptr(), n, num_samples, _sk.cdf_chunk_length(n)), 0, None)
    return picks
