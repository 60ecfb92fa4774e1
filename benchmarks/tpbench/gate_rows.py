# SPDX-License-Identifier: Apache-2.0
"""The performance gate's rows, measured by quick subsets of the sections.

Each row is a ratio of two figures that one section measures in one run
(tensorplay against PyTorch, or against a floor such as the C loop of
cuGraphLaunch), so that it holds between machines where absolute times do
not. ``PROBES`` says which section code runs; ``ROWS`` (and, for the memory
section, every case it has) which two result rows make each ratio. The
probes of host times run ``rounds`` times, interleaved with each other, and
a row's ratio is the median of its rounds' ratios; the probes of GPU time
and memory run once (GPU time is the median of the section's own
interleaved rounds; reserved memory does not vary).

The extraction (``ratios_from``) is pure: it reads result rows as the
sections record them, so it also runs on the committed results files.
"""

from __future__ import annotations

import math
import statistics
import time

import tensorplay as tp
from tpbench import common
from tpbench import gaps
from tpbench.capture import capture_rows
from tpbench.host_calls import replay_rows
from tpbench.inputs import rebind_rows, staging_rows
from tpbench.memory import MEMORY_FIGURES, memory_rows
from tpbench.random_numbers import random_draw_rows
from tpbench.serving import serving_rows
from tpbench.serving_set import SET_PT, SET_TP, capture_set_rows
from tpbench.work import WORK_CASES, work_rows

HOST_CALLS, HOST_REPEATS, CAPTURE_REPEATS = 100, 15, 7
GAPS_ROUNDS = 5                 # gaps.py --quick's
GATE_WORK = ("matmul 4096^2 bfloat16", "add 64Mi float32, out=", "sum 64Mi float32")
GATE_DRAWS = ("randn 64Mi float32",)
MEMORY_ROW = "memory: {case}: {figure}"


class Probe:
    """One call of section code: ``run(torch)`` records its result rows in
    ``common.RESULTS`` (or, for gaps, ``gaps.RESULTS``); ``repeated``
    probes (host times) run in every round, the others in the first."""

    def __init__(self, name, run, repeated, results=common.RESULTS):
        self.name, self.run, self.repeated, self.results = name, run, repeated, results

    def rows(self, torch):
        """Run the section code and return the result rows it added."""
        start = len(self.results)
        self.run(torch)
        return self.results[start:]


def _gaps_cases(torch):
    """gaps.py's tiny, 4 KiB chains and while cases, quick, on a stream of their own (as gap_rows runs them)."""
    with tp.cuda.stream(tp.cuda.Stream()):
        clocks = common.make_clocks(torch)
        gaps.tiny_case(torch, clocks, GAPS_ROUNDS)
        gaps.chains_case(torch, clocks, GAPS_ROUNDS, (10, 100), (4 * common.KI,))
        gaps.while_case(clocks, GAPS_ROUNDS)
        gaps.while_case(clocks, GAPS_ROUNDS, n=200, extra_ops=18)


# memory first, then serving and serving_set (their baselines must not hold other sections' cached blocks)
PROBES = [
    Probe("memory", lambda torch: memory_rows(False, torch), repeated=False),
    Probe("serving", lambda torch: serving_rows(True, torch), repeated=True),
    Probe("serving_set", lambda torch: capture_set_rows(torch, 512), repeated=True),
    Probe("work", lambda torch: work_rows(True, torch, cases=[c for c in WORK_CASES if c.case in GATE_WORK]),
          repeated=False),
    Probe("random", lambda torch: random_draw_rows(True, torch, cases=GATE_DRAWS), repeated=False),
    Probe("gaps", _gaps_cases, repeated=False, results=gaps.RESULTS),
    Probe("replay", lambda torch: replay_rows([1], HOST_CALLS, HOST_REPEATS, torch, None), repeated=True),
    Probe("staging", lambda torch: staging_rows([8], HOST_CALLS, HOST_REPEATS, torch), repeated=True),
    Probe("rebind", lambda torch: rebind_rows([8], [4 * common.KI], HOST_CALLS, HOST_REPEATS, torch), repeated=True),
    Probe("capture", lambda torch: capture_rows([10, 100], CAPTURE_REPEATS, torch), repeated=True),
]

_MLP_SET = "capture 51 sizes (1..512), MLP 1024/4096 bf16"
_SERVING = "capture 67 graphs (batch 1..512, largest first), one pool"
_GPU = "GPU us per call, CUDA events around back-to-back calls behind a spin kernel"
_GAPS = "GPU us per replay of a captured graph (gaps.py --quick)"

# (name, probe, section, case, numerator's library, denominator's library, figure, how it is measured)
ROWS = [
    ("replay / C loop, 1 node", "replay", "replay", "1 nodes", "tensorplay replay()",
     "C loop cuGraphLaunch, current stream", "host_us",
     "host us per replay() of a 1-node graph over a C loop of cuGraphLaunch on the same executable and "
     "stream (_cloop.pyx), compare.py's replay section"),
    ("stage_and_launch / replay, 8 x 4 KiB", "staging", "staging", "8 inputs x 4 KiB",
     "tensorplay stage_and_launch", "tensorplay replay() (no inputs)", "host_us",
     "host us per stage_and_launch of 8 fresh 4 KiB inputs (the same tensors each call) over a bare "
     "replay() of the same graph, staging section"),
    ("rebind_and_launch / replay, 8 x 4 KiB", "rebind", "rebind", "8 inputs x 4 KiB",
     "tensorplay rebind_and_launch (same tensors)", "tensorplay replay() (no inputs)", "host_us",
     "host us per rebind_and_launch of 8 4 KiB inputs (the same tensors each call) over a bare replay() "
     "of the graph, rebind section"),
    ("capture / PyTorch, 10 nodes", "capture", "capture", "10 nodes", "tensorplay capture+instantiate",
     "PyTorch capture+instantiate", "host_us",
     "host us of capture + instantiate of 10 x.add_(1), tp.cuda.graph over torch.cuda.graph, median of 7, "
     "capture section"),
    ("capture / PyTorch, 100 nodes", "capture", "capture", "100 nodes", "tensorplay capture+instantiate",
     "PyTorch capture+instantiate", "host_us",
     "the same, 100 nodes"),
    ("serving capture / PyTorch, 67 graphs", "serving", "serving", _SERVING, "tensorplay", "PyTorch", "capture_ms",
     "wall ms of capturing the MLP step at batch 1..512 (67 graphs, one pool) over torch.cuda.graph's, "
     "serving section"),
    ("GraphSet capture / vLLM-style, MLP, 51 sizes", "serving_set", "serving_set", _MLP_SET, SET_TP, SET_PT,
     "capture_ms",
     "wall ms of building tp.cuda.GraphSet of the MLP step at vLLM's 51 sizes over PyTorch's vLLM-style set, "
     "serving_set section"),
    ("matmul 4096^2 bf16 GPU / PyTorch", "work", "work", "matmul 4096^2 bfloat16", "tensorplay", "PyTorch", "gpu_us",
     f"{_GPU}, work section"),
    ("add 64Mi f32 GPU / PyTorch", "work", "work", "add 64Mi float32, out=", "tensorplay", "PyTorch", "gpu_us",
     f"{_GPU}, work section"),
    ("sum 64Mi f32 GPU / PyTorch", "work", "work", "sum 64Mi float32", "tensorplay", "PyTorch", "gpu_us",
     f"{_GPU}, work section"),
    ("randn 64Mi f32 GPU / PyTorch", "random", "random", "randn 64Mi float32", "tensorplay", "PyTorch", "gpu_us",
     f"{_GPU}, random section"),
    ("tiny node, PDL on / PyTorch", "gaps", "tiny", "100 nodes, 1 float", "tensorplay add_ (PDL on)", "PyTorch",
     "gpu_us", f"{_GAPS}: 100 x add_(1) on one float, PDL on, over PyTorch's graph"),
    ("chain 10 x 4 KiB, PDL on / PyTorch", "gaps", "chains", "10 ops, 4 KiB", "tensorplay (PDL on)", "PyTorch",
     "gpu_us", f"{_GAPS}: 10 in-place mul_/add_ on 4 KiB, PDL on, over PyTorch's graph"),
    ("chain 100 x 4 KiB, PDL on / PyTorch", "gaps", "chains", "100 ops, 4 KiB", "tensorplay (PDL on)", "PyTorch",
     "gpu_us", f"{_GAPS}: the same, 100 ops"),
    ("WHILE / unrolled, 2-op body, PDL on", "gaps", "while", "1000 iterations, 2-op body", "WHILE node (PDL on)",
     "unrolled (PDL on)", "gpu_us",
     f"{_GAPS}: a WHILE node of 1000 iterations (counter add, compare) over the same body unrolled"),
    ("WHILE / unrolled, 20-op body, PDL on", "gaps", "while", "200 iterations, 20-op body", "WHILE node (PDL on)",
     "unrolled (PDL on)", "gpu_us",
     f"{_GAPS}: a WHILE node of 200 iterations of a 20-op body over the same body unrolled"),
]
MEMORY_WHAT = ("reserved MiB, tensorplay over PyTorch on the same work (memory section; 0 against 0 counts "
               "as 1)")


def ratio_of(numerator, denominator):
    """numerator / denominator; 0 / 0 is 1 (both libraries reserved nothing) and x / 0 is inf."""
    if denominator == 0:
        return 1.0 if numerator == 0 else math.inf
    return numerator / denominator


def find(rows, section, case, library):
    """The first result row of that section, case and library, or None."""
    return next((r for r in rows if (r["section"], r["case"], r["library"]) == (section, case, library)), None)


def pair(rows, section, case, libraries, figure):
    """(numerator, denominator): ``figure`` of the rows of the two
    ``libraries``, or why there is no ratio (a str): a row missing, in
    error (a wrong result is not a measurement) or without the figure."""
    values = []
    for library in libraries:
        r = find(rows, section, case, library)
        if r is None:
            return f"no result row '{library}' in {section} / {case}"
        if r.get("error"):
            return f"{library}: {r['error']}"
        if r.get(figure) is None:
            return f"{library}: no {figure}"
        values.append(r[figure])
    return tuple(values)


def memory_pairs(rows):
    """{row name: pair} for every memory case and figure that either library has, as the memory table shows them."""
    by_case = {}
    for r in rows:
        if r["section"] == "memory":
            by_case.setdefault(r["case"], {})[r["library"]] = r
    out = {}
    for case, libs in by_case.items():
        for key, label in MEMORY_FIGURES:
            if any(r.get(key) is not None for r in libs.values()):
                out[MEMORY_ROW.format(case=case, figure=label)] = pair(rows, "memory", case,
                                                                       ("tensorplay", "PyTorch"), key)
    return out


def pairs_from(rows, probe):
    """{row name: pair or why not} of the rows that ``probe`` (a name) yields, from its result rows."""
    if probe == "memory":
        return memory_pairs(rows)
    return {name: pair(rows, section, case, (num, den), figure)
            for name, p, section, case, num, den, figure, _ in ROWS if p == probe}


def ratios_from(pairs_by_round):
    """Median ratio of each row over its rounds, and why a row has none.

    Parameters
    ----------
    pairs_by_round : dict
        Row name to the list of its rounds' pairs (``pair``'s results).

    Returns
    -------
    (dict, dict)
        Row name to its median ratio (None where no round gave one), and
        row name to a note (rounds missing, or why none was measured).
    """
    ratios, notes = {}, {}
    for name, rounds in pairs_by_round.items():
        good = [ratio_of(*p) for p in rounds if isinstance(p, tuple)]
        bad = [p for p in rounds if not isinstance(p, tuple)]
        ratios[name] = statistics.median(good) if good else None
        if bad:
            notes[name] = (f"{len(bad)} of {len(rounds)} rounds not measured: " if good else "") + bad[0]
    return ratios, notes


def row_descriptions(names):
    """How each of ``names`` is measured."""
    what = {name: text for name, *_, text in ROWS}
    return {name: what.get(name, MEMORY_WHAT if name.startswith("memory: ") else None) for name in names}


def measure(torch, rounds, log=print):
    """Run every probe (the repeated ones ``rounds`` times, interleaved) and make the rows' ratios.

    Parameters
    ----------
    torch : module
        PyTorch, every row's peer but the floors'.
    rounds : int
        Rounds of the host-time probes.
    log : callable
        Gets one line a probe run, with its time.

    Returns
    -------
    (dict, dict, dict)
        Row name to its ratio (None: not measured), row name to a note, and
        row name to the list of its rounds' pairs.
    """
    pairs_by_round = {}
    for k in range(rounds):
        for probe in PROBES:
            if k and not probe.repeated:
                continue
            t0 = time.perf_counter()
            try:
                found = pairs_from(probe.rows(torch), probe.name)
            except Exception as exc:    # a probe that breaks leaves its rows not measured, and says why
                why = f"{probe.name} failed: {type(exc).__name__}: {exc}"[:200]
                log(f"gate: {why}")
                found = {name: why for name, p, *_ in ROWS if p == probe.name}
            for name, p in found.items():
                pairs_by_round.setdefault(name, []).append(p)
            log(f"gate: round {k + 1}/{rounds}, {probe.name}: {time.perf_counter() - t0:.1f} s")
    ratios, notes = ratios_from(pairs_by_round)
    return ratios, notes, pairs_by_round
