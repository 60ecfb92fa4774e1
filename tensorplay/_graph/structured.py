# SPDX-License-Identifier: Apache-2.0
"""The structured form of conditional nodes: context managers over
``CUDAGraph``'s begin/end calls, so that an unbalanced begin/end cannot be
written.

``with g.if_(pred):``, ``with g.while_(pred):``: one body. ``with
g.if_else(pred) as (then, otherwise):`` and ``with g.switch(index, n) as
cases:`` open a node with several bodies; each body is its own ``with``
block inside (``with then:``, ``with otherwise:``, ``with cases[k]:``), in
branch order, each at most once, and the outer block closes the node. The
outer block owning the node is what makes the pairing impossible to get
wrong: an ``else_()`` standing after an ``if_`` block would need the node to
stay open between two blocks, with nothing to close it when the else never
comes. Work written inside the outer block but outside every branch block
would run in no branch: it is refused (and the capture discarded) when the
next branch begins or the node closes.

An exception inside any block ends and discards the whole capture, as an
exception inside ``with tensorplay.cuda.graph(g):`` does; the graph is left
reset and reusable.

The managers only call the graph's methods (``begin_capture_to_*``,
``end_capture_to_conditional_node``, ``_begin_node``, ``_begin_branch``,
``_end_branch``, ``_innermost_conditional``, ``reset``), so they are tested
without a GPU on a stand-in graph.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from tensorplay._graph.conditionals import IF_NODE, KIND_NAMES, SWITCH_NODE
from tensorplay._graph.foreign import explain_capture_error

__all__ = ["Body", "Branch", "Cases", "IfElse", "Switch"]


def _abort_on_error(graph: Any, exc_type: type[BaseException] | None) -> bool:
    """Discard ``graph``'s capture when a block raised; True if it did."""
    if exc_type is None:
        return False
    if graph.is_capturing:
        graph.reset()
    return True


def _leave(graph: Any, exc_type: type[BaseException] | None, finish: Any,
           exc: BaseException | None = None) -> None:
    """A block's exit: discard the capture if the block raised (raising a
    clearer error for another library's failure), else ``finish()`` (and
    discard the capture if that raises)."""
    # asked before the abort closes the bodies: NCCL's advice differs inside one
    in_body = exc_type is not None and getattr(graph, "conditional_depth", 0) > 0
    if _abort_on_error(graph, exc_type):
        better = explain_capture_error(exc, in_body) if exc is not None else None
        if better is not None:
            raise better from exc
        return
    try:
        finish()
    except BaseException as failed:
        _abort_on_error(graph, RuntimeError)
        better = explain_capture_error(failed, True)     # closing a body failed
        if better is not None:
            raise better from failed
        raise


class Body:
    """``with g.if_(pred):`` / ``with g.while_(pred):``: a one-body node."""

    def __init__(self, graph: Any, kind: int, pred: Any) -> None:
        self._graph = graph
        self._kind = kind
        self._pred = pred

    def __enter__(self) -> None:
        if self._kind == IF_NODE:
            self._graph.begin_capture_to_if_node(self._pred)
        else:
            self._graph.begin_capture_to_while_node(self._pred)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _leave(self._graph, exc_type, self._graph.end_capture_to_conditional_node, exc)


class Branch:
    """One body of an IF/ELSE or SWITCH node: ``with then:``, ``with cases[k]:``."""

    def __init__(self, graph: Any, kind: int, index: int, node: int, what: str) -> None:
        self._graph = graph
        self._kind = kind
        self._index = index
        self._node = node
        self._what = what

    @property
    def index(self) -> int:
        """The branch's body index: 0 then / 1 else, or the SWITCH case."""
        return self._index

    def __enter__(self) -> None:
        inner = self._graph._innermost_conditional
        if inner is None or inner[3] != self._node:
            raise RuntimeError(f"with {self._what}: its node is not the innermost open conditional node "
                               f"(a branch block goes directly inside its node's with block)")
        self._graph._begin_branch(self._kind, self._index, f"with {self._what}")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _leave(self._graph, exc_type, self._graph._end_branch, exc)

    def __repr__(self) -> str:
        return f"<{self._what} branch of a {KIND_NAMES[self._kind].upper()} node>"


class _Node:
    """An outer block that opens a node with no branch open and closes it."""

    _kind = IF_NODE

    def __init__(self, graph: Any, pred: Any, num_bodies: int) -> None:
        self._graph = graph
        self._pred = pred
        self._num_bodies = num_bodies
        self._node = 0

    def _open(self) -> None:
        self._graph._begin_node(self._kind, self._pred, self._num_bodies)
        inner = self._graph._innermost_conditional
        self._node = inner[3]

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _leave(self._graph, exc_type, self._graph.end_capture_to_conditional_node, exc)


class IfElse(_Node):
    """``with g.if_else(pred) as (then, otherwise):`` one IF node with an else body."""

    def __init__(self, graph: Any, pred: Any) -> None:
        super().__init__(graph, pred, 2)

    def __enter__(self) -> tuple[Branch, Branch]:
        self._open()
        return (Branch(self._graph, IF_NODE, 0, self._node, "then"),
                Branch(self._graph, IF_NODE, 1, self._node, "otherwise"))


class Cases:
    """The cases of a ``with g.switch(index, n) as cases:`` block: ``cases[k]``."""

    def __init__(self, graph: Any, node: int, num_cases: int) -> None:
        self._graph = graph
        self._node = node
        self._num_cases = num_cases

    def __len__(self) -> int:
        return self._num_cases

    def __getitem__(self, k: int) -> Branch:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise TypeError(f"cases[k]: k must be an int, got {type(k).__name__}")
        if not 0 <= k < self._num_cases:
            raise IndexError(f"cases[{k}]: this SWITCH has cases 0 to {self._num_cases - 1}")
        return Branch(self._graph, SWITCH_NODE, int(k), self._node, f"cases[{int(k)}]")

    def __iter__(self) -> Iterator[Branch]:
        return (self[k] for k in range(self._num_cases))


class Switch(_Node):
    """``with g.switch(index, n) as cases:`` one SWITCH node of ``n`` cases."""

    _kind = SWITCH_NODE

    def __enter__(self) -> Cases:
        self._open()
        return Cases(self._graph, self._node, self._num_bodies)
