# SPDX-License-Identifier: Apache-2.0
"""Driver layer: error translation, devices and their primary contexts."""

import os
import threading

from cuda.bindings cimport cydriver
from libc.string cimport memset

cdef extern from "tp_tls.hpp" namespace "tp" nogil:
    int tls_bound_device
    int tls_current_device


class CudaError(RuntimeError):
    """A CUDA driver call failed.

    Attributes
    ----------
    code : int
        The CUresult value.
    name : str
        Its name, e.g. ``"CUDA_ERROR_INVALID_VALUE"``.
    description : str
        The driver's description of the error.
    """

    def __init__(self, code, name=None, description=None):
        self.code = int(code)
        self.name = name if name is not None else f"CUresult({self.code})"
        self.description = description if description is not None else ""
        msg = self.name if not self.description else f"{self.name}: {self.description}"
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self.code, self.name, self.description))


class OutOfMemoryError(CudaError):
    """The device ran out of memory (CUDA_ERROR_OUT_OF_MEMORY), even after the
    caching allocator released its cached blocks and retried."""

    def __init__(self, code=cydriver.CUDA_ERROR_OUT_OF_MEMORY, name=None, description=None):
        super().__init__(code, name if name is not None else "CUDA_ERROR_OUT_OF_MEMORY",
                         description if description is not None else "out of memory")


class CudaUnavailableError(RuntimeError):
    """No usable CUDA driver or device: the operation needs a GPU."""


def _error_strings(int code):
    cdef const char* c_name = NULL
    cdef const char* c_desc = NULL
    try:
        if cydriver.cuGetErrorName(<cydriver.CUresult>code, &c_name) != cydriver.CUDA_SUCCESS:
            c_name = NULL
        if cydriver.cuGetErrorString(<cydriver.CUresult>code, &c_desc) != cydriver.CUDA_SUCCESS:
            c_desc = NULL
    except Exception:
        pass
    if c_name != NULL:
        name = c_name.decode()
    else:   # no driver to ask: the bindings know the names
        try:
            from cuda.bindings import driver as _drv
            name = _drv.CUresult(code).name
        except Exception:
            name = f"CUresult({code})"
    desc = c_desc.decode() if c_desc != NULL else ""
    return name, desc


def make_error(int code, str context=None):
    """Build the CudaError (or OutOfMemoryError) for a CUresult value."""
    name, desc = _error_strings(code)
    if context:
        desc = f"{desc} ({context})" if desc else context
    cls = OutOfMemoryError if code == cydriver.CUDA_ERROR_OUT_OF_MEMORY else CudaError
    return cls(code, name, desc)


cdef int raise_cuda_error(cydriver.CUresult result) except -1 nogil:
    with gil:
        raise make_error(<int>result)


# ---------------------------------------------------------------- driver state

cdef bint g_init_done = False
cdef object g_init_error = None          # why the driver is unusable, if it is
cdef int g_device_count = 0
cdef cydriver.CUcontext g_primary[MAX_DEVICES]
memset(g_primary, 0, sizeof(g_primary))


def _forget_contexts_in_forked_child():
    """A forked child inherits the parent's contexts, which the driver no longer
    serves there: forget them, so the next driver call goes through
    validate_device and raises CudaUnavailableError instead of faulting."""
    global tls_bound_device
    memset(g_primary, 0, sizeof(g_primary))
    tls_bound_device = -1


os.register_at_fork(after_in_child=_forget_contexts_in_forked_child)
cdef object g_lock = threading.Lock()
cdef int g_init_pid = 0


cdef int _init_driver() except -1:
    """Run cuInit once; remember why it failed instead of raising."""
    global g_init_done, g_init_error, g_device_count, g_init_pid
    if g_init_done:
        return 0
    with g_lock:
        if g_init_done:
            return 0
        if os.environ.get("TENSORPLAY_DISABLE_CUDA"):
            g_init_error = "CUDA disabled by TENSORPLAY_DISABLE_CUDA"
        else:
            try:
                r = cydriver.cuInit(0)
                if r != cydriver.CUDA_SUCCESS:
                    name, desc = _error_strings(r)
                    g_init_error = f"cuInit failed: {name}: {desc}"
                else:
                    r = cydriver.cuDeviceGetCount(&g_device_count)
                    if r != cydriver.CUDA_SUCCESS:
                        name, desc = _error_strings(r)
                        g_init_error = f"cuDeviceGetCount failed: {name}: {desc}"
                        g_device_count = 0
                    elif g_device_count > MAX_DEVICES:
                        g_device_count = MAX_DEVICES
            except Exception as exc:  # no libcuda.so: cuda-bindings raises on load
                g_init_error = f"no CUDA driver found ({exc})"
        if g_init_error is None and g_device_count == 0:
            g_init_error = "the CUDA driver reports no devices"
        g_init_pid = os.getpid()
        g_init_done = True
    return 0


def is_available():
    """Return True when a CUDA driver and at least one device are usable."""
    _init_driver()
    return g_init_error is None and g_device_count > 0


def unavailable_reason():
    """Why CUDA is not available (None when it is)."""
    _init_driver()
    return g_init_error


def device_count():
    """Return the number of CUDA devices (0 without a driver), cuDeviceGetCount."""
    _init_driver()
    return g_device_count if g_init_error is None else 0


cdef int checked_device_count() except -1:
    _init_driver()
    if g_init_error is not None:
        raise CudaUnavailableError(f"CUDA is not available: {g_init_error}")
    if g_init_pid != os.getpid():
        raise CudaUnavailableError(
            "CUDA cannot be used in a forked child process after it was "
            "initialised in the parent; use the 'spawn' start method")
    return g_device_count


cdef int validate_device(int device) except -1:
    cdef int n = checked_device_count()
    if device < 0 or device >= n:
        raise ValueError(f"CUDA device index {device} out of range: {n} device(s) present")
    return 0


cdef cydriver.CUcontext primary_context(int device) except? NULL nogil:
    cdef cydriver.CUcontext ctx = g_primary[device]
    cdef cydriver.CUdevice dev
    if ctx != NULL:
        return ctx
    with gil:
        validate_device(device)
        with g_lock:
            if g_primary[device] == NULL:
                check(cydriver.cuDeviceGet(&dev, device))
                check(cydriver.cuDevicePrimaryCtxRetain(&ctx, dev))
                g_primary[device] = ctx
            return g_primary[device]


cdef int ensure_context(int device) except -1 nogil:
    """Make device's primary context current on this thread, once per thread."""
    global tls_bound_device
    if tls_bound_device == device:
        return 0
    cdef cydriver.CUcontext ctx = primary_context(device)
    check(cydriver.cuCtxSetCurrent(ctx))
    tls_bound_device = device
    return 0


cdef int get_current_device() noexcept nogil:
    return tls_current_device


def current_device():
    """Return the index of this thread's current CUDA device."""
    checked_device_count()
    return tls_current_device


def set_device(device):
    """Make ``device`` this thread's current CUDA device (cuCtxSetCurrent of
    its primary context)."""
    global tls_current_device
    cdef int d = _device_index(device)
    validate_device(d)
    ensure_context(d)
    tls_current_device = d


def _device_index(device):
    """Normalise an int, 'cuda', 'cuda:N' or object with .type/.index to an index."""
    if device is None:
        return current_device()
    if isinstance(device, bool):
        raise TypeError(f"expected a CUDA device index, got {device!r}")
    if isinstance(device, int):
        return device
    if hasattr(device, "__index__") and not isinstance(device, str):
        return device.__index__()
    if isinstance(device, str):
        s = device.strip()
        if s == "cuda":
            return current_device()
        if s.startswith("cuda:"):
            try:
                return int(s[5:])
            except ValueError:
                pass
        raise ValueError(f"expected a CUDA device such as 'cuda' or 'cuda:0', got {device!r}")
    typ = getattr(device, "type", None)
    if typ == "cuda":
        idx = getattr(device, "index", None)
        return current_device() if idx is None else int(idx)
    raise TypeError(f"expected a CUDA device index, str or device, got {type(device).__name__}")


def device_index(device):
    """Validate ``device`` and return its index (None means the current device)."""
    d = _device_index(device)
    validate_device(d)
    return d


def synchronize(device=None):
    """Wait for all work on ``device`` (default: current) to finish, cuCtxSynchronize."""
    cdef int d = device_index(device)
    with nogil:
        ensure_context(d)
        check(cydriver.cuCtxSynchronize())


def get_device_name(device=None):
    """Return the device's name, cuDeviceGetName."""
    cdef int d = device_index(device)
    cdef char buf[256]
    cdef cydriver.CUdevice dev
    with nogil:
        check(cydriver.cuDeviceGet(&dev, d))
        check(cydriver.cuDeviceGetName(buf, 256, dev))
    return buf.decode()


cdef int _attr(cydriver.CUdevice dev, cydriver.CUdevice_attribute a) except? -1:
    cdef int v = 0
    with nogil:
        check(cydriver.cuDeviceGetAttribute(&v, a, dev))
    return v


def get_device_capability(device=None):
    """Return (major, minor) compute capability."""
    cdef int d = device_index(device)
    cdef cydriver.CUdevice dev
    check(cydriver.cuDeviceGet(&dev, d))
    return (_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))


def get_device_properties(device=None):
    """Return a dict: name, major, minor, total_memory, multi_processor_count,
    and a few limits, read with cuDeviceGetAttribute / cuDeviceTotalMem."""
    cdef int d = device_index(device)
    cdef cydriver.CUdevice dev
    cdef size_t total = 0
    with nogil:
        check(cydriver.cuDeviceGet(&dev, d))
        check(cydriver.cuDeviceTotalMem(&total, dev))
    return {
        "index": d,
        "name": get_device_name(d),
        "major": _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
        "minor": _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        "total_memory": total,
        "multi_processor_count": _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "max_threads_per_block": _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        "max_shared_memory_per_block": _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
        "warp_size": _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
        "pci_bus_id": _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
    }


def driver_version():
    """Return the driver's CUDA version as (major, minor), cuDriverGetVersion."""
    cdef int v = 0
    checked_device_count()
    check(cydriver.cuDriverGetVersion(&v))
    return (v // 1000, (v % 1000) // 10)


def mem_get_info(device=None):
    """Return (free, total) bytes on the device, cuMemGetInfo."""
    cdef int d = device_index(device)
    cdef size_t free_b = 0, total_b = 0
    with nogil:
        ensure_context(d)
        check(cydriver.cuMemGetInfo(&free_b, &total_b))
    return free_b, total_b


def can_device_access_peer(device, peer):
    """Return True if ``device`` can access ``peer``'s memory, cuDeviceCanAccessPeer."""
    cdef int a = device_index(device), b = device_index(peer)
    cdef int ok = 0
    cdef cydriver.CUdevice da, db
    if a == b:
        return True
    check(cydriver.cuDeviceGet(&da, a))
    check(cydriver.cuDeviceGet(&db, b))
    check(cydriver.cuDeviceCanAccessPeer(&ok, da, db))
    return bool(ok)


def enable_peer_access(device, peer):
    """Let kernels and copies on ``device`` reach ``peer``'s memory directly
    (cuCtxEnablePeerAccess from device's primary context). Copies between
    devices work without it, staged by the driver; enabled twice is fine.
    Raises ValueError when the hardware cannot (see can_device_access_peer)."""
    _set_peer_access(device, peer, True)


def disable_peer_access(device, peer):
    """Undo enable_peer_access (cuCtxDisablePeerAccess); not enabled is fine."""
    _set_peer_access(device, peer, False)


cdef int _set_peer_access(object device, object peer, bint enable) except -1:
    cdef int a = device_index(device), b = device_index(peer)
    cdef cydriver.CUresult r
    cdef cydriver.CUcontext peer_ctx
    validate_device(a)
    validate_device(b)
    if a == b:
        return 0
    if enable and not can_device_access_peer(a, b):
        raise ValueError(f"cuda:{a} cannot access cuda:{b}'s memory (cuDeviceCanAccessPeer)")
    peer_ctx = primary_context(b)
    with nogil:
        ensure_context(a)
        if enable:
            r = cydriver.cuCtxEnablePeerAccess(peer_ctx, 0)
        else:
            r = cydriver.cuCtxDisablePeerAccess(peer_ctx)
    if r != cydriver.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED and r != cydriver.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED:
        check(r)
    return 0


def _bound_device():
    """The device whose primary context this thread made current (-1: none); for tests."""
    return tls_bound_device
