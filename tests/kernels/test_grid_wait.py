# SPDX-License-Identifier: Apache-2.0
"""Programmatic dependent launch without a GPU: every kernel the library
generates opens with the grid-dependency wait, before any memory access, in
the PTX NVRTC makes for sm_90 (and has none for older targets); the switch
(``tensorplay.backends.cuda.pdl``, ``TENSORPLAY_PDL``); RawKernel's ``pdl``;
programmatic edges in DOT."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

import tensorplay as tp
from helpers import ptx_of, run_python
from tensorplay import _dtypes as dt
from tensorplay._graph import kernel_catalog
from tensorplay._graph import kernels as graph_kernels
from tensorplay._kernels import (cache, codegen, param_upload, random_kernels, sampling_kernels, scan_kernels,
                                 sort_kernels)
from tensorplay._ops import indexing

# What touches memory another kernel may write or read: loads, stores and
# atomics other than of parameters, shared or local memory (global and
# generic addresses), and calls (setting a conditional node's handle).
MEMORY_ACCESS = r"^\s*(ld|st|atom|red|cp\.async)\.(?!param|shared|local|const)|^\s*call"


def _library_kernels():
    """Every kernel family the library generates, as KernelSpecs (collected
    without a GPU): the precompile catalog for float32, plus the kernels it
    does not hold (sorting, indexing, scans, sampling, parameter upload)."""
    specs = list(kernel_catalog.catalog_kernels(list(kernel_catalog.CATALOG), [dt.float32]))
    dev = cache.COLLECT_DEVICE
    for call, *args in [(sort_kernels.sort_function, "block", dev), (sort_kernels.sort_function, "global", dev),
                        (sort_kernels.sort_function, "merge", dev),
                        (indexing._kernel, "gather", dt.float32, 2, 0, dev),
                        (indexing._kernel, "scatter", dt.float16, 3, 1, dev),
                        (indexing._gather_along_kernel, dt.float32, 3, 1, dev),
                        (scan_kernels.scan_function, dt.float16, dt.float16, dev),
                        (scan_kernels.add_function, dt.int64, dt.int64, dev),
                        (sampling_kernels.race_keys_function, dt.float32, dev),
                        (sampling_kernels.inverse_cdf_function, dt.bfloat16, dev),
                        (param_upload.param_write_function, 64, dev),
                        (random_kernels.set_state_function, dev),
                        (graph_kernels.set_switch_function, "int64", dev),
                        (graph_kernels.multi_copy_function, 32, dev)]:
        spec = cache.collect_kernel(call, *args)
        assert spec is not None, call
        specs.append(spec)
    return specs


SPECS = _library_kernels()


def _entries(ptx):
    """Each kernel of ``ptx``: (name, its instruction lines)."""
    out = []
    for m in re.finditer(r"\.entry\s+(\w+)\(", ptx):
        body_start = ptx.index("{", m.end())
        depth, i = 0, body_start
        while True:
            depth += {"{": 1, "}": -1}.get(ptx[i], 0)
            if depth == 0:
                break
            i += 1
        out.append((m.group(1), ptx[body_start:i].splitlines()))
    return out


def _first(lines, pattern):
    return next((k for k, line in enumerate(lines) if re.search(pattern, line)), None)


def test_the_catalog_covers_every_kernel_family():
    names = {s.name for s in SPECS}
    assert len(SPECS) > 150
    for family in ("tp_add", "tp_reduce_row_sum", "tp_reduce_column_sum", "tp_tiled_copy", "tp_rng", "tp_set_conditional", "tp_set_switch",
                   "tp_multi_copy", "tp_sort_block", "tp_sort_global", "tp_sort_merge", "tp_gather", "tp_scatter",
                   "tp_race_keys", "tp_inverse_cdf", "tp_write_param_bytes", "tp_gather_along", "tp_scan_",
                   "tp_scan_add"):
        assert any(n.startswith(family) for n in names), family


def test_every_generated_kernel_waits_for_its_grid_dependency_before_touching_memory():
    """The launch uses programmatic stream serialization for exactly these
    sources (GRID_WAIT in them), so every kernel in them must wait first:
    NVRTC's PTX for sm_90 has griddepcontrol.wait, then launch_dependents,
    before the first load, store, atomic or call."""
    def check(spec):
        assert codegen.GRID_WAIT in spec.source, spec.name
        ptx = ptx_of(spec.source, 90, spec.options)
        entries = _entries(ptx)
        assert entries, spec.name
        problems = []
        for name, lines in entries:
            wait = _first(lines, r"griddepcontrol\.wait")
            trigger = _first(lines, r"griddepcontrol\.launch_dependents")
            access = _first(lines, MEMORY_ACCESS)
            if wait is None or trigger is None or trigger < wait:
                problems.append(f"{name}: wait at {wait}, launch_dependents at {trigger}")
            elif access is not None and access < wait:
                problems.append(f"{name}: {lines[access].strip()!r} before the wait")
        return problems

    with ThreadPoolExecutor(8) as pool:
        problems = [p for ps in pool.map(check, SPECS) for p in ps]
    assert not problems, problems[:10]


@pytest.mark.parametrize("arch", [80, 89])
def test_older_targets_compile_the_wait_out(arch):
    for spec in SPECS[:: max(1, len(SPECS) // 12)]:
        ptx = ptx_of(spec.source, arch, spec.options)
        assert "griddepcontrol" not in ptx, spec.name


def test_the_pdl_switch():
    pdl = tp.backends.cuda.pdl
    assert pdl.enabled is True
    assert "enabled=True" in repr(pdl)
    pdl.enabled = False
    try:
        assert pdl.enabled is False
        with pdl.flags(enabled=True):
            assert pdl.enabled is True
        assert pdl.enabled is False
    finally:
        pdl.enabled = True
    with pytest.raises(RuntimeError):
        with pdl.flags(enabled=False):
            assert not pdl.enabled
            raise RuntimeError("restored on the way out")
    assert pdl.enabled is True
    with pytest.raises(TypeError, match="must be a bool"):
        pdl.enabled = 1
    with pytest.raises(AttributeError, match="no setting 'enable'"):
        pdl.enable = False


@pytest.mark.parametrize("value, expected", [("0", False), ("off", False), ("1", True), ("", True)])
def test_the_environment_variable_sets_the_default(value, expected):
    r = run_python("import tensorplay as tp; print(tp.backends.cuda.pdl.enabled)", TENSORPLAY_PDL=value)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(expected)
    assert "TENSORPLAY_PDL" in tp.config()["env"]


def test_raw_kernel_pdl_is_a_declared_bool():
    src = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }'
    assert tp.RawKernel(src, "k").pdl is False
    assert tp.RawKernel(src, "k", pdl=True).pdl is True
    with pytest.raises(TypeError, match="pdl must be a bool"):
        tp.RawKernel(src, "k", pdl="yes")


def test_dot_marks_programmatic_edges():
    desc = {"nodes": [{"id": 0, "kind": "kernel", "name": "a"}, {"id": 1, "kind": "kernel", "name": "b"},
                      {"id": 2, "kind": "memcpy"}],
            "edges": [[0, 1], [1, 2]], "programmatic_edges": [[0, 1]]}
    dot = tp.cuda.to_dot(desc)
    assert '"n0" -> "n1" [label="PDL", color=blue, fontcolor=blue];' in dot
    assert '"n1" -> "n2";' in dot
    del desc["programmatic_edges"]          # descriptions written before PDL still render
    assert '"n0" -> "n1";' in tp.cuda.to_dot(desc)
