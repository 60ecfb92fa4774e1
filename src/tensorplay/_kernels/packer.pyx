# SPDX-License-Identifier: Apache-2.0
"""Launch plans' compiled half: a kernel's argument buffer packed from
addresses, tensors and scalars, and launched with no Python frame per call.

It sits with the kernel families (it reads TensorBase, the tensor core's
type); the driver floor below keeps Function and the raw launch.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_AsDouble
from cuda.bindings cimport cydriver
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy
from libcpp.vector cimport vector

from tensorplay._driver.launch cimport Function, launch_dims
from tensorplay._driver.stream cimport current_stream_handle
from tensorplay._tensor.base cimport TensorBase


cdef class LaunchPacker:
    """The compiled half of a launch plan: lays out (pointers, n, scalars,
    geometry) as the kernel's argument buffer, 8 bytes each but the trailing
    geometry bytes, and launches on the current stream, with no Python
    frame, struct packing or grid parsing per call.

    ``kinds`` gives each scalar as double ('f') or long long ('i'); ``f`` is
    a :class:`Function`, or any object with its ``launch`` method (tests'
    stand-ins, which get the same buffer)."""

    cdef object _f
    cdef Function _fn
    cdef int _device
    cdef long long _n
    cdef Py_ssize_t _nptrs
    cdef vector[char] _kinds
    cdef bytes _geom
    cdef object _grid
    cdef object _block
    cdef unsigned int _g[3]
    cdef unsigned int _b[3]

    def __init__(self, f, int device, long long n, Py_ssize_t nptrs, kinds, bytes geom not None, grid, block):
        self._f = f
        self._fn = f if type(f) is Function else None
        self._device = device
        self._n = n
        self._nptrs = nptrs
        for k in kinds:
            if k not in ("f", "i"):
                raise ValueError(f"scalar kinds are 'f' (double) or 'i' (long long), got {k!r}")
            self._kinds.push_back(b"f"[0] if k == "f" else b"i"[0])
        self._geom = geom
        self._grid = grid
        self._block = block
        launch_dims(grid, self._g, "grid")
        launch_dims(block, self._b, "block")

    cdef int _put_scalars(self, vector[unsigned long long]& words, object values, object positions) except -1:
        """Append each scalar as its kind's 8 bytes: ``values[positions[i]]``
        converted as the front end does (``float()``, ``int()``), or without
        positions ``values[i]`` as struct packing would take it (no float
        for an integer)."""
        cdef Py_ssize_t i, n = self._kinds.size()
        cdef double d
        cdef long long q
        cdef unsigned long long w
        if len(positions if positions is not None else values) != n:
            raise ValueError(f"the kernel takes {n} scalars, got {len(positions if positions is not None else values)}")
        for i in range(n):
            v = values[positions[i]] if positions is not None else values[i]
            try:
                if self._kinds[i] == b"f"[0]:
                    d = PyFloat_AsDouble(v) if type(v) is float else <double>float(v)
                    memcpy(&w, &d, 8)
                else:
                    q = int(v) if positions is not None else v
                    memcpy(&w, &q, 8)
            except (OverflowError, TypeError, ValueError) as exc:
                raise OverflowError(f"a scalar does not fit the kernel's argument type: {exc}") from None
            words.push_back(w)
        return 0

    cdef int _send(self, vector[unsigned long long]& words, object stream) except -1:
        cdef size_t nwords = words.size() * 8
        cdef size_t ng = PyBytes_GET_SIZE(self._geom)
        cdef vector[char] buf
        cdef cydriver.CUstream s
        buf.resize(nwords + ng)
        memcpy(buf.data(), words.data(), nwords)
        if ng:
            memcpy(buf.data() + nwords, PyBytes_AS_STRING(self._geom), ng)
        if stream is None:
            s = current_stream_handle(self._device)
        else:
            s = <cydriver.CUstream><uintptr_t>stream
        if self._fn is None:
            self._f.launch(self._grid, self._block, PyBytes_FromStringAndSize(buf.data(), buf.size()),
                           0, <uintptr_t>s)
            return 0
        with nogil:
            self._fn.c_launch(self._g[0], self._g[1], self._g[2], self._b[0], self._b[1], self._b[2], 0, s,
                              buf.data(), buf.size())
        return 0

    def launch(self, ptrs, scalars, stream=None):
        """Launch over the addresses ``ptrs`` and the ``scalars`` on ``stream``
        (a handle; None: the current stream of the plan's device)."""
        cdef vector[unsigned long long] words
        if len(ptrs) != self._nptrs:
            raise ValueError(f"the kernel takes {self._nptrs} pointers, got {len(ptrs)}")
        words.reserve(self._nptrs + 1 + self._kinds.size())
        for p in ptrs:
            words.push_back(<unsigned long long>p)
        words.push_back(<unsigned long long>self._n)
        self._put_scalars(words, scalars, None)
        return self._send(words, stream)

    def launch_operands(self, TensorBase out not None, tuple operands, tuple tensor_pos, tuple scalar_pos):
        """Launch writing ``out`` over ``operands[k]`` for k in ``tensor_pos``
        (CUDA tensors, their addresses handed out as ``data_ptr()`` does) and
        the scalars ``operands[k]`` for k in ``scalar_pos``, on the current stream."""
        cdef vector[unsigned long long] words
        cdef TensorBase t
        if len(tensor_pos) + 1 != self._nptrs:
            raise ValueError(f"the kernel takes {self._nptrs} pointers, got {len(tensor_pos) + 1}")
        words.reserve(self._nptrs + 1 + self._kinds.size())
        out.c_note_use()
        words.push_back(out._ptr)
        for k in tensor_pos:
            t = <TensorBase?>operands[k]
            t.c_note_use()
            words.push_back(t._ptr)
        words.push_back(<unsigned long long>self._n)
        self._put_scalars(words, operands, scalar_pos)
        return self._send(words, None)
