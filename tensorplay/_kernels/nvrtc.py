# SPDX-License-Identifier: Apache-2.0
"""NVRTC compilation of generated CUDA C to CUBIN, cached in memory and on disk.

Runs without a GPU: only the NVRTC library is needed. The cache key covers the
source, the options, the target architecture and the NVRTC version.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from typing import Any

__all__ = ["NVRTCError", "compile_cubin", "nvrtc_version", "cache_dir", "kernel_cache_dir", "kernel_cache_info", "clear_kernel_cache",
           "supported_archs", "target_arch", "is_cached", "add_compile_listener", "remove_compile_listener"]

# Each compilation is logged at INFO (kernel, target, milliseconds), each CUBIN
# read back from the on-disk cache at DEBUG; nothing is printed unless the
# application configures logging (e.g. logging.basicConfig(level=logging.INFO)).
logger = logging.getLogger("tensorplay.nvrtc")


class NVRTCError(RuntimeError):
    """NVRTC failed to compile a kernel; ``log`` holds the compiler's log."""

    def __init__(self, message, log=""):
        super().__init__(f"{message}\n{log}" if log else message)
        self.log = log

    def __reduce__(self):
        return (type(self), (self.args[0].split("\n", 1)[0], self.log))


# The public module path (tensorplay.cuda.NVRTCError, also tensorplay.NVRTCError):
# tracebacks and reprs show it, and pickle finds the class there.
NVRTCError.__module__ = "tensorplay.cuda"


_lock = threading.Lock()
_memory_cache: dict[str, bytes] = {}
_stats = {"compiled": 0, "memory_hits": 0, "disk_hits": 0}
# Called after each NVRTC compilation with (kernel name, target, seconds), from
# the compiling thread (tensorplay._kernels.precompile's compile_progress).
_listeners: list = []


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover
        raise NVRTCError(f"cuda-bindings' nvrtc module is unavailable: {exc}") from exc
    return nvrtc


def _check(result, what, prog=None):
    nvrtc = _nvrtc()
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = _log(prog) if prog is not None else ""
        _, msg = nvrtc.nvrtcGetErrorString(err)
        text = msg.decode() if isinstance(msg, bytes) else str(msg)
        # NVRTC's description of a result is its name (NVRTC_ERROR_COMPILATION): said once
        raise NVRTCError(f"{what} failed: {err.name}" + (f": {text}" if text and text != err.name else ""), log)
    return result[1:] if isinstance(result, tuple) and len(result) > 2 else (
        result[1] if isinstance(result, tuple) and len(result) == 2 else None)


def _log(prog):
    nvrtc = _nvrtc()
    err, n = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or n <= 1:
        return ""
    buf = b" " * n
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00 ").decode(errors="replace")


def nvrtc_version():
    """(major, minor) of the NVRTC library in use."""
    try:
        nvrtc = _nvrtc()
        err, major, minor = nvrtc.nvrtcVersion()
    except NVRTCError:
        raise
    except Exception as exc:
        raise NVRTCError(f"NVRTC library not found ({exc}); pip install 'nvidia-cuda-nvrtc==13.*'") from exc
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NVRTCError(f"nvrtcVersion failed: {err.name}")
    return (major, minor)


def supported_archs():
    """Compute capabilities this NVRTC can target, as ints (e.g. 90)."""
    nvrtc = _nvrtc()
    err, n = nvrtc.nvrtcGetNumSupportedArchs()
    _check(err, "nvrtcGetNumSupportedArchs")
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(err, "nvrtcGetSupportedArchs")
    return list(archs)


def cache_root():
    """tensorplay's cache folder: ``$TENSORPLAY_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/tensorplay``, else ``~/.cache/tensorplay`` (read at each call)."""
    d = os.environ.get("TENSORPLAY_CACHE_DIR")
    if not d:
        d = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tensorplay")
    return d


def cache_dir():
    """Where compiled kernels are kept: the ``kernels`` folder of :func:`cache_root`."""
    return os.path.join(cache_root(), "kernels")


def cache_key(source: str, options: tuple, arch: int) -> str:
    ver = nvrtc_version()
    h = hashlib.sha256()
    for part in (source, "\0".join(options), str(arch), f"{ver[0]}.{ver[1]}"):
        h.update(part.encode())
        h.update(b"\x01")
    return h.hexdigest()


def target_for(arch: int) -> tuple[str, bool]:
    """The --gpu-architecture flag for compute capability ``arch`` and whether it
    yields CUBIN. A GPU newer than this NVRTC gets PTX of the newest arch NVRTC
    knows, which an older-or-equal driver can JIT."""
    archs = supported_archs()
    if arch in archs:
        return f"sm_{arch}", True
    older = [a for a in archs if a <= arch]
    if not older:
        raise NVRTCError(f"NVRTC {nvrtc_version()} cannot target compute capability {arch}")
    return f"compute_{max(older)}", False


def target_arch(arch: int) -> int:
    """The compute capability the code :func:`compile_cubin` makes for a GPU
    of compute capability ``arch`` is compiled for (older when this NVRTC
    does not know the GPU and makes PTX)."""
    target, _ = target_for(arch)
    return int(target.split("_")[1])


def compile_cubin(source: str, name: str = "kernel.cu", options=(), arch: int = 90) -> bytes:
    """Compile ``source`` for compute capability ``arch`` (e.g. 90) and return the
    CUBIN image (PTX only when the GPU is newer than NVRTC knows).

    Results are cached in memory and under :func:`cache_dir`.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    options = tuple(str(o) for o in options)
    key = cache_key(source, options, arch)
    with _lock:
        hit = _memory_cache.get(key)
        if hit is not None:
            _stats["memory_hits"] += 1
            return hit
    path = _path_of(key)
    try:
        with open(path, "rb") as f:
            image = f.read()
        if image:
            with _lock:
                _memory_cache[key] = image
                _stats["disk_hits"] += 1
            logger.debug("kernel %s for sm_%d loaded from the cache %s",
                         _kernel_name(name), arch, path)
            return image
    except OSError:
        pass
    start = time.perf_counter()
    image = _compile(source, name, options, arch)
    seconds = time.perf_counter() - start
    target, cubin = target_for(arch)
    logger.info("compiled kernel %s for %s%s with NVRTC %s in %.1f ms", _kernel_name(name), target,
                "" if cubin else " (PTX: this NVRTC does not know the GPU)",
                ".".join(map(str, nvrtc_version())), seconds * 1e3)
    with _lock:
        _memory_cache[key] = image
        _stats["compiled"] += 1
        listeners = list(_listeners)
    _write_atomic(path, image)
    for listener in listeners:
        listener(_kernel_name(name), target, seconds)
    return image


def _path_of(key):
    """The on-disk cache file of the image with cache key ``key``."""
    return os.path.join(cache_dir(), key[:2], key + ".bin")


def is_cached(source: str, options=(), arch: int = 90) -> bool:
    """Whether :func:`compile_cubin` would find ``source`` compiled with
    ``options`` for ``arch`` (in memory or on disk) rather than run NVRTC."""
    key = cache_key(source, tuple(str(o) for o in options), arch)
    with _lock:
        if key in _memory_cache:
            return True
    try:
        return os.path.getsize(_path_of(key)) > 0
    except OSError:
        return False


def add_compile_listener(listener) -> None:
    """Call ``listener(kernel, target, seconds)`` after each NVRTC compilation
    (in the compiling thread) until :func:`remove_compile_listener`."""
    with _lock:
        _listeners.append(listener)


def remove_compile_listener(listener) -> None:
    """Stop calling ``listener`` (added by :func:`add_compile_listener`)."""
    with _lock:
        try:
            _listeners.remove(listener)
        except ValueError:
            pass


def _kernel_name(name):
    return name[:-3] if name.endswith(".cu") else name


def _compile(source, name, options, arch):
    nvrtc = _nvrtc()
    nvrtc_version()  # a clear error if the library is missing
    target, cubin = target_for(arch)
    opts = [f"--gpu-architecture={target}", "-std=c++17"] + list(options)
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _check(res, f"compiling {name} for {target}", prog)
        if cubin:
            err, n = nvrtc.nvrtcGetCUBINSize(prog)
            _check(err, "nvrtcGetCUBINSize")
            buf = b" " * n
            _check(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        else:
            err, n = nvrtc.nvrtcGetPTXSize(prog)
            _check(err, "nvrtcGetPTXSize")
            buf = b" " * n
            _check(nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _write_atomic(path, data):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass   # a read-only or full cache only costs a recompile next time


def cache_stats():
    """Counts of compilations and cache hits since start-up."""
    with _lock:
        return dict(_stats)


def clear_memory_cache():
    with _lock:
        _memory_cache.clear()


def _cache_files(root):
    """The files tensorplay wrote under ``root``: ``xx/<sha256>.bin`` images and
    temporary files a crash left behind."""
    try:
        subdirs = os.listdir(root)
    except OSError:
        return
    for sub in subdirs:
        d = os.path.join(root, sub)
        if len(sub) != 2 or not os.path.isdir(d):
            continue
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            if (n.endswith(".bin") and len(n) == 68 and n.startswith(sub)) or n.endswith(".tmp"):
                yield os.path.join(d, n)


def kernel_cache_dir() -> str:
    """Return the folder holding the compiled kernels (CUBIN).

    ``$TENSORPLAY_CACHE_DIR/kernels``, else ``$XDG_CACHE_HOME/tensorplay/kernels``,
    else ``~/.cache/tensorplay/kernels``; read from the environment at each call.
    """
    return cache_dir()


def kernel_cache_info() -> dict[str, Any]:
    """Return the kernel cache's state: ``path`` (:func:`kernel_cache_dir`),
    ``files`` and ``bytes`` on disk, and this process's counts of NVRTC
    compilations (``compiled``) and cache hits (``memory_hits``, ``disk_hits``)."""
    root = cache_dir()
    files = size = 0
    for f in _cache_files(root):
        try:
            size += os.path.getsize(f)
            files += 1
        except OSError:
            pass
    return {"path": root, "files": files, "bytes": size, **cache_stats()}


def clear_kernel_cache() -> dict[str, Any]:
    """Delete the compiled kernels on disk and in memory, so the next use of
    each op compiles again; return the ``path``, ``files`` and ``bytes`` removed.

    Only the files tensorplay writes are removed (then the empty folders), so
    a cache folder shared with other files is safe to clear. Kernels already
    loaded into a device keep working; works without a GPU.
    """
    root = cache_dir()
    files = size = 0
    for f in list(_cache_files(root)):
        try:
            n = os.path.getsize(f)
            os.remove(f)
        except OSError:
            continue
        files += 1
        size += n
    for sub in (os.listdir(root) if os.path.isdir(root) else ()):
        try:
            os.rmdir(os.path.join(root, sub))    # only when empty
        except OSError:
            pass
    try:
        os.rmdir(root)
    except OSError:
        pass
    clear_memory_cache()
    logger.debug("cleared the kernel cache %s: %d files, %d bytes", root, files, size)
    return {"path": root, "files": files, "bytes": size}
