# SPDX-License-Identifier: Apache-2.0
"""NCCL collectives in tensorplay graphs: what NCCL's rules ask of a
capture, known in one place.

A ``torch.distributed`` NCCL collective (or one through
``cupy.cuda.nccl``) queued inside ``with tp.cuda.graph(g):`` is captured
like any other work on the capture stream. NCCL adds rules of its own:

- every rank captures the same graphs, with the same collectives in the
  same order, and replays them together;
- a communicator's first collective sets up connections lazily, which
  cannot run inside a capture: run one collective eagerly before capturing
  (:func:`check_collectives_capturable` says whether a group has);
- with ``NCCL_GRAPH_MIXING_SUPPORT`` on (NCCL's default), a captured
  collective records and waits on events, and conditional bodies refuse
  event nodes: inside an IF, WHILE or SWITCH body it needs
  ``NCCL_GRAPH_MIXING_SUPPORT=0`` set before NCCL initialises;
- with ``NCCL_GRAPH_REGISTER`` on (NCCL's default), NCCL registers the
  buffers a captured collective uses for the graph's life; new physical
  pages mapped at the same addresses (a sleeping pool's ``wake``) leave that
  registration stale and a replay hangs, so :func:`check_sleep` refuses to
  sleep a pool whose graphs hold NCCL kernels.

The capture code calls :func:`note_capture` at each capture's end (a weak
reference per pool, so sleep can look for NCCL's kernels), and the error
paths of ``tensorplay._graph.foreign`` and ``structured`` call
:func:`explain_collective_error`.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import weakref
from typing import Any

from tensorplay._driver.context import CudaError
from tensorplay._memory.allocator import is_sleepable

__all__ = ["CollectiveError", "NCCL_KERNEL_PREFIXES", "check_collectives_capturable", "check_sleep",
           "collective_kernels", "explain_collective_error", "graphs_with_collectives", "nccl_setting",
           "note_capture"]


class CollectiveError(RuntimeError):
    """An NCCL collective meets a rule of NCCL's that a capture, a
    conditional body or a sleeping pool cannot keep; the message says what
    to do."""


CollectiveError.__module__ = "tensorplay.cuda"     # its public path, in tracebacks and reprs

#: how the names of NCCL's device kernels begin (``describe()`` gives node names)
NCCL_KERNEL_PREFIXES = ("ncclDevKernel", "ncclKernel")

_DEFAULTS = {"NCCL_GRAPH_MIXING_SUPPORT": "1", "NCCL_GRAPH_REGISTER": "1"}


def nccl_setting(name: str) -> str:
    """How the environment sets NCCL variable ``name`` now, as a phrase for
    an error: ``"NCCL_GRAPH_REGISTER=1"`` or ``"NCCL_GRAPH_REGISTER is not
    set (NCCL's default: 1)"``."""
    value = os.environ.get(name)
    if value is None:
        default = _DEFAULTS.get(name)
        return f"{name} is not set" + (f" (NCCL's default: {default})" if default else "")
    return f"{name}={value}"


def _setting_is_off(name: str) -> bool:
    return os.environ.get(name, _DEFAULTS.get(name, "")).strip() == "0"


# ------------------------------------------------------------------ NCCL kernels in graphs

def collective_kernels(description: dict[str, Any]) -> list[str]:
    """The names of NCCL's kernels in a ``describe()`` result, conditional
    bodies included."""
    found: list[str] = []
    for node in description.get("nodes", ()):
        name = node.get("name") or ""
        if name.startswith(NCCL_KERNEL_PREFIXES):
            found.append(name)
        for body in node.get("bodies", ()) or ():
            found.extend(collective_kernels(body))
    return found


# pool id -> the graphs that captured into it (weakly: a dropped graph goes)
_by_pool: dict[int, weakref.WeakSet[Any]] = {}
_lock = threading.Lock()


def note_capture(graph: Any) -> None:
    """Remember that ``graph`` captured into its pool (at each capture's end);
    only sleepable pools' graphs, the ones sleep asks about."""
    pid = graph.pool_id
    if pid is None or not is_sleepable(pid):
        return
    with _lock:
        graphs = _by_pool.get(pid)
        if graphs is None:
            if len(_by_pool) >= 64:          # pools whose graphs are all gone: forgotten
                for key in [k for k, v in _by_pool.items() if not v]:
                    del _by_pool[key]
            graphs = _by_pool[pid] = weakref.WeakSet()
        graphs.add(graph)


def graphs_with_collectives(pool_id: int) -> list[tuple[Any, list[str]]]:
    """(graph, NCCL kernel names) for each live graph of pool ``pool_id``
    whose capture holds NCCL kernels."""
    with _lock:
        graphs = list(_by_pool.get(pool_id, ()))
    found = []
    for g in graphs:
        # a graph reset, or captured again into another pool, no longer holds this pool's memory
        if not g.is_instantiated or g.pool_id != pool_id:
            continue
        names = collective_kernels(g.describe())
        if names:
            found.append((g, names))
    return found


def check_sleep(pool_id: int, allow_collectives: bool = False) -> None:
    """Refuse to sleep pool ``pool_id`` while its graphs hold captured NCCL
    collectives that NCCL registered for the graphs' life (see the module);
    ``allow_collectives=True`` skips the check."""
    if allow_collectives or _setting_is_off("NCCL_GRAPH_REGISTER"):
        return
    found = graphs_with_collectives(pool_id)
    if not found:
        return
    names = sorted({n for _, ns in found for n in ns})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise CollectiveError(
        f"sleep: {len(found)} graph(s) of pool {pool_id} hold captured NCCL collectives ({shown}). With "
        f"{nccl_setting('NCCL_GRAPH_REGISTER')}, NCCL registers the buffers a captured collective uses "
        f"for the graph's life; wake() maps new physical pages at the same addresses, which leaves that "
        f"registration stale, and the next replay hangs. Either set NCCL_GRAPH_REGISTER=0 in the "
        f"environment before NCCL initialises (before the process group's first collective), and sleep "
        f"is allowed; or reset() those graphs before sleeping and capture them again after wake(). "
        f"sleep(allow_collectives=True) skips this check. Sleep and wake on every rank together.")


# ------------------------------------------------------------------ process groups

def _torch_distributed() -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        raise CollectiveError("check_collectives_capturable: PyTorch is not imported; the check reads "
                              "torch.distributed process groups")
    # PyTorch's own subpackage, imported on demand (not a dependency of tensorplay)
    dist = importlib.import_module("torch.distributed")
    if not dist.is_available():
        raise CollectiveError("check_collectives_capturable: this PyTorch is built without torch.distributed")
    return dist


def _sequence_number(backend: Any) -> int | None:
    """How many collectives ``backend`` has issued (None if this PyTorch does not say)."""
    seq = getattr(backend, "_get_sequence_number_for_group", None)
    if seq is None:
        return None
    try:
        return int(seq())
    except Exception:
        return None


def _nccl_backend(dist: Any, group: Any, device: int) -> Any:
    torch = sys.modules["torch"]
    try:
        backend = group._get_backend(torch.device("cuda", device))
    except Exception:
        backend = None
    name = ""
    if backend is not None:
        try:
            name = str(backend.name())
        except Exception:
            name = type(backend).__name__
    if backend is None or "nccl" not in name.lower():
        try:
            what = dist.get_backend(group)
        except Exception:
            what = name or "none"
        raise CollectiveError(f"check_collectives_capturable: the process group has no NCCL backend for "
                              f"cuda:{device} (its backend: {what}); only NCCL collectives on CUDA tensors are "
                              f"captured into a CUDA graph")
    return backend


def check_collectives_capturable(group: Any = None, *, device: int | None = None,
                                 in_conditional_body: bool = False) -> None:
    """Check that NCCL collectives of ``group`` can be captured now.

    Raises :class:`CollectiveError`, saying what to do, when:

    - ``torch.distributed`` has no process group (``group`` None and no
      ``init_process_group``), or the group has no NCCL backend for the
      device;
    - the group has run no collective yet: its first one sets up NCCL's
      connections lazily, which cannot run inside a capture (run one
      collective eagerly before capturing);
    - ``in_conditional_body`` is True and ``NCCL_GRAPH_MIXING_SUPPORT`` is
      not ``0``: NCCL then adds event nodes, which IF, WHILE and SWITCH
      bodies refuse.

    Every rank must capture the same collectives in the same order; that
    cannot be checked from one process.

    Parameters
    ----------
    group : torch.distributed.ProcessGroup, optional
        Default: the default process group.
    device : int, optional
        The CUDA device the collectives run on; default PyTorch's current device.
    in_conditional_body : bool, optional
        Also check what collectives inside conditional bodies need.
    """
    dist = _torch_distributed()
    torch = sys.modules["torch"]
    if group is None:
        if not dist.is_initialized():
            raise CollectiveError("check_collectives_capturable: no process group: call "
                                  "torch.distributed.init_process_group('nccl', ...) first")
        group = dist.distributed_c10d._get_default_group()
    dev = torch.cuda.current_device() if device is None else int(device)
    backend = _nccl_backend(dist, group, dev)
    if _sequence_number(backend) == 0:
        raise CollectiveError(
            "check_collectives_capturable: the process group has run no collective yet: its first one sets "
            "up NCCL's connections lazily, which cannot run inside a capture. Run one collective eagerly "
            "before capturing (run the step you capture once eagerly, with the same collectives and sizes)")
    if in_conditional_body and not _setting_is_off("NCCL_GRAPH_MIXING_SUPPORT"):
        raise CollectiveError(_body_advice())


def _body_advice() -> str:
    return (f"NCCL's graph-mixing support ({nccl_setting('NCCL_GRAPH_MIXING_SUPPORT')}) makes a captured "
            f"collective record and wait on events, and IF, WHILE and SWITCH bodies refuse event nodes: set "
            f"NCCL_GRAPH_MIXING_SUPPORT=0 in the environment before NCCL initialises (before the first "
            f"communicator is made), or keep the collective outside the conditional body")


# ------------------------------------------------------------------ errors

def _is_nccl_error(exc: BaseException) -> bool:
    if type(exc).__name__ in ("DistBackendError", "NcclError"):
        return True
    return isinstance(exc, RuntimeError) and "nccl" in str(exc).lower()


def _unwarmed_default_group() -> bool:
    """True when the default process group's NCCL backend had issued at most
    one collective (the failed one): none ran eagerly before the capture."""
    dist = sys.modules.get("torch.distributed")
    torch = sys.modules.get("torch")
    if dist is None or torch is None:
        return False
    try:
        if not dist.is_initialized():
            return False
        group = dist.distributed_c10d._get_default_group()
        backend = group._get_backend(torch.device("cuda", torch.cuda.current_device()))
    except Exception:
        return False
    seq = _sequence_number(backend)
    return seq is not None and seq <= 1


def explain_collective_error(exc: BaseException, in_body: bool = False) -> BaseException | None:
    """A :class:`CollectiveError` explaining an NCCL failure inside a
    capture (``in_body``: inside a conditional body), or None when ``exc``
    is no NCCL error."""
    if isinstance(exc, CollectiveError):
        return None
    if not _is_nccl_error(exc):
        # NCCL may succeed where the capture does not: a first collective's
        # setup (cudaMalloc) invalidates a global-mode capture, which the
        # driver reports only at the capture's end
        if not (isinstance(exc, CudaError) and "CAPTURE" in exc.name and _unwarmed_default_group()):
            return None
    said = str(exc).strip().splitlines()
    nccl_said = said[0] if said else type(exc).__name__
    advice = []
    if _unwarmed_default_group():
        advice.append("the process group ran no collective before this capture: its first one sets up "
                      "NCCL's connections lazily, which cannot run inside a capture. Run one collective "
                      "eagerly before capturing (the step you capture, once, with the same collectives)")
    if in_body:
        if _setting_is_off("NCCL_GRAPH_MIXING_SUPPORT"):
            advice.append("NCCL_GRAPH_MIXING_SUPPORT=0 is set, so NCCL's event nodes are not the cause")
        else:
            advice.append(_body_advice())
    if not advice:
        advice.append("run the same collectives eagerly once before capturing, capture the same graphs on "
                      "every rank, and use capture_error_mode='thread_local' when one process drives "
                      "several GPUs from several threads")
    where = "a conditional body" if in_body else "a tensorplay capture"
    return CollectiveError(f"an NCCL collective failed inside {where} (the capture was discarded): "
                           + "; ".join(advice) + f". NCCL's error: {nccl_said}")
