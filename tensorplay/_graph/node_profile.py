# SPDX-License-Identifier: Apache-2.0
"""Per-node GPU time of a graph's replays: ``CUDAGraph.profile_nodes()``.

Every node of a copy of the captured graph, at every depth, is put between
two one-thread kernels that read the GPU's global timer (see
``tensorplay._graph.instrument``: the copy is built node by node, its
conditional nodes with handles of their own, since the driver neither
clones a graph with conditional nodes nor instantiates one twice); the
copy's executable is replayed, never the user's, and the graph itself is
not touched. What a node's stamps read is its time (its own launch after the
node before it included, as in a replay) plus what the stamps add: the
*floor*, read on stamp pairs with nothing between them, is taken off every
node. Inside a child graph or a conditional body the profile's stamps also
run; what a stamp pair costs (read around an empty kernel) is taken off the
enclosing node's time for each pair that ran inside it.

Nothing here needs a GPU once a profile exists: :meth:`GraphProfile.to_dict`
and :meth:`GraphProfile.from_dict` store and load one, and
:meth:`GraphProfile.annotate` puts its times into a description for
:func:`tensorplay.cuda.to_dot`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tensorplay import _dtypes
from tensorplay._driver.stream import Event, stream_of, stream as use_stream
from tensorplay._graph import instrument, kernels
from tensorplay._graph.dot import demangle
from tensorplay._graph.registry import describe_open_captures, open_captures
from tensorplay._graph.streams import is_stream_capturing
from tensorplay._tensor.creation import zeros

__all__ = ["GraphProfile", "NodeTime", "profile_graph"]

Scope = tuple[int, ...]     # (node id, body index) pairs from the top graph: () is the graph itself


@dataclass(frozen=True)
class NodeTime:
    """One node's time in the replays of a profile.

    ``us`` is the median time of one execution and ``total_us`` the median,
    over replays, of the time of all its executions in a replay (both less
    the instrumentation's floor); ``raw_us`` is the median as the stamps
    read it. ``executions`` is how often the node ran per replay (0 for a
    body not taken; more than 1 in a WHILE body). ``share`` is ``total_us``
    over the graph's critical path. A WHILE node also has ``iterations``
    (per replay), ``per_iteration_us`` (``total_us`` over ``iterations``:
    one iteration as a replay pays it, the loop's own relaunch of its body
    included) and ``body_us`` (the body's own span, per iteration): what
    the loop adds per iteration is the difference.
    """
    scope: Scope
    id: int
    kind: str
    name: str | None
    us: float
    raw_us: float
    total_us: float
    executions: float
    share: float
    critical: bool = False
    iterations: float | None = None
    per_iteration_us: float | None = None
    body_us: float | None = None

    @property
    def label(self) -> str:
        """Where the node is (``3`` at the top, ``3/body/1`` in a body) and what it is."""
        where = "/".join(_scope_names(self.scope) + [str(self.id)])
        what = demangle(self.name) if self.name else self.kind
        return f"{where} {what}"


def _stored_node(n: Mapping[str, Any]) -> dict[str, Any]:
    """A stored NodeTime's fields; a profile stored before ``body_us`` gave
    a WHILE node's body span as ``per_iteration_us``."""
    n = {**n, "scope": tuple(n["scope"])}
    if "body_us" not in n and n.get("iterations"):
        n["body_us"] = n.get("per_iteration_us")
        n["per_iteration_us"] = n["total_us"] / n["iterations"]
    return n


def _scope_names(scope: Scope) -> list[str]:
    return [f"{scope[i]}.{scope[i + 1]}" for i in range(0, len(scope), 2)]


@dataclass
class GraphProfile:
    """The profile of a graph's replays (see :meth:`CUDAGraph.profile_nodes`).

    Attributes: ``nodes`` (a :class:`NodeTime` per node at every depth, in
    graph order), ``replays``; ``replay_us`` (median GPU time of a replay of
    the graph itself, CUDA events) and ``instrumented_us`` (of the
    instrumented executable, its own stamps); ``floor_us`` (what a pair of stamps
    reads with nothing between them, taken off every node) and
    ``floor_spread_us`` (its 10th to 90th percentile: a node shorter than
    that spread is within the noise); ``stamp_pair_us`` (what a pair of
    stamps costs a graph: taken off a node for each pair run inside it) and
    ``empty_kernel_us`` (what an empty kernel reads: the least a kernel node
    costs a replay); ``critical_path`` (ids of the top graph's nodes on its
    longest path by time) and ``critical_path_us``; ``programmatic_edges``
    (PDL edges whose next kernel the stamps make wait for the whole one
    before: each kernel is timed alone, without overlap); ``uninstrumented`` ((scope, id) of child
    graph and conditional nodes whose bodies were left unstamped, timed as a
    whole) and ``notes`` (why).
    """
    nodes: list[NodeTime]
    replays: int
    replay_us: float
    instrumented_us: float
    floor_us: float
    floor_spread_us: tuple[float, float]
    stamp_pair_us: float
    critical_path: list[int]
    critical_path_us: float
    programmatic_edges: int = 0
    uninstrumented: list[tuple[Scope, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def node(self, id: int, scope: Scope = ()) -> NodeTime:
        """The time of node ``id`` of ``scope`` (``()``: the top graph; ``(3, 0)``: body 0 of node 3)."""
        for n in self.nodes:
            if n.id == id and n.scope == tuple(scope):
                return n
        raise KeyError(f"no node {id} in scope {tuple(scope)}")

    def body(self, scope: Scope) -> list[NodeTime]:
        """The nodes of one scope, in graph order."""
        return [n for n in self.nodes if n.scope == tuple(scope)]

    def table(self, top: int | None = None) -> str:
        """The nodes by time, longest first, as text."""
        rows = sorted(self.nodes, key=lambda n: -n.total_us)[:top]
        lines = [f"replay {self.replay_us:.1f} us on the GPU ({self.replays} replays profiled; the instrumented "
                 f"copy {self.instrumented_us:.1f} us); critical path {self.critical_path_us:.1f} us; "
                 f"instrumentation floor {self.floor_us:.2f} us per node "
                 f"(p10-p90 {self.floor_spread_us[0]:.2f}-{self.floor_spread_us[1]:.2f}), taken off each node; "
                 f"an empty kernel reads {self.empty_kernel_us:.2f} us",
                 f"{'node':<44} {'runs':>6} {'us/run':>9} {'us/replay':>10} {'share':>7}"]
        for n in rows:
            label = n.label if len(n.label) <= 42 else n.label[:39] + "..."
            mark = "*" if n.critical else " "
            lines.append(f"{mark}{label:<43} {n.executions:6g} {n.us:9.2f} {n.total_us:10.2f} {n.share:7.1%}")
            if n.iterations is not None:
                each = n.per_iteration_us or 0.0
                text = f"{'':<4}{n.iterations:g} iterations, {each:.2f} us each"
                if n.body_us is not None:
                    text += (f" (the body {n.body_us:.2f} us, the loop's relaunch "
                             f"{max(each - n.body_us, 0.0):.2f} us)")
                lines.append(text)
        if self.programmatic_edges:
            lines.append(f"{self.programmatic_edges} PDL edge(s) made full edges by the stamps: each kernel is "
                         f"timed alone, so the sum of the times exceeds the replay's")
        lines += self.notes
        lines.append("* on the critical path")
        return "\n".join(lines)

    __str__ = table

    @property
    def empty_kernel_us(self) -> float:
        """What an empty kernel node reads: the least a kernel node costs a replay."""
        return self.stamp_pair_us - self.floor_us

    def to_dict(self) -> dict[str, Any]:
        """The profile as JSON-ready data; :meth:`from_dict` loads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GraphProfile:
        """A profile from :meth:`to_dict`'s data (for instance loaded from JSON)."""
        d = dict(data)
        d["nodes"] = [NodeTime(**_stored_node(n)) for n in d["nodes"]]
        d["floor_spread_us"] = tuple(d["floor_spread_us"])
        d["uninstrumented"] = [(tuple(s), i) for s, i in d.get("uninstrumented", [])]
        return cls(**d)

    def annotate(self, description: Mapping[str, Any]) -> dict[str, Any]:
        """``description`` (from :meth:`CUDAGraph.describe`) with each profiled
        node's ``"time"``: us, total_us, share, executions, critical, and for
        WHILE nodes iterations, per_iteration_us and body_us. DOT colours nodes by it."""
        times = {(n.scope, n.id): n for n in self.nodes}

        def walk(desc, scope):
            out = dict(desc)
            out["nodes"] = []
            for node in desc.get("nodes", []):
                node = dict(node)
                t = times.get((scope, node["id"]))
                if t is not None:
                    node["time"] = {k: getattr(t, k) for k in ("us", "total_us", "share", "executions", "critical")}
                    if t.iterations is not None:
                        node["time"].update(iterations=t.iterations, per_iteration_us=t.per_iteration_us,
                                            body_us=t.body_us)
                if node.get("bodies"):
                    node["bodies"] = [walk(b, scope + (node["id"], i)) for i, b in enumerate(node["bodies"])]
                out["nodes"].append(node)
            return out

        if not isinstance(description, Mapping) or "nodes" not in description:
            raise TypeError("annotate expects a graph description (a dict with 'nodes'), as describe() returns")
        return walk(description, ())


def _longest_path(ids: list[int], edges: list[list[int]], weight: Mapping[int, float]) -> tuple[list[int], float]:
    """The heaviest path through a DAG with node weights, and its weight."""
    succ: dict[int, list[int]] = {i: [] for i in ids}
    indeg = dict.fromkeys(ids, 0)
    for a, b in edges:
        if a in succ and b in indeg:
            succ[a].append(b)
            indeg[b] += 1
    order = [i for i in ids if indeg[i] == 0]
    for i in order:                      # Kahn's order, grown while walked
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                order.append(j)
    best = {i: weight.get(i, 0.0) for i in ids}
    prev: dict[int, int | None] = dict.fromkeys(ids)
    for i in order:
        for j in succ[i]:
            # the first predecessor always counts: a node of no time stays on the path
            if prev[j] is None or best[i] + weight.get(j, 0.0) > best[j]:
                best[j] = best[i] + weight.get(j, 0.0)
                prev[j] = i
    if not ids:
        return [], 0.0
    end = max(ids, key=lambda i: best[i])
    path = [end]
    step = prev[end]
    while step is not None:
        path.append(step)
        step = prev[step]
    return path[::-1], best[end]


def build_profile(description: Mapping[str, Any], slots: list[tuple[Scope, int]], records: np.ndarray,
                  floor_ns: np.ndarray, pair_ns: np.ndarray, replay_us: float, programmatic_edges: int = 0,
                  uninstrumented: list[tuple[Scope, int]] | None = None,
                  notes: list[str] | None = None) -> GraphProfile:
    """Turn the records read back from the instrumented executable into a profile.

    ``records`` has shape (replays, len(slots), 3 + cap): for each record its
    last start, sum of durations, count and first ``cap`` durations (ns), as
    the stamp kernels write them; ``floor_ns`` the durations stamp pairs read
    with nothing between them, ``pair_ns`` around an empty kernel. Pure
    NumPy: tested without a GPU."""
    records = np.asarray(records, dtype=np.uint64)
    replays = records.shape[0]
    cap = records.shape[2] - 3
    floor = float(np.median(floor_ns)) / 1e3 if len(floor_ns) else 0.0
    pair = float(np.median(pair_ns)) / 1e3 if len(pair_ns) else 0.0
    spread = ((float(np.percentile(floor_ns, 10)) / 1e3, float(np.percentile(floor_ns, 90)) / 1e3)
              if len(floor_ns) else (0.0, 0.0))
    counts = records[:, :, 2].astype(np.float64)
    sums = records[:, :, 1].astype(np.float64) / 1e3
    index = {slot: k for k, slot in enumerate(slots)}

    def samples(k):
        vals = [records[r, k, 3:3 + min(int(records[r, k, 2]), cap)] for r in range(replays)]
        vals = np.concatenate(vals) if vals else np.zeros(0, np.uint64)
        return vals.astype(np.float64) / 1e3

    def nested(scope):
        """Stamp pairs run per replay inside ``scope`` (a node's bodies), median over replays."""
        ks = [k for k, (s, _) in enumerate(slots) if s[:len(scope)] == scope]
        return counts[:, ks].sum(axis=1) if ks else np.zeros(replays)

    def node_desc(scope):
        desc = description
        for i in range(0, len(scope), 2):
            desc = desc["nodes"][scope[i]]["bodies"][scope[i + 1]]
        return desc

    raw: list[dict[str, Any]] = []
    for k, (scope, nid) in enumerate(slots):
        if nid < 0:
            continue
        node = node_desc(scope)["nodes"][nid]
        inner = nested(scope + (nid,))
        execs = float(np.median(counts[:, k]))
        per_exec_inner = float(np.median(inner / np.maximum(counts[:, k], 1)))
        s = samples(k)
        raw_us = float(np.median(s)) if len(s) else 0.0
        total = float(np.median(sums[:, k] - floor * counts[:, k] - pair * inner))
        entry = {"scope": scope, "id": nid, "kind": node.get("kind", "?"), "name": node.get("name"),
                 "raw_us": raw_us, "us": max(raw_us - floor - pair * per_exec_inner, 0.0),
                 "total_us": max(total, 0.0), "executions": execs}
        if node.get("kind") == "conditional" and node.get("type") == "while":
            span = index.get((scope + (nid, 0), -1))
            if span is not None:
                body_inner = nested(scope + (nid, 0)) - counts[:, span]
                per_iter = float(np.median(body_inner / np.maximum(counts[:, span], 1)))
                bs = samples(span)
                iterations = float(np.median(counts[:, span]))
                entry["iterations"] = iterations
                entry["per_iteration_us"] = entry["total_us"] / iterations if iterations else 0.0
                entry["body_us"] = max((float(np.median(bs)) if len(bs) else 0.0) - floor - pair * per_iter, 0.0)
        raw.append(entry)
    # the critical path of every scope; shares over the top graph's
    on_path: set[tuple[Scope, int]] = set()
    top_path: list[int] = []
    top_us = 0.0
    for scope in {e["scope"] for e in raw}:
        desc = node_desc(scope)
        weights = {e["id"]: e["total_us"] for e in raw if e["scope"] == scope}
        path, length = _longest_path([n["id"] for n in desc["nodes"]], desc.get("edges", []), weights)
        on_path.update((scope, i) for i in path)
        if scope == ():
            top_path, top_us = path, length
    top_span = index.get(((), -1))
    instrumented = float(np.median(sums[:, top_span])) if top_span is not None else 0.0
    nodes = [NodeTime(share=(e["total_us"] / top_us if top_us > 0 else 0.0),
                      critical=(e["scope"], e["id"]) in on_path, **e) for e in raw]
    return GraphProfile(nodes=nodes, replays=replays, replay_us=replay_us, instrumented_us=instrumented,
                        floor_us=floor, floor_spread_us=spread, stamp_pair_us=pair, critical_path=top_path, critical_path_us=top_us,
                        programmatic_edges=programmatic_edges, uninstrumented=list(uninstrumented or []),
                        notes=list(notes or []))


def profile_graph(graph, replays: int = 20, warmup: int = 2, samples: int = 256, stream=None) -> GraphProfile:
    """Profile ``graph``'s nodes (see :meth:`CUDAGraph.profile_nodes`)."""
    for name, value, low in (("replays", replays, 1), ("warmup", warmup, 0), ("samples", samples, 1)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"profile_nodes: {name} must be an int, got {type(value).__name__}")
        if value < low:
            raise ValueError(f"profile_nodes: {name} must be at least {low}, got {value}")
    handle, conditionals = graph._profile_source("profile_nodes")
    device = graph.device_index
    s = stream_of(stream, device)
    if s.device_index != device:
        raise ValueError(f"profile_nodes: the graph belongs to cuda:{device}, the stream to cuda:{s.device_index}")
    # the stamps, the instantiation and the launches would break a capture open on any stream
    if is_stream_capturing(s.handle, device) or open_captures():
        raise RuntimeError(f"profile_nodes: refused while capturing ({describe_open_captures() or 'the stream is'}"
                           f"); profile a graph outside any capture")
    description = graph._describe(False, "profile_nodes")
    start_fn, end_fn, empty_fn = kernels.profile_stamp_functions(device)
    n_slots = instrument.count_nodes(handle, conditionals)
    words = instrument.RECORD_HEAD + samples
    with use_stream(s):
        buf = zeros(n_slots * words, dtype=_dtypes.int64, device=f"cuda:{device}")
        copy = instrument.build_instrumented_copy(handle, conditionals, device, start_fn, end_fn,
                                                  buf.data_ptr(), samples, n_slots)
        used = len(copy.slots)
        records = []
        for r in range(warmup + replays):
            buf.zero_()
            copy.launch(s.handle)
            host = buf.cpu().numpy().view(np.uint64).reshape(n_slots, words)[:used]
            if r >= warmup:
                records.append(host)
        pairs = 64
        calib_words = instrument.RECORD_HEAD + pairs
        calib_buf = zeros(2 * calib_words, dtype=_dtypes.int64, device=f"cuda:{device}")
        calib = instrument.build_calibration(device, start_fn, end_fn, empty_fn, calib_buf.data_ptr(), pairs, pairs)
        floor, pair = [], []
        for r in range(4):
            calib_buf.zero_()
            calib.launch(s.handle)
            if r:
                host = calib_buf.cpu().numpy().view(np.uint64).reshape(2, calib_words)
                floor.append(host[0, instrument.RECORD_HEAD:])
                pair.append(host[1, instrument.RECORD_HEAD:])
        # the graph itself, timed with events: what the instrumentation adds is the difference
        times = []
        begin, end = Event(enable_timing=True), Event(enable_timing=True)
        for r in range(warmup + replays):
            begin.record(s)
            graph.replay(s)
            end.record(s)
            end.synchronize()
            if r >= warmup:
                times.append(begin.elapsed_time(end) * 1e3)
    slots, pdl_edges, missing, notes = (list(copy.slots), copy.programmatic_edges, list(copy.uninstrumented),
                                        list(copy.notes))
    del copy, calib
    return build_profile(description, slots, np.stack(records), np.concatenate(floor), np.concatenate(pair),
                         statistics.median(times), pdl_edges, missing, notes)
