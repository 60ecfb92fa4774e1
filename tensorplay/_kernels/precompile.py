# SPDX-License-Identifier: Apache-2.0
"""Compile kernels ahead of their first use, and show compilations as they run.

:func:`compile_kernels` compiles many :class:`~tensorplay._kernels.cache.KernelSpec`
for some architectures into the on-disk cache, in parallel threads (NVRTC is
thread-safe and releases the GIL), with a progress display;
``tensorplay.cuda.precompile`` (``tensorplay._graph.kernel_catalog``) feeds it
the kernels of named ops. :func:`compile_progress` shows the compilations
that ordinary work triggers on first use.

The display is a tqdm bar on stderr when tqdm is installed and stderr is a
terminal (or when asked for with ``progress=True``), else lines at INFO on
the ``tensorplay.nvrtc`` logger, which also logs each compilation.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from tensorplay._driver.context import CudaUnavailableError, device_count, is_available, unavailable_reason
from tensorplay._kernels import cache, nvrtc

__all__ = ["compile_kernels", "compile_progress", "resolve_archs", "valid_archs", "check_progress", "check_workers",
           "default_workers"]

logger = nvrtc.logger

# Progress log lines (without tqdm) per compile_kernels call: about this many.
LOG_LINES = 10


def default_workers() -> int:
    """Threads compiling at once by default: one per core, at most 8."""
    return min(8, os.cpu_count() or 1)


# The forms of ``arch`` that precompile (and resolve_archs) accept, for messages.
ARCH_FORMS = "an int such as 90 (compute capability 9.0), a string such as 'sm_90' or '90', or a list of them"


def valid_archs() -> list[int]:
    """The compute capabilities an explicit ``arch`` may name: those this
    NVRTC compiles CUBIN for (``nvrtcGetSupportedArchs``)."""
    return sorted(nvrtc.supported_archs())


def _targets(valid: list[int]) -> str:
    return f"NVRTC {'.'.join(map(str, nvrtc.nvrtc_version()))} targets {', '.join(map(str, valid))}"


def _one_arch(a: object, what: str, valid: list[int]) -> int:
    """One ``arch`` item as an int, or a TypeError/ValueError naming the valid targets."""
    if isinstance(a, str):
        m = re.fullmatch(r"(?:sm_)?([0-9]+)", a.strip())
        if m is None:
            raise ValueError(f"{what}: arch {a!r} is not an architecture; arch must be {ARCH_FORMS}. "
                             f"{_targets(valid)}")
        value = int(m.group(1))
    elif isinstance(a, bool) or not isinstance(a, numbers.Integral):
        raise TypeError(f"{what}: arch must be {ARCH_FORMS}, got {a!r} ({type(a).__name__}). {_targets(valid)}")
    else:
        value = int(a)
    if value not in valid:
        hint = f" (compute capability {value}.0 is arch={value}0)" if 0 < value < 10 else ""
        raise ValueError(f"{what}: cannot compile for arch={a!r}{hint}: {_targets(valid)}")
    return value


def resolve_archs(arch: int | str | Iterable[int | str] | None, what: str = "precompile") -> list[int]:
    """The compute capabilities to compile for, as sorted distinct ints (90 for 9.0).

    ``arch`` None means each visible GPU's (CudaUnavailableError without
    one: NVRTC needs no GPU, but then the architecture must be named; a GPU
    newer than this NVRTC gets PTX, as :func:`~tensorplay._kernels.nvrtc.target_for`
    says). Otherwise one rule: an int (90), a string ``"sm_90"`` or ``"90"``,
    or a list (any iterable but a string) of them, each one of
    :func:`valid_archs`; anything else is a TypeError (a float, bytes, a
    nested list) or a ValueError (an empty list, an architecture NVRTC does
    not compile for, a string of another form), naming the valid targets.
    """
    if arch is None:
        if not is_available():
            raise CudaUnavailableError(
                f"{what}: no GPU to take the architecture from ({unavailable_reason()}); NVRTC needs no GPU, "
                f"so pass the compute capability to compile for, e.g. arch=90 (H100, H200), 80 (A100), "
                f"89 (L4, L40, RTX 40xx) or several: arch=(80, 90)")
        return sorted({cache.device_arch(d) for d in range(device_count())})
    valid = valid_archs()
    if isinstance(arch, (str, numbers.Integral)):
        items: list[object] = [arch]
    elif isinstance(arch, (bytes, bytearray, memoryview)) or not isinstance(arch, Iterable):
        raise TypeError(f"{what}: arch must be {ARCH_FORMS}, got {arch!r} ({type(arch).__name__}). "
                        f"{_targets(valid)}")
    else:
        items = list(arch)
        if not items:
            raise ValueError(f"{what}: arch is empty; pass a compute capability such as 90, or None for the "
                             f"GPUs'")
    return sorted({_one_arch(a, what, valid) for a in items})


def check_progress(progress: bool | None, what: str = "precompile") -> None:
    """Refuse a ``progress`` other than True, False or None."""
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"{what}: progress must be True, False or None, got {progress!r}")


def _tqdm(progress: bool | None):
    """tqdm's class when ``progress`` asks for a bar (None: stderr is a terminal), else None."""
    if progress is False or (progress is None and not _stderr_is_terminal()):
        return None
    try:
        from tqdm import tqdm  # type: ignore[import-untyped, import-not-found, unused-ignore]  # optional: the display only
    except ImportError:
        return None
    return tqdm


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):     # replaced or closed
        return False


class _Progress:
    """``done`` out of ``total`` kernels: a tqdm bar, or an INFO line every
    ``total / LOG_LINES`` kernels, or nothing (``progress=False``); thread-safe."""

    def __init__(self, total: int, what: str, progress: bool | None):
        self.total, self.what, self.done = total, what, 0
        self.quiet = progress is False
        self.start = time.perf_counter()
        self.step = max(1, -(-total // LOG_LINES))
        self.lock = threading.Lock()
        tqdm = _tqdm(progress)
        self.bar = tqdm(total=total, desc=what, unit=" kernels", file=sys.stderr) if tqdm and total else None

    def update(self) -> None:
        with self.lock:
            self.done += 1
            if self.bar is not None:
                self.bar.update(1)
            elif not self.quiet and (self.done % self.step == 0 or self.done == self.total):
                logger.info("%s: %d/%d kernels compiled (%.1f s)", self.what, self.done, self.total,
                            time.perf_counter() - self.start)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def check_workers(workers: int | None, what: str = "precompile") -> int:
    """``workers`` checked (a positive int), None as :func:`default_workers`."""
    if workers is None:
        return default_workers()
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"{what}: workers must be a positive int or None, got {workers!r}")
    return workers


def compile_kernels(specs: Iterable[cache.KernelSpec], archs: list[int], workers: int | None = None,
                    progress: bool | None = None, what: str = "precompile",
                    start: float | None = None) -> dict[str, Any]:
    """Compile each of ``specs`` for each of ``archs`` into the kernel cache.

    Kernels already cached (in memory or on disk) are counted, not read.
    ``workers`` threads compile at once (:func:`check_workers`);
    ``progress`` as :func:`compile_progress`. The first compilation error
    stops the rest and is raised. Returns ``kernels`` (distinct kernels
    times architectures), ``compiled``, ``cached``, ``seconds`` (since
    ``start``, a ``time.perf_counter()``, default now), ``archs`` and the
    cache ``path``.
    """
    workers = check_workers(workers, what)
    check_progress(progress, what)
    if start is None:
        start = time.perf_counter()
    specs = list(dict.fromkeys(specs))
    todo, cached = [], 0
    for arch in archs:
        for spec in specs:
            if nvrtc.is_cached(spec.source, spec.options, arch):
                cached += 1
            else:
                todo.append((spec, arch))
    shown = _Progress(len(todo), what, progress)

    def one(job: tuple[cache.KernelSpec, int]) -> None:
        spec, arch = job
        nvrtc.compile_cubin(spec.source, spec.name, spec.options, arch)
        shown.update()
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo))), thread_name_prefix="tensorplay-nvrtc")
    try:
        futures = [pool.submit(one, job) for job in todo]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in done:
            f.result()                  # the first error, raised here
    finally:
        # on an error or an interrupt, the kernels not started are dropped
        pool.shutdown(wait=True, cancel_futures=True)
        shown.close()
    result = {"kernels": len(specs) * len(archs), "compiled": len(todo), "cached": cached,
              "seconds": time.perf_counter() - start, "archs": list(archs), "path": nvrtc.cache_dir()}
    if progress is not False:
        logger.info("%s: %d kernels for sm_%s: %d compiled, %d already cached, in %.1f s (%s)", what,
                    result["kernels"], "/sm_".join(map(str, archs)), result["compiled"], cached,
                    result["seconds"], result["path"])
    return result


def compile_progress(progress: bool | None = None) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """Show the kernels NVRTC compiles while the block runs.

    The first use of each op's kernel for a dtype compiles it (NVRTC, tens
    of milliseconds each), so a model's first step can spend seconds
    compiling with nothing to show; a block inside this context shows a
    running count of the compilations (in any thread) as they happen.
    Kernels found in the cache are not counted: they load in microseconds.

    Parameters
    ----------
    progress : bool or None, optional
        None (the default): a tqdm counter on stderr when tqdm is installed
        and stderr is a terminal, else INFO lines on the
        ``tensorplay.nvrtc`` logger (one when the first kernel compiles, one
        at the end; the logger also has a line per kernel). True: the tqdm
        counter even when stderr is not a terminal. False: no display, only
        the counts.

    Yields
    ------
    dict
        ``compiled`` (kernels compiled so far) and ``seconds`` (NVRTC time
        spent on them), updated as the block runs.

    See Also
    --------
    precompile : compile the kernels of named ops ahead of time.

    Examples
    --------
    >>> import logging
    >>> logging.basicConfig(level=logging.INFO)   # doctest: +SKIP
    >>> with tp.cuda.compile_progress() as counts:    # doctest: +SKIP
    ...     model(x)
    >>> counts["compiled"]                         # doctest: +SKIP
    12
    """
    check_progress(progress, "compile_progress")
    return _compile_progress(progress)


@contextlib.contextmanager
def _compile_progress(progress: bool | None) -> Iterator[dict[str, Any]]:
    counts: dict[str, Any] = {"compiled": 0, "seconds": 0.0}
    lock = threading.Lock()
    tqdm = _tqdm(progress)
    bar: list[Any] = []

    def compiled(kernel: str, target: str, seconds: float) -> None:
        with lock:
            counts["compiled"] += 1
            counts["seconds"] += seconds
            if tqdm is not None:
                if not bar:
                    bar.append(tqdm(desc="compiling kernels", unit=" kernels", file=sys.stderr))
                bar[0].set_postfix_str(kernel, refresh=False)
                bar[0].update(1)
            elif progress is not False and counts["compiled"] == 1:
                logger.info("compiling kernels on first use (%s first); tensorplay.cuda.precompile() "
                            "compiles them ahead", kernel)

    nvrtc.add_compile_listener(compiled)
    try:
        yield counts
    finally:
        nvrtc.remove_compile_listener(compiled)
        with lock:
            if bar:
                bar[0].close()
            if progress is not False and counts["compiled"] and tqdm is None:
                logger.info("compiled %d kernels on first use (%.1f s of NVRTC)", counts["compiled"],
                            counts["seconds"])
