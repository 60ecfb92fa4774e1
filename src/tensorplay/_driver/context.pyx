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
    """No usable CUDA driver or device: the operation needs a GPU.

    Raised where work needs a GPU and none is usable (no driver, a driver
    older than CUDA 13.0, no device of compute capability 7.5 or newer,
    ``TENSORPLAY_DISABLE_CUDA`` set), and when a device below compute
    capability 7.5 on a machine that also has a supported one is used.
    """


# The public module path: tracebacks and reprs show tensorplay.cuda.CudaError,
# and pickle finds the classes there (tensorplay.cuda re-exports them).
for _cls in (CudaError, OutOfMemoryError, CudaUnavailableError):
    _cls.__module__ = "tensorplay.cuda"
del _cls


# ------------------------------------------------------------- requirements

# cuDriverGetVersion of the oldest driver tensorplay runs on: CUDA 13.0
# (driver branch R580). The build uses newer CUDA 13.x headers; what they
# declare beyond 13.0 is not called, and NVRTC's CUBIN loads on any 13.x driver.
MIN_DRIVER_VERSION = 13000
MIN_DRIVER_BRANCH = 580
# NVRTC 13 targets compute capability 7.5 (Turing) and newer only.
MIN_COMPUTE_CAPABILITY = (7, 5)


def format_cuda_version(int version):
    """13000 -> '13.0', as cuDriverGetVersion encodes it."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _driver_version_problem(int version):
    """The reason a driver reporting CUDA ``version`` (cuDriverGetVersion's
    encoding, e.g. 13000) cannot be used, or None when it can."""
    if version >= MIN_DRIVER_VERSION:
        return None
    if version <= 0:
        return "the NVIDIA driver did not report its CUDA version (cuDriverGetVersion)"
    return (f"the NVIDIA driver supports CUDA {format_cuda_version(version)}, but tensorplay "
            f"needs a driver for CUDA {format_cuda_version(MIN_DRIVER_VERSION)} or newer "
            f"(driver R{MIN_DRIVER_BRANCH} or newer)")


def _capability_supported(int major, int minor):
    """True when NVRTC 13 can compile tensorplay's kernels for compute
    capability ``major.minor``."""
    return (major, minor) >= MIN_COMPUTE_CAPABILITY


def _unsupported_device_message(int index, str name, int major, int minor):
    m, n = MIN_COMPUTE_CAPABILITY
    return (f"cuda:{index} ({name}) has compute capability {major}.{minor}, but tensorplay's "
            f"NVRTC-compiled kernels need compute capability {m}.{n} or newer (Turing or newer)")


def _devices_problem(devices):
    """The reason none of ``devices`` (a sequence of (name, major, minor), in
    device order) can be used, or None when at least one can."""
    devices = list(devices)
    if not devices:
        return "the NVIDIA driver reports no CUDA devices"
    if any(_capability_supported(major, minor) for _, major, minor in devices):
        return None
    if len(devices) == 1:
        name, major, minor = devices[0]
        return _unsupported_device_message(0, name, major, minor)
    m, n = MIN_COMPUTE_CAPABILITY
    found = ", ".join(f"cuda:{i} {name} {major}.{minor}" for i, (name, major, minor) in enumerate(devices))
    return (f"no CUDA device has compute capability {m}.{n} or newer (found {found}), "
            f"which tensorplay's NVRTC-compiled kernels need (Turing or newer)")


def _driver_load_problem(exc):
    """Our sentence for an exception raised while loading the driver library."""
    # cuda.pathfinder's DynamicLibNotFoundError (and its subclasses): no libcuda.so.1
    if any(c.__name__ == "DynamicLibNotFoundError" for c in type(exc).__mro__):
        return "no NVIDIA driver was found (libcuda.so.1 could not be loaded)"
    return f"the NVIDIA driver library libcuda.so.1 could not be used ({type(exc).__name__}: {exc})"


def disabled_by_env(value):
    """True when TENSORPLAY_DISABLE_CUDA's ``value`` turns CUDA off: set and
    not empty, '0', 'false', 'no' or 'off'."""
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


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


# Failures a graph capture causes: their errors say which capture is open.
_CAPTURE_ERRORS = frozenset({
    cydriver.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cydriver.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    cydriver.CUDA_ERROR_STREAM_CAPTURE_MERGE, cydriver.CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
    cydriver.CUDA_ERROR_STREAM_CAPTURE_UNJOINED, cydriver.CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
    cydriver.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cydriver.CUDA_ERROR_CAPTURED_EVENT,
    cydriver.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, cydriver.CUDA_ERROR_ILLEGAL_STATE,
})

# The graph layer registers a function describing the open captures, so that
# errors raised down here can name them (this layer cannot import that one).
cdef object g_capture_describer = None


def set_open_capture_describer(describer):
    """Register ``describer() -> str`` ('' when no capture is open)."""
    global g_capture_describer
    g_capture_describer = describer


def describe_open_captures():
    """One sentence per open graph capture (graph, stream, thread, where it
    began, how to end it), or '' when none is open."""
    if g_capture_describer is None:
        return ""
    try:
        return g_capture_describer()
    except Exception:            # a description must never hide the error it explains
        return ""


def make_error(int code, str context=None):
    """Build the CudaError (or OutOfMemoryError) for a CUresult value; a
    capture-related failure names the open captures."""
    name, desc = _error_strings(code)
    if context:
        desc = f"{desc} ({context})" if desc else context
    if code in _CAPTURE_ERRORS:
        open_captures = describe_open_captures()
        if open_captures:
            desc = f"{desc}. {open_captures}" if desc else open_captures
    cls = OutOfMemoryError if code == cydriver.CUDA_ERROR_OUT_OF_MEMORY else CudaError
    return cls(code, name, desc)


cdef int raise_cuda_error(cydriver.CUresult result) except -1 nogil:
    with gil:
        raise make_error(<int>result)


# ---------------------------------------------------------------- live objects

cdef Py_ssize_t g_live[NUM_LIVE_KINDS]
memset(g_live, 0, sizeof(g_live))


cdef void count_live(LiveKind kind, int delta) noexcept nogil:
    """Note ``delta`` driver objects of ``kind`` created (+) or destroyed (-).
    Callers hold the GIL (the counts are plain integers)."""
    g_live[<int>kind] += delta

_LIVE_NAMES = ("streams", "events", "graphs", "execs", "modules")


def live_counts():
    """Driver objects tensorplay created and has not destroyed, by kind:
    streams, events, graphs (CUgraph), execs (CUgraphExec), modules."""
    return {name: g_live[i] for i, name in enumerate(_LIVE_NAMES)}


# ---------------------------------------------------------------- open captures

# Graph captures open in the process (all devices; the allocator opens and
# closes them). While any is, no event is queried or recorded and no memory
# is freed, and device memory is not read back to the host: each would break
# a global-mode capture. Kept down here so that every floor can ask.
cdef int g_open_captures = 0


cdef int open_capture_count() noexcept nogil:
    """The number of graph captures open in the process."""
    return g_open_captures


cdef void count_open_capture(int delta) noexcept nogil:
    """Note a capture opened (+1) or ended (-1). Callers hold the GIL."""
    global g_open_captures
    g_open_captures += delta


# ---------------------------------------------------------------- driver state

cdef bint g_init_done = False
cdef object g_init_error = None          # why the driver is unusable, if it is
cdef int g_device_count = 0
cdef int g_driver_version = 0           # cuDriverGetVersion, 0 when unknown
cdef bint g_supported[MAX_DEVICES]      # compute capability 7.5 or newer
memset(g_supported, 0, sizeof(g_supported))
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
    """Load the driver and check what tensorplay needs, once; remember why
    CUDA is unusable (one sentence) instead of raising."""
    global g_init_done, g_init_error, g_init_pid
    if g_init_done:
        return 0
    with g_lock:
        if g_init_done:
            return 0
        if disabled_by_env(os.environ.get("TENSORPLAY_DISABLE_CUDA")):
            g_init_error = "the environment variable TENSORPLAY_DISABLE_CUDA turns CUDA off"
        else:
            try:
                g_init_error = _probe_driver()
            except Exception as exc:   # no libcuda.so.1: cuda-bindings raises on first use
                g_init_error = _driver_load_problem(exc)
        if g_init_error is not None:
            _forget_devices()
        g_init_pid = os.getpid()
        g_init_done = True
    return 0


cdef int _forget_devices() except -1:
    global g_device_count
    g_device_count = 0
    memset(g_supported, 0, sizeof(g_supported))
    return 0


cdef object _probe_driver():
    """cuDriverGetVersion, cuInit, cuDeviceGetCount and each device's compute
    capability; returns the reason CUDA is unusable, or None."""
    global g_driver_version, g_device_count
    cdef int version = 0, count = 0, major = 0, minor = 0
    cdef cydriver.CUdevice dev
    cdef char buf[256]
    r = cydriver.cuDriverGetVersion(&version)   # needs no cuInit: an old driver is named clearly
    if r != cydriver.CUDA_SUCCESS:
        name, _ = _error_strings(r)
        return f"the NVIDIA driver did not report its CUDA version (cuDriverGetVersion returned {name})"
    g_driver_version = version
    problem = _driver_version_problem(version)
    if problem is not None:
        return problem
    r = cydriver.cuInit(0)
    if r == cydriver.CUDA_ERROR_NO_DEVICE:
        return "the NVIDIA driver reports no CUDA devices"
    if r != cydriver.CUDA_SUCCESS:
        name, desc = _error_strings(r)
        return f"the NVIDIA driver failed to initialise (cuInit returned {name}{': ' + desc if desc else ''})"
    r = cydriver.cuDeviceGetCount(&count)
    if r != cydriver.CUDA_SUCCESS:
        name, _ = _error_strings(r)
        return f"the NVIDIA driver could not count its devices (cuDeviceGetCount returned {name})"
    count = min(count, MAX_DEVICES)
    devices = []
    for i in range(count):
        check(cydriver.cuDeviceGet(&dev, i))
        check(cydriver.cuDeviceGetAttribute(&major, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        check(cydriver.cuDeviceGetAttribute(&minor, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
        check(cydriver.cuDeviceGetName(buf, 256, dev))
        devices.append((buf.decode(errors="replace"), major, minor))
        g_supported[i] = _capability_supported(major, minor)
    g_device_count = count
    return _devices_problem(devices)


def is_available():
    """Return True when CUDA is usable: a driver for CUDA 13.0 or newer and at
    least one device of compute capability 7.5 or newer.

    Never raises and never warns; :func:`unavailable_reason` says why not.
    ``TENSORPLAY_DISABLE_CUDA=1`` makes it False without touching the driver.
    """
    _init_driver()
    return g_init_error is None and g_device_count > 0


def unavailable_reason():
    """Return why CUDA is not available, as one sentence, or None when it is.

    For example ``"no NVIDIA driver was found (libcuda.so.1 could not be
    loaded)"`` or ``"the NVIDIA driver supports CUDA 12.4, but tensorplay needs
    a driver for CUDA 13.0 or newer (driver R580 or newer)"``.
    """
    _init_driver()
    return g_init_error


def is_device_supported(device=None):
    """Return True when ``device`` (an index, ``"cuda:N"`` or a device;
    default: the current one) has compute capability 7.5 or newer, which
    tensorplay's kernels need.

    Older devices on a machine that also has a supported one are counted by
    :func:`device_count` and can be queried, but work on them raises
    :class:`CudaUnavailableError`.
    """
    cdef int d = _device_index(device)
    validate_device(d)
    return bool(g_supported[d])


def raw_driver_version():
    """cuDriverGetVersion as the driver reported it (e.g. 13000), or None when
    no driver was loaded; also when CUDA is otherwise unusable (show_config)."""
    _init_driver()
    return g_driver_version if g_driver_version > 0 else None


def device_count():
    """Return the number of CUDA devices (0 when CUDA is not available), cuDeviceGetCount.

    Devices below compute capability 7.5 are counted (device indices stay the
    driver's, as other CUDA programs see them); see :func:`is_device_supported`.
    """
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


def require_cuda(what=None):
    """Raise CudaUnavailableError unless CUDA is usable in this process.

    ``what``, the clause saying what needed CUDA (``"make_graphed_callables:
    sample args must be CUDA tensors"``), leads the message, followed by why
    CUDA is not available.
    """
    try:
        checked_device_count()
    except CudaUnavailableError as exc:
        if what is None:
            raise
        raise CudaUnavailableError(f"{what}, but {exc}") from None


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
        if not g_supported[device]:
            _raise_unsupported(device)
        with g_lock:
            if g_primary[device] == NULL:
                check(cydriver.cuDeviceGet(&dev, device))
                check(cydriver.cuDevicePrimaryCtxRetain(&ctx, dev))
                g_primary[device] = ctx
            return g_primary[device]


cdef int _raise_unsupported(int device) except -1:
    cdef int major = 0, minor = 0
    cdef cydriver.CUdevice dev
    check(cydriver.cuDeviceGet(&dev, device))
    major = _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    raise CudaUnavailableError(_unsupported_device_message(device, get_device_name(device), major, minor))


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


def bound_device():
    """Return the device whose primary context this thread made current (-1: none)."""
    return tls_bound_device
