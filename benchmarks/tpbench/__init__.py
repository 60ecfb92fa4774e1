# SPDX-License-Identifier: Apache-2.0
"""The benchmarks' sections and their shared helpers (not part of tensorplay).

The scripts in benchmarks/ (compare.py, gaps.py, gate.py, ...) import these
modules; run them from benchmarks/, which puts this package on sys.path.
Imports go one way, with no cycle:

- ``common``: results, timing helpers, peers' graphs, checks, setup;
- ``workloads`` (the serving MLP step) and ``vllm_style`` (vLLM's sizes,
  the batched decode step, PyTorch's vLLM-style graph set): shared by
  sections, importing only ``common``;
- one module a section, importing only the modules above: ``memory``,
  ``serving``, ``serving_set``, ``work``, ``gaps``, ``random_numbers``
  (random), ``host_calls`` (replay, threads, eager), ``inputs`` (staging,
  rebind), ``control_flow`` (while, branch), ``capture`` (capture,
  recapture), ``decode``;
- ``report``: compare.py's tables and chart (imports the sections' legends);
- ``judge``: the performance gate's verdicts, pure Python (no import of
  its own package, so a test can load it by path); ``gate_rows``: the
  gate's rows, measured through the sections.

This file imports nothing, so that importing one module loads only what it needs.
"""
