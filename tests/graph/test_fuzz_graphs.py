# SPDX-License-Identifier: Apache-2.0
"""A hypothesis state machine driving CUDAGraph through random sequences of
valid and invalid calls (GPU), IF, IF/ELSE, WHILE and SWITCH nodes nested at
random. After every step: no capture left open outside
the model's capture, the current stream is the legacy stream whenever no
capture is open, and every invalid call raised a documented exception type."""

import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import tensorplay as tp
from tensorplay.cuda import CUDAGraph
from helpers import FUZZ_SCALE, count_fuzzed_call

pytestmark = pytest.mark.cuda

DOCUMENTED = (TypeError, ValueError, RuntimeError, IndexError, tp.cuda.CudaError)


def _bad_pred(kind):
    if kind == 0:
        return tp.zeros(1, dtype=tp.bool)                           # CPU
    if kind == 1:
        return tp.zeros(1, dtype=tp.int32, device="cuda")          # dtype
    if kind == 2:
        return tp.zeros(3, dtype=tp.bool, device="cuda")           # shape
    return "pred"                                                   # type


class GraphMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.g = CUDAGraph()
        self.other = CUDAGraph()
        self.state = "empty"           # empty | capturing | ready
        self.frames = []               # open nodes: {"kind", "n", "next" branch, "open" (a body is open)}
        self.x = tp.zeros(4, device="cuda")
        self.x.add_(1)
        self.pred = tp.ones(1, dtype=tp.bool, device="cuda")
        self.index = tp.zeros(1, dtype=tp.int32, device="cuda")
        self.static = [tp.zeros(4, device="cuda")]
        tp.cuda.synchronize()

    def expect_error(self, fn):
        try:
            fn()
        except DOCUMENTED:
            return
        except Exception as exc:           # an undocumented type is a failure
            raise AssertionError(f"undocumented exception {exc!r}") from exc
        raise AssertionError("an invalid call did not raise")

    @rule(mode=st.sampled_from(["global", "thread_local", "relaxed"]), share=st.booleans())
    def capture_begin(self, mode, share):
        if self.state == "capturing":
            self.expect_error(lambda: self.g.capture_begin(capture_error_mode=mode))
            return
        # from "ready" this is a re-capture: the executable is updated (or rebuilt) at capture_end
        self.g.capture_begin(capture_error_mode=mode, pool=tp.cuda.graph_pool_handle() if share else None)
        self.state = "capturing"

    @rule(bad=st.sampled_from(["strict", 3, None]))
    def capture_begin_bad_mode(self, bad):
        if bad is None:
            self.expect_error(lambda: CUDAGraph().capture_begin(stream=tp.cuda.default_stream()))
        else:
            self.expect_error(lambda: CUDAGraph().capture_begin(capture_error_mode=bad))

    @property
    def depth(self):
        return len(self.frames)

    def can_nest(self):
        """A new node (or work) may go where a body is open, or outside any node."""
        return self.state == "capturing" and (not self.frames or self.frames[-1]["open"])

    @precondition(lambda self: self.state != "capturing" or not self.frames or self.frames[-1]["open"])
    @rule()
    def work(self):
        self.x.add_(1)
        self.static[0].mul_(1)

    @rule()
    def capture_end(self):
        if self.state != "capturing":
            self.expect_error(self.g.capture_end)
            return
        if self.depth:
            self.expect_error(self.g.capture_end)     # bodies still open: discarded
            self.state, self.frames = "empty", []
            return
        self.g.capture_end()          # an empty capture only warns
        self.state = "ready"

    @rule(with_stream=st.booleans())
    def replay(self, with_stream):
        if self.state != "ready":
            self.expect_error(self.g.replay)
            return
        if with_stream:
            self.g.replay(tp.cuda.Stream())
        else:
            self.g.replay()

    @rule(valid=st.booleans())
    def stage_and_launch(self, valid):
        if self.state != "ready" or not valid:
            self.expect_error(lambda: self.g.stage_and_launch(self.static, [] if valid else ["x"]))
            return
        self.g.stage_and_launch(self.static, [tp.ones(4, device="cuda")])

    @rule()
    def instantiate(self):
        if self.state == "ready":
            self.g.instantiate()
        else:
            self.expect_error(self.g.instantiate)

    @rule()
    def reset(self):
        self.g.reset()
        self.state, self.frames = "empty", []

    @rule(kind=st.sampled_from(["if", "while"]))
    def begin_conditional(self, kind):
        fn = self.g.begin_capture_to_if_node if kind == "if" else self.g.begin_capture_to_while_node
        if not self.can_nest():
            self.expect_error(lambda: fn(self.pred))
            return
        if kind == "while":
            p = tp.zeros(1, dtype=tp.bool, device="cuda")     # a while body that never runs
            fn(p)
        else:
            fn(self.pred)
        self.frames.append({"kind": kind, "n": 1, "next": 1, "open": True})

    @rule()
    def begin_if_else(self):
        if not self.can_nest():
            self.expect_error(lambda: self.g.begin_capture_to_if_node(self.pred, with_else=True))
            return
        self.g.begin_capture_to_if_node(self.pred, with_else=True)
        self.frames.append({"kind": "if_else", "n": 2, "next": 1, "open": True})

    @rule()
    def begin_else(self):
        top = self.frames[-1] if self.frames else None
        if self.state != "capturing" or top is None or top["kind"] != "if_else" or top["next"] > 1:
            self.expect_error(self.g.begin_capture_to_else_branch)
            return
        self.g.begin_capture_to_else_branch()
        top["next"], top["open"] = 2, True

    @rule(n=st.integers(-1, 5))
    def begin_switch(self, n):
        if not self.can_nest() or n < 1:
            self.expect_error(lambda: self.g.begin_capture_to_switch_node(self.index, n))
            return
        self.g.begin_capture_to_switch_node(self.index, n)
        self.frames.append({"kind": "switch", "n": n, "next": 0, "open": False})

    @rule(k=st.integers(-1, 5))
    def begin_case(self, k):
        top = self.frames[-1] if self.frames else None
        if (self.state != "capturing" or top is None or top["kind"] != "switch"
                or not top["next"] <= k < top["n"]):
            self.expect_error(lambda: self.g.begin_capture_to_switch_case(k))
            return
        self.g.begin_capture_to_switch_case(k)
        top["next"], top["open"] = k + 1, True

    @precondition(lambda self: self.state != "capturing" or not self.frames or self.frames[-1]["open"])
    @rule(kind=st.integers(0, 3))
    def begin_conditional_bad_pred(self, kind):     # (its CUDA tensors are work: not between branches)
        self.expect_error(lambda: self.g.begin_capture_to_if_node(_bad_pred(kind)))

    @rule()
    def end_conditional(self):
        if self.state != "capturing" or self.depth == 0:
            self.expect_error(self.g.end_capture_to_conditional_node)
            return
        self.g.end_capture_to_conditional_node()
        self.frames.pop()

    @rule()
    def set_conditional(self):
        top = self.frames[-1] if self.frames else None
        if self.state != "capturing" or top is None or not top["open"]:
            self.expect_error(lambda: self.g.set_conditional_handle_for_current_node(self.pred))
            return
        if top["kind"] == "switch":              # a SWITCH takes an integer index, not a bool
            self.expect_error(lambda: self.g.set_conditional_handle_for_current_node(self.pred))
            self.g.set_conditional_handle_for_current_node(self.index)
            return
        self.g.set_conditional_handle_for_current_node(self.pred)

    @rule()
    def replay_other_graph(self):
        self.expect_error(self.other.replay)

    @precondition(lambda self: self.state == "ready")
    @rule()
    def debug_dump(self):
        with tempfile.TemporaryDirectory() as d:
            path = self.g.debug_dump(os.path.join(d, "g.dot"))
            assert open(path).read().startswith("digraph")

    @invariant()
    def consistent(self):
        count_fuzzed_call()
        assert self.g.is_capturing == (self.state == "capturing")
        if self.state != "capturing":
            assert not tp.cuda.is_current_stream_capturing()
            assert tp.cuda.current_stream().handle == 0
        assert self.g.is_instantiated == (self.state == "ready")
        assert self.g.conditional_depth == self.depth
        m = tp.cuda.memory_stats()
        assert 0 <= m["allocated_bytes.all.current"] <= m["reserved_bytes.all.current"]
        # active blocks: the live ones, and freed ones still held (record_stream
        # events not yet complete, blocks deferred by an open capture)
        live = m["allocation.all.allocated"] - m["allocation.all.freed"]
        assert live + m["held_blocks"] == m["active.all.current"]

    def teardown(self):
        self.g.reset()
        assert not tp.cuda.is_current_stream_capturing()


TestGraphMachine = GraphMachine.TestCase
TestGraphMachine.settings = settings(max_examples=int(60 * FUZZ_SCALE),
                                     stateful_step_count=40, deadline=None,
                                     suppress_health_check=list(HealthCheck))
