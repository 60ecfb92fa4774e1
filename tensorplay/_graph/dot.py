# SPDX-License-Identifier: Apache-2.0
"""DOT rendering of a captured graph's description (pure Python, no GPU);
published as ``tensorplay.cuda.graphs.to_dot`` and ``tensorplay.cuda.to_dot``.

A description is what ``CUDAGraph.describe()`` returns::

    {"nodes": [{"id": 0, "kind": "kernel", "name": "tp_add_float32", "attrs": {...}},
               {"id": 1, "kind": "conditional", "type": "while", "attrs": {...},
                "bodies": [<description with a "label">, ...]},
               ...],
     "edges": [[0, 1], ...],
     "programmatic_edges": [[0, 1], ...]}

A description annotated with a profile (``GraphProfile.annotate``, what
``describe(profile=...)`` returns) also has each node's ``"time"``: its
label gains the node's us per replay and share, its fill goes from white to
red with the share, and nodes on the critical path get a thick border.

Conditional bodies become clusters, nested as captured: the one body of an
IF or WHILE node is labelled with the node's type (``if`` / ``while``); the
bodies of an IF/ELSE or SWITCH node with their own labels (``then`` /
``else``, ``case 0`` ... ``case n-1``), which also mark the dashed edge from
the node to each. Programmatic edges (programmatic dependent launch) are
blue and labelled ``PDL``. Every label is escaped, so any kernel name yields
valid DOT.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

__all__ = ["to_dot", "demangle", "escape", "heat"]

_SHAPES = {"kernel": "box", "memcpy": "parallelogram", "memset": "parallelogram", "conditional": "diamond",
           "event_record": "cds", "wait_event": "cds", "mem_alloc": "folder", "mem_free": "folder",
           "empty": "point", "host": "box3d", "graph": "box3d"}


def escape(text) -> str:
    """Quote ``text`` as a DOT string (backslashes, quotes, newlines, control chars)."""
    out = []
    for ch in str(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ch == "\x7f":
            out.append(f"\\\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


@functools.lru_cache(maxsize=4096)
def demangle(name: str) -> str:
    """Demangle an Itanium C++ symbol with c++filt when present; other names as given."""
    if not name.startswith("_Z"):
        return name
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if tool is None:
        return name
    try:
        out = subprocess.run([tool, name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return name
    return out.stdout.strip() or name


def _fmt(v):
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_fmt(x) for x in v) + ")"
    return str(v)


def _label(node, detailed):
    kind = node.get("kind", "node")
    lines = [kind if kind != "conditional" else f"{node.get('type', 'conditional')} node"]
    if node.get("name"):
        lines.append(demangle(node["name"]))
    if detailed:
        for k, v in sorted(node.get("attrs", {}).items()):
            lines.append(f"{k}={_fmt(v)}")
    t = node.get("time")
    if t:
        lines.append(f"{t['total_us']:.1f} us ({t['share']:.0%})" +
                     (f" x{t['executions']:g}" if t.get("executions", 1) != 1 else ""))
        if t.get("iterations") is not None:
            lines.append(f"{t['iterations']:g} iterations, {t['per_iteration_us']:.1f} us each")
    return "\n".join(lines)


def heat(share: float) -> str:
    """The fill colour of a node taking ``share`` of the replay: white at 0, red at 1 (and above)."""
    level = int(round(255 * (1 - min(max(float(share), 0.0), 1.0))))
    return f"#ff{level:02x}{level:02x}"


def _style(node) -> str:
    t = node.get("time")
    if not t:
        return ""
    return f', style=filled, fillcolor="{heat(t["share"])}"' + (", penwidth=2.5" if t.get("critical") else "")


def _emit(desc, prefix, lines, indent, detailed, counter):
    ids = {}
    for node in desc.get("nodes", []):
        nid = f"{prefix}n{node['id']}"
        ids[node["id"]] = nid
        shape = _SHAPES.get(node.get("kind"), "box")
        lines.append(f'{indent}{escape(nid)} [label={escape(_label(node, detailed))}, shape={shape}{_style(node)}];')
        bodies = node.get("bodies", []) or []
        for b, body in enumerate(bodies):
            counter[0] += 1
            cluster = f"cluster_{counter[0]}"
            branch = body.get("label") if len(bodies) > 1 else None
            lines.append(f"{indent}subgraph {cluster} {{")
            label = branch if branch else body.get("label") if node.get("kind") == "graph" else node.get("type", "body")
            lines.append(f"{indent}  label={escape(label)}; style=rounded; color=gray40;")
            body_prefix = f"{prefix}n{node['id']}b{b}_"
            first = _emit(body, body_prefix, lines, indent + "  ", detailed, counter)
            if not first:   # an empty body still shows as a cluster
                lines.append(f'{indent}  {escape(body_prefix + "empty")} [label="(empty)", shape=plaintext];')
                first = [body_prefix + "empty"]
            lines.append(f"{indent}}}")
            edge_label = f", label={escape(branch)}" if branch else ""
            lines.append(f'{indent}{escape(nid)} -> {escape(first[0])} [lhead={cluster}, style=dashed{edge_label}];')
    programmatic = {tuple(e) for e in desc.get("programmatic_edges", [])}
    for a, b in desc.get("edges", []):
        if a in ids and b in ids:
            style = ' [label="PDL", color=blue, fontcolor=blue]' if (a, b) in programmatic else ""
            lines.append(f"{indent}{escape(ids[a])} -> {escape(ids[b])}{style};")
    return [ids[n["id"]] for n in desc.get("nodes", [])]


def to_dot(description: Mapping[str, Any], *, detailed: bool = False, title: str = "CUDA graph") -> str:
    """Render a graph description as Graphviz DOT source; no GPU needed.

    ``description`` is what :meth:`CUDAGraph.describe` returns, or the same
    shape built by hand or loaded from JSON: a dict with ``"nodes"`` (each
    with an ``"id"``, a ``"kind"``, for kernels a ``"name"``, for
    conditional nodes a ``"type"`` and their ``"bodies"``, descriptions of
    their own) and ``"edges"`` (``[from_id, to_id]`` pairs). This is what
    :meth:`CUDAGraph.debug_dump` writes; render it with Graphviz
    (``dot -Tsvg graph.dot -o graph.svg``).

    Parameters
    ----------
    description : dict
        The graph description.
    detailed : bool, optional
        Show each node's ``"attrs"`` (grid, block, sizes, ...) in its label.
    title : str, optional
        The picture's title.

    Returns
    -------
    str
        The DOT source: conditional bodies are nested clusters, the
        branches of an IF/ELSE and the cases of a SWITCH labelled, every
        label escaped.

    Raises
    ------
    TypeError
        If ``description`` is not a dict with ``"nodes"``.
    """
    desc = description
    if not isinstance(desc, Mapping) or "nodes" not in desc:
        raise TypeError(f"to_dot expects a graph description (a dict with 'nodes' and 'edges', as "
                        f"CUDAGraph.describe() returns), got {type(desc).__name__}")
    lines = ["digraph cudagraph {", "  compound=true; rankdir=TB;",
             f"  label={escape(title)}; labelloc=t;",
             '  node [fontname="monospace", fontsize=10];']
    _emit(desc, "", lines, "  ", detailed, [0])
    lines.append("}")
    return "\n".join(lines) + "\n"
