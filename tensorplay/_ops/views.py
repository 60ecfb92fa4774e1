# SPDX-License-Identifier: Apache-2.0
"""Views: basic indexing, view/reshape, permute, expand, (un)squeeze, flatten.

A CUDA view shares its base's storage object, which keeps the memory alive;
a CPU view is a NumPy view, which keeps its base alive.
"""

from __future__ import annotations

import numbers

from numpy.lib.stride_tricks import as_strided

from tensorplay import _dtypes as dt
from tensorplay._tensor.args import contiguous_strides, normalize_dim
from tensorplay._tensor.creation import empty
from tensorplay._tensor.tensor import new_cpu, new_cuda, view_of


def _make_view(t, shape, strides, offset=0):
    shape, strides = tuple(shape), tuple(strides)
    if t.is_cuda:
        return view_of(t, shape, strides, offset)
    arr = t._array
    isz = t.itemsize
    if offset:
        raise AssertionError("CPU views with offsets go through NumPy indexing")
    return new_cpu(as_strided(arr, shape=shape, strides=tuple(s * isz for s in strides)), t.dtype)


def getitem(t, index):
    """Basic indexing: ints, slices (any step), None, Ellipsis."""
    if not isinstance(index, tuple):
        index = (index,)
    for ix in index:
        if not (ix is None or ix is Ellipsis or isinstance(ix, slice) or
                (isinstance(ix, numbers.Integral) and not isinstance(ix, bool))):
            if hasattr(ix, "__index__") and not hasattr(ix, "shape"):
                continue
            raise TypeError(
                f"unsupported index {type(ix).__name__}: tensors index with ints, slices, None, "
                "Ellipsis, and integer or bool tensors, lists and arrays")
    n_ell = sum(1 for ix in index if ix is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 for ix in index if ix is not None and ix is not Ellipsis)
    if n_real > t.ndim:
        raise IndexError(f"too many indices for a {t.ndim}-d tensor: {n_real} given")
    if n_ell:
        pos = next(i for i, ix in enumerate(index) if ix is Ellipsis)
        index = index[:pos] + (slice(None),) * (t.ndim - n_real) + index[pos + 1:]
    else:
        index = index + (slice(None),) * (t.ndim - n_real)
    shape, strides = t.shape, t.strides
    new_shape, new_strides, offset, d = [], [], 0, 0
    for ix in index:
        if ix is None:
            new_shape.append(1)
            new_strides.append(0)
            continue
        size = shape[d]
        if isinstance(ix, slice):
            start, stop, step = ix.indices(size)
            if step == 0:
                raise ValueError("slice step cannot be zero")
            length = len(range(start, stop, step))
            if length:
                offset += start * strides[d]
            new_shape.append(length)
            new_strides.append(strides[d] * step)
        else:
            i = int(ix.__index__())
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
            offset += (i % size) * strides[d]
        d += 1
    if t.is_cuda:
        return view_of(t, tuple(new_shape), tuple(new_strides), offset)
    np_index = tuple(int(ix.__index__()) if not (ix is None or isinstance(ix, slice)) else ix
                     for ix in index)
    return new_cpu(t._array[np_index + (Ellipsis,)], t.dtype)


def _view_strides(oldshape, oldstride, newshape):
    """Strides viewing (oldshape, oldstride) memory as newshape, or None when
    it needs a copy (PyTorch's rule)."""
    numel = 1
    for s in oldshape:
        numel *= s
    if numel == 0 or not oldshape:
        return contiguous_strides(newshape)
    newstride = [0] * len(newshape)
    view_d = len(newshape) - 1
    chunk_base = oldstride[-1]
    tensor_numel = view_numel = 1
    for td in range(len(oldshape) - 1, -1, -1):
        tensor_numel *= oldshape[td]
        if td == 0 or (oldshape[td - 1] != 1 and oldstride[td - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or newshape[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base
                view_numel *= newshape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if td > 0:
                chunk_base = oldstride[td - 1]
                tensor_numel = view_numel = 1
    if view_d != -1:
        return None
    return tuple(newstride)


def view(t, shape):
    strides = _view_strides(t.shape, t.strides, shape)
    if strides is None:
        raise ValueError(f"view of shape {shape} is not compatible with the tensor's strides "
                         f"{t.strides}; use reshape() (which copies) or contiguous() first")
    return _make_view(t, shape, strides)


def view_dtype(t, d):
    """``t``'s memory seen as dtype ``d``, as ``torch.Tensor.view(dtype)``:
    the same shape and strides for a dtype of the same size; otherwise the
    last dimension must have stride 1 and scales by the ratio of the sizes
    (the other strides too), and for a larger dtype the last dimension's
    size, the other strides and the storage offset must divide by it."""
    if d.itemsize == t.itemsize:
        shape, strides = t.shape, t.strides
    else:
        what = f"view({d.name}) of a {t.dtype.name} tensor ({t.itemsize}-byte elements as {d.itemsize}-byte ones)"
        if t.ndim == 0:
            raise ValueError(f"{what}: a 0-d tensor cannot change its element size; view it as 1-d first")
        if t.strides[-1] != 1 and t.numel():          # an empty tensor has no layout to keep
            raise ValueError(f"{what}: the last dimension must have stride 1, it has {t.strides[-1]}; "
                             f"call contiguous() first")
        shape, strides = list(t.shape), list(t.strides)
        if d.itemsize < t.itemsize:
            ratio = t.itemsize // d.itemsize
            shape[-1] *= ratio
            strides = [s * ratio for s in strides[:-1]] + [1]
        else:
            ratio = d.itemsize // t.itemsize
            if shape[-1] % ratio:
                raise ValueError(f"{what}: the last dimension's size {shape[-1]} must be a multiple of {ratio}")
            if t.numel() and any(s % ratio for s in strides[:-1]):
                raise ValueError(f"{what}: the strides {t.strides} must be multiples of {ratio} "
                                 f"(but the last)")
            if t.data_ptr() % d.itemsize:
                raise ValueError(f"{what}: the first element must be {d.itemsize}-byte aligned "
                                 f"(the storage offset a multiple of {ratio})")
            shape[-1] //= ratio
            strides = [s // ratio for s in strides[:-1]] + [1]
        if not t.numel():
            strides = contiguous_strides(shape)
    if t.is_cuda:
        return new_cuda(t._storage, t.data_ptr(), tuple(shape), tuple(strides), d, t._device_index)
    return new_cpu(t._array.view(d.numpy_dtype), d)


def reshape(t, shape):
    """A view when the layout allows it, else a contiguous copy."""
    strides = _view_strides(t.shape, t.strides, shape)
    if strides is None:
        return view(t.clone(), shape)
    return _make_view(t, shape, strides)


def flatten(t, start_dim=0, end_dim=-1):
    if t.ndim == 0:
        return reshape(t, (1,))
    s, e = normalize_dim(start_dim, t.ndim), normalize_dim(end_dim, t.ndim)
    if s > e:
        raise ValueError("flatten: start_dim must not come after end_dim")
    n = 1
    for x in t.shape[s:e + 1]:
        n *= x
    return reshape(t, t.shape[:s] + (n,) + t.shape[e + 1:])


def permute(t, perm):
    if sorted(perm) != list(range(t.ndim)):
        raise ValueError(f"permute needs a permutation of {t.ndim} dims, got {tuple(perm)}")
    shape, strides = t.shape, t.strides
    return _make_view(t, [shape[p] for p in perm], [strides[p] for p in perm])


def expand(t, shape):
    shape = tuple(shape)
    if len(shape) < t.ndim:
        raise ValueError(f"expand: the number of sizes ({len(shape)}) must be at least the tensor's dims ({t.ndim})")
    pad = len(shape) - t.ndim
    new_shape, new_strides = [], []
    for i, s in enumerate(shape):
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"expand takes ints, got {s!r}")
        if i < pad:
            if s < 0:
                raise ValueError(f"expand: the new leading size {s} must be non-negative")
            new_shape.append(s)
            new_strides.append(0)
            continue
        old, st = t.shape[i - pad], t.strides[i - pad]
        if s == -1 or s == old:
            new_shape.append(old)
            new_strides.append(st)
        elif old == 1:
            if s < 0:
                raise ValueError(f"expand: invalid size {s}")
            new_shape.append(s)
            new_strides.append(0)
        else:
            raise ValueError(f"expand: size {old} at dim {i - pad} cannot expand to {s}")
    return _make_view(t, new_shape, new_strides)


def unsqueeze(t, dim):
    n = t.ndim + 1
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or not -n <= dim < n:
        raise IndexError(f"unsqueeze: dimension {dim!r} out of range for a result of {n} dims")
    dim %= n
    shape, strides = list(t.shape), list(t.strides)
    st = strides[dim] * shape[dim] if dim < t.ndim else 1
    shape.insert(dim, 1)
    strides.insert(dim, st)
    return _make_view(t, shape, strides)


def squeeze(t, dim=None):
    shape, strides = list(t.shape), list(t.strides)
    if dim is None:
        keep = [i for i, s in enumerate(shape) if s != 1]
    else:
        dims = {normalize_dim(d, t.ndim) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
        keep = [i for i, s in enumerate(shape) if not (i in dims and s == 1)]
    return _make_view(t, [shape[i] for i in keep], [strides[i] for i in keep])


def parse_view_shape(shape, numel):
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    shape = list(shape)
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"shape must contain ints, got {s!r}")
    infer = [i for i, s in enumerate(shape) if s == -1]
    if len(infer) > 1:
        raise ValueError("only one dimension can be inferred (-1)")
    if any(s < -1 for s in shape):
        raise ValueError(f"invalid shape {tuple(shape)}")
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if infer:
        if known == 0 or numel % known:
            raise ValueError(f"shape {tuple(shape)} is invalid for a tensor of {numel} elements")
        shape[infer[0]] = numel // known
    elif known != numel:
        raise ValueError(f"shape {tuple(shape)} is invalid for a tensor of {numel} elements")
    return tuple(int(s) for s in shape)


# ------------------------------------------------------------------ Tensor methods
# installed on Tensor by _methods.install (as Tensor.<name without tensor_>)

def tensor_view(self, *shape):
    """Return a view of the same memory with another shape, or another dtype.

    ``view(dtype)`` reinterprets the bytes, as ``torch.Tensor.view(dtype)``
    (and NumPy's ``ndarray.view``): a dtype of the same size keeps the
    shape and strides; a smaller one multiplies the last dimension by the
    ratio of the sizes, a larger one divides it, which needs stride 1 in
    the last dimension (and, for a larger dtype, a last size, other
    strides and storage offset divisible by the ratio). No data is copied,
    on the CPU or on CUDA.

    Parameters
    ----------
    *shape : int, sequence of int, or a dtype
        The new shape, with the same number of elements (one entry may be
        -1, inferred); or one dtype.

    Returns
    -------
    Tensor
        A view sharing this tensor's storage.

    Raises
    ------
    ValueError
        If the shape does not fit, or the strides do not allow a view
        (use :meth:`reshape`), or the layout does not allow the dtype.
    """
    if len(shape) == 1 and not isinstance(shape[0], (numbers.Integral, list, tuple)):
        try:
            d = dt.as_dtype(shape[0])
        except TypeError:
            raise TypeError(f"view takes a shape (ints or one sequence of ints) or a dtype, "
                            f"got {shape[0]!r}") from None
        return view_dtype(self, d)
    return view(self, parse_view_shape(shape, self.numel()))


def tensor_reshape(self, *shape):
    """Return the elements with another shape: a view when the strides allow one, else a copy.

    Parameters
    ----------
    *shape : int or sequence of int
        The new shape, with the same number of elements; one entry may
        be -1 (inferred).

    Returns
    -------
    Tensor
        A view or a contiguous copy.
    """
    return reshape(self, parse_view_shape(shape, self.numel()))


def tensor_flatten(self, start_dim=0, end_dim=-1):
    """Merge dimensions ``start_dim`` to ``end_dim`` (inclusive) into one.

    Parameters
    ----------
    start_dim : int, optional
        The first dimension merged; default 0.
    end_dim : int, optional
        The last dimension merged; default -1 (the last).

    Returns
    -------
    Tensor
        A view when the strides allow one, else a copy.
    """
    return flatten(self, start_dim, end_dim)


def tensor_transpose(self, dim0, dim1):
    """Return a view with dimensions ``dim0`` and ``dim1`` swapped.

    Parameters
    ----------
    dim0, dim1 : int
        The dimensions to swap.

    Returns
    -------
    Tensor
        A view sharing this tensor's storage.
    """
    perm = list(range(self.ndim))
    a, b = normalize_dim(dim0, self.ndim), normalize_dim(dim1, self.ndim)
    if self.ndim:
        perm[a], perm[b] = perm[b], perm[a]
    return permute(self, perm)


def tensor_permute(self, *dims):
    """Return a view with the dimensions in the order ``dims``.

    Parameters
    ----------
    *dims : int or sequence of int
        A permutation of the dimensions: ``permute(2, 0, 1)`` or
        ``permute((2, 0, 1))``.

    Returns
    -------
    Tensor
        A view sharing this tensor's storage.
    """
    if len(dims) == 1 and not isinstance(dims[0], numbers.Integral):
        dims = tuple(dims[0])
    return permute(self, [normalize_dim(d, self.ndim) for d in dims])


def tensor_T(self):
    """This tensor with its dimensions reversed (a view; the transpose of a matrix)."""
    return self.permute(*reversed(range(self.ndim)))


def tensor_expand(self, *shape):
    """Return a view broadcast to ``shape`` (size-1 dimensions repeat with stride 0).

    Parameters
    ----------
    *shape : int or sequence of int
        The new shape; -1 keeps a dimension's size, and new dimensions
        may be added in front.

    Returns
    -------
    Tensor
        A view sharing this tensor's storage (do not write to it).
    """
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    return expand(self, shape)


def tensor_unsqueeze(self, dim):
    """Return a view with a new dimension of size 1 at ``dim``.

    Parameters
    ----------
    dim : int
        Where the new dimension goes (negative counts from the end of the result).

    Returns
    -------
    Tensor
        A view sharing this tensor's storage.
    """
    return unsqueeze(self, dim)


def tensor_squeeze(self, dim=None):
    """Return a view without dimensions of size 1 (only ``dim``, when given and of size 1).

    Parameters
    ----------
    dim : int, optional
        The one dimension to remove.

    Returns
    -------
    Tensor
        A view sharing this tensor's storage.
    """
    return squeeze(self, dim)


def tensor_t(self):
    """Return the transpose of a matrix (a view); a tensor of fewer than 2 dimensions as it is.

    As ``torch.Tensor.t``.

    Returns
    -------
    Tensor
        A view sharing this tensor's storage.

    Raises
    ------
    ValueError
        For a tensor of more than 2 dimensions (use :meth:`transpose` or :attr:`mT`).
    """
    if self.ndim > 2:
        raise ValueError(f"t() expects a tensor of at most 2 dimensions, got {self.ndim}; "
                         f"use transpose(dim0, dim1) or .mT")
    if self.ndim < 2:
        return getitem(self, ())
    return permute(self, [1, 0])


def tensor_mT(self):
    """This tensor with its last two dimensions swapped (a view): the transpose of each matrix in a batch."""
    if self.ndim < 2:
        raise ValueError(f".mT needs a tensor of at least 2 dimensions, got {self.ndim}")
    perm = list(range(self.ndim))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return permute(self, perm)


def tensor_detach(self):
    """Return a view of this tensor sharing its storage, as ``torch.Tensor.detach`` (there is no autograd).

    Returns
    -------
    Tensor
        A new tensor object over the same memory, shape and strides.
    """
    return getitem(self, ())


def tensor_view_as(self, other):
    """Return a view of this tensor with ``other``'s shape: ``self.view(other.shape)``.

    Parameters
    ----------
    other : Tensor
        The tensor whose shape to take.

    Returns
    -------
    Tensor
        A view sharing this tensor's storage.
    """
    return view(self, tuple(other.shape))


def _int_args(args, what):
    """Varargs of ints or one sequence of ints, as a tuple of ints."""
    if len(args) == 1 and not isinstance(args[0], numbers.Integral):
        args = tuple(args[0])
    for a in args:
        if isinstance(a, bool) or not isinstance(a, numbers.Integral):
            raise TypeError(f"{what} takes ints, got {a!r}")
    return tuple(int(a) for a in args)


def tensor_flip(self, *dims):
    """Return a copy with the order of the elements reversed along ``dims``.

    As ``torch.flip`` (a copy, not a view).

    Parameters
    ----------
    *dims : int or sequence of int
        The dimensions to reverse: ``flip(0, 1)`` or ``flip((0, 1))``.

    Returns
    -------
    Tensor
        A new contiguous tensor.

    Raises
    ------
    IndexError
        If a dimension is out of range.
    ValueError
        If a dimension appears twice.
    """
    dims = [normalize_dim(d, self.ndim) for d in _int_args(dims, "flip")]
    if len(set(dims)) != len(dims):
        raise ValueError(f"flip: dims {tuple(dims)} name a dimension more than once")
    if self.ndim == 0:
        return self.clone()
    index = tuple(slice(None, None, -1) if k in dims else slice(None) for k in range(self.ndim))
    return getitem(self, index).clone()


def tensor_repeat(self, *sizes):
    """Return this tensor repeated ``sizes[k]`` times along each dimension ``k``.

    As ``torch.Tensor.repeat`` (NumPy's ``tile``): ``sizes`` may have more
    entries than the tensor has dimensions, which adds leading ones.

    Parameters
    ----------
    *sizes : int or sequence of int
        The number of copies along each dimension, at least 0.

    Returns
    -------
    Tensor
        A new contiguous tensor of shape ``sizes[k] * shape[k]``.

    Raises
    ------
    ValueError
        For fewer sizes than dimensions, or a negative size.
    """
    sizes = _int_args(sizes, "repeat")
    if len(sizes) < self.ndim:
        raise ValueError(f"repeat: {len(sizes)} sizes for a tensor of {self.ndim} dimensions; give at least "
                         f"one per dimension")
    if any(r < 0 for r in sizes):
        raise ValueError(f"repeat: sizes must be non-negative, got {sizes}")
    shape = (1,) * (len(sizes) - self.ndim) + tuple(self.shape)
    pairs, split = [], []
    for r, s in zip(sizes, shape):
        pairs += [1, s]
        split += [r, s]
    result = empty(tuple(r * s for r, s in zip(sizes, shape)), dtype=self.dtype, device=self.device)
    if result.numel():
        view(result, tuple(split)).copy_(expand(reshape(self, tuple(pairs)), tuple(split)))
    return result


TENSOR_METHODS = {"view": tensor_view, "reshape": tensor_reshape, "flatten": tensor_flatten, "transpose": tensor_transpose, "permute": tensor_permute, "expand": tensor_expand, "unsqueeze": tensor_unsqueeze, "squeeze": tensor_squeeze,
                  "t": tensor_t, "detach": tensor_detach, "view_as": tensor_view_as, "flip": tensor_flip,
                  "repeat": tensor_repeat}
