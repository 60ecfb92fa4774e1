# SPDX-License-Identifier: Apache-2.0
"""The performance gate of benchmarks/ without a GPU: its verdicts
(benchmarks/tpbench/judge.py, loaded by path: benchmarks/ is not installed),
gate.py's exit codes when it judges a stored run, the committed baseline,
the rows' extraction from committed results, and the benchmark modules'
import graph (no cycle, found by test_layering's find_cycle; sections
importing only the shared modules)."""

import ast
import importlib.util
import json
import subprocess
import sys

import pytest

from helpers import ROOT
from test_layering import find_cycle          # the library's own cycle check, tested there

BENCH = ROOT / "benchmarks"
PACKAGE = "tpbench"
# what a section module may import of the benchmarks: the shared modules
SHARED = {f"{PACKAGE}.common", f"{PACKAGE}.workloads", f"{PACKAGE}.vllm_style"}
SECTIONS = {f"{PACKAGE}.{m}" for m in ("memory", "serving", "serving_set", "work", "gaps", "random_numbers",
                                        "host_calls", "inputs", "control_flow", "capture", "decode")}


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


judge = _load("benchmark_gate_judge", BENCH / PACKAGE / "judge.py")


def _rows(**entries):
    """A baseline's rows: name=(baseline, tolerance) or name=(baseline, tolerance, higher_is_better)."""
    out = {}
    for name, entry in entries.items():
        out[name] = {"baseline": entry[0], "tolerance": entry[1], "source": "test", "date": "2026-01-01"}
        if len(entry) > 2:
            out[name]["higher_is_better"] = entry[2]
    return out


def _verdict(ratio, baseline, tolerance, higher=False):
    rows = _rows(r=(baseline, tolerance, higher))
    (v,) = judge.judge({"r": ratio}, rows)
    return v


# ---------------------------------------------------------------- verdicts

def test_a_row_within_its_tolerance_passes():
    for ratio in (1.0, 1.05, 1.1):                       # 1.1: exactly at the limit still passes
        v = _verdict(ratio, 1.0, 0.1)
        assert v["verdict"] == judge.OK and not v["failed"], (ratio, v)
    assert _verdict(1.05, 1.0, 0.1)["limit"] == pytest.approx(1.1)


def test_a_row_worse_than_its_tolerance_fails_and_is_named():
    rows = _rows(fine=(1.0, 0.1), slower=(0.5, 0.2), other=(2.0, 0.05))
    verdicts = judge.judge({"fine": 1.02, "slower": 0.61, "other": 2.05}, rows)
    by_name = {v["name"]: v for v in verdicts}
    assert by_name["slower"]["verdict"] == judge.WORSE and by_name["slower"]["failed"]
    assert not by_name["fine"]["failed"] and not by_name["other"]["failed"]
    assert judge.failed_names(verdicts) == ["slower"]
    table = judge.format_table(verdicts)
    assert table.splitlines()[-1].startswith("gate FAILED: 1 row(s)") and table.splitlines()[-1].endswith("slower")
    assert judge.exit_code(verdicts) == 1


def test_a_better_row_passes():
    v = _verdict(0.5, 1.0, 0.1)
    assert v["verdict"] == judge.BETTER and not v["failed"]
    assert judge.exit_code([v]) == 0


def test_higher_is_better_turns_the_direction_round():
    assert _verdict(0.85, 1.0, 0.1, higher=True)["verdict"] == judge.WORSE
    assert _verdict(1.5, 1.0, 0.1, higher=True)["verdict"] == judge.BETTER
    assert _verdict(0.95, 1.0, 0.1, higher=True)["verdict"] == judge.OK
    assert _verdict(0.95, 1.0, 0.1, higher=True)["limit"] == pytest.approx(0.9)


def test_a_zero_baseline_allows_nothing_above_zero():
    # memory rows where tensorplay reserved nothing: any growth is a regression
    assert _verdict(0.0, 0.0, 0.02)["verdict"] == judge.OK
    assert _verdict(0.01, 0.0, 0.02)["verdict"] == judge.WORSE
    assert _verdict(float("inf"), 1.0, 0.02)["verdict"] == judge.WORSE


def test_null_baselines_never_fail():
    rows = _rows(new=(None, 0.1))
    verdicts = judge.judge({"new": 1000.0, "unknown": 5.0}, rows)
    assert [v["verdict"] for v in verdicts] == [judge.NO_BASELINE, judge.NO_BASELINE]
    assert judge.exit_code(verdicts) == 0
    # not measured either: still no failure
    verdicts = judge.judge({}, rows)
    assert verdicts[0]["verdict"] == judge.NO_BASELINE and judge.exit_code(verdicts) == 0


def test_a_row_with_a_baseline_that_was_not_measured_fails():
    rows = _rows(measured=(1.0, 0.1), lost=(1.0, 0.1))
    verdicts = judge.judge({"measured": 1.0}, rows, notes={"lost": "PyTorch: RuntimeError"})
    lost = verdicts[-1]
    assert (lost["name"], lost["verdict"], lost["failed"]) == ("lost", judge.NOT_MEASURED, True)
    assert "PyTorch: RuntimeError" in judge.format_table(verdicts)
    assert judge.exit_code(verdicts) == 1


def test_degrade_makes_a_passing_row_fail():
    rows = _rows(**{"tiny node, PDL on / PyTorch": (0.54, 0.1), "replay / C loop, 1 node": (1.08, 0.15)})
    ratios = {"tiny node, PDL on / PyTorch": 0.55, "replay / C loop, 1 node": 1.08}
    assert judge.exit_code(judge.judge(ratios, rows)) == 0
    degraded, factors = judge.apply_degrade(ratios, judge.parse_degrade(["tiny*=1.5"]))
    assert factors == {"tiny node, PDL on / PyTorch": 1.5}
    assert degraded["tiny node, PDL on / PyTorch"] == pytest.approx(0.825)
    assert degraded["replay / C loop, 1 node"] == 1.08 and ratios["tiny node, PDL on / PyTorch"] == 0.55
    verdicts = judge.judge(degraded, rows, degraded=factors)
    assert judge.failed_names(verdicts) == ["tiny node, PDL on / PyTorch"]
    assert "degraded x1.5" in judge.format_table(verdicts)
    # a name may hold '=': the factor is after the last one
    assert judge.parse_degrade(["memory: y = x * 2: growth=2"]) == [("memory: y = x * 2: growth", 2.0)]


@pytest.mark.parametrize("spec", ["tiny", "tiny=", "=2", "tiny=0", "tiny=-1", "tiny=abc", "tiny=nan"])
def test_degrade_refuses_what_is_not_row_equals_positive_factor(spec):
    with pytest.raises(judge.BaselineError):
        judge.parse_degrade([spec])


def test_degrade_of_a_row_that_does_not_exist_is_refused():
    with pytest.raises(judge.BaselineError, match="no row"):
        judge.apply_degrade({"a": 1.0}, [("b*", 2.0)])


def test_load_baseline_checks_every_row(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"rows": _rows(a=(1.0, 0.1), b=(None, 0.2))}))
    assert set(judge.load_baseline(good)["rows"]) == {"a", "b"}
    for rows in ({"a": {"baseline": 1.0}}, {"a": {"baseline": "1", "tolerance": 0.1}},
                 {"a": {"baseline": -1.0, "tolerance": 0.1}}, {"a": {"baseline": 1.0, "tolerance": -0.1}}):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"rows": rows}))
        with pytest.raises(judge.BaselineError):
            judge.load_baseline(bad)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(judge.BaselineError):
        judge.load_baseline(tmp_path / "broken.json")


def test_update_baseline_writes_the_ratios_and_keeps_the_tolerances():
    doc = {"about": "x", "rows": _rows(a=(1.0, 0.15), b=(2.0, 0.05), c=(None, 0.3, True))}
    new = judge.updated_baseline(doc, {"a": 1.23456, "b": None, "c": 0.5, "d": 3.0}, "gate run", "2026-12-31")
    assert new["rows"]["a"] == {"baseline": 1.2346, "tolerance": 0.15, "source": "gate run", "date": "2026-12-31"}
    assert new["rows"]["b"] == doc["rows"]["b"]                   # not measured: kept as it was
    assert new["rows"]["c"]["higher_is_better"] is True and new["rows"]["c"]["baseline"] == 0.5
    assert new["rows"]["d"]["tolerance"] == judge.DEFAULT_TOLERANCE and "review" in new["rows"]["d"]["note"]
    assert doc["rows"]["a"]["baseline"] == 1.0 and new["about"] == "x"   # the input is not changed


# ---------------------------------------------------------------- gate.py on a stored run

def _gate(*args):
    return subprocess.run([sys.executable, str(BENCH / "gate.py"), *args], capture_output=True, text=True,
                          cwd=BENCH, timeout=120)


@pytest.fixture
def stored_run(tmp_path):
    """A baseline of three rows and a stored gate run that meets it: (baseline path, run path)."""
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"rows": _rows(**{"replay / C loop, 1 node": (1.08, 0.15),
                                                     "capture / PyTorch, 100 nodes": (0.5, 0.2),
                                                     "not yet": (None, 0.1)})}))
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"meta": {"date": "2026-12-05", "gpu": "test"}, "rows": [
        {"name": "replay / C loop, 1 node", "ratio": 1.1, "what": "host us"},
        {"name": "capture / PyTorch, 100 nodes", "ratio": 0.52, "what": "host us"},
        {"name": "not yet", "ratio": 9.0, "what": "new"}]}))
    return baseline, run


def test_gate_exits_0_when_every_row_holds(stored_run):
    baseline, run = stored_run
    res = _gate("--judge", str(run), "--baseline", str(baseline))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gate passed: 3 rows" in res.stdout


def test_gate_exits_1_and_names_the_row_made_worse(stored_run, tmp_path):
    baseline, run = stored_run
    res = _gate("--judge", str(run), "--baseline", str(baseline), "--degrade", "capture*=1.5",
                "--out", str(tmp_path / "verdicts"))
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1].endswith("capture / PyTorch, 100 nodes")
    written = json.loads((tmp_path / "verdicts.json").read_text())
    assert written["failed"] == ["capture / PyTorch, 100 nodes"]
    row = next(r for r in written["rows"] if r["failed"])
    assert row["ratio"] == pytest.approx(0.78) and row["measured"] == 0.52 and row["degraded_by"] == 1.5
    # the written file judges again the same way, without the degrade: it passes
    assert _gate("--judge", str(tmp_path / "verdicts.json"), "--baseline", str(baseline)).returncode == 0


def test_gate_exits_2_on_what_it_cannot_use(stored_run, tmp_path):
    baseline, run = stored_run
    assert _gate("--judge", str(run), "--baseline", str(tmp_path / "missing.json")).returncode == 2
    res = _gate("--judge", str(run), "--baseline", str(baseline), "--degrade", "no such row=2")
    assert res.returncode == 2 and "no row" in res.stderr
    res = _gate("--judge", str(run), "--baseline", str(baseline), "--degrade", "replay*=2", "--update-baseline")
    assert res.returncode == 2 and "self-test" in res.stderr


def test_gate_update_baseline_from_a_stored_run(stored_run):
    baseline, run = stored_run
    res = _gate("--judge", str(run), "--baseline", str(baseline), "--update-baseline")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(baseline.read_text())["rows"]
    assert rows["capture / PyTorch, 100 nodes"]["baseline"] == 0.52
    assert rows["capture / PyTorch, 100 nodes"]["tolerance"] == 0.2
    assert rows["not yet"]["baseline"] == 9.0 and rows["not yet"]["date"] == "2026-12-05"


# ---------------------------------------------------------------- the committed baseline and rows

def test_the_committed_baseline_loads_and_says_where_each_value_came_from():
    rows = judge.load_baseline(BENCH / "gate_baseline.json")["rows"]
    for name, row in rows.items():
        assert row.get("source") and row.get("date"), name
        assert 0 < row["tolerance"] <= 0.3, name
    # the rows the gate promises (issue 42)
    for wanted in ("replay / C loop", "stage_and_launch / replay", "rebind_and_launch / replay",
                   "capture / PyTorch, 10 nodes", "capture / PyTorch, 100 nodes", "serving capture / PyTorch",
                   "GraphSet capture / vLLM-style", "matmul", "add 64Mi", "sum 64Mi", "randn 64Mi", "tiny node",
                   "chain 10 x 4 KiB", "chain 100 x 4 KiB", "WHILE / unrolled"):
        assert any(name.startswith(wanted) for name in rows), wanted
    assert sum(name.startswith("memory: ") for name in rows) >= 20


@pytest.fixture(scope="module")
def gate_rows():
    """benchmarks/tpbench/gate_rows.py, imported as the scripts import it (benchmarks/ on sys.path)."""
    sys.path.insert(0, str(BENCH))
    try:
        from tpbench import gate_rows
    finally:
        sys.path.remove(str(BENCH))
    return gate_rows


def _results(name):
    return json.loads((BENCH / "results" / name).read_text())["results"]


def test_the_rows_come_out_of_committed_results(gate_rows):
    work = gate_rows.pairs_from(_results("compare-2026-12-03-work.json"), "work")
    assert work["matmul 4096^2 bf16 GPU / PyTorch"] == pytest.approx((180.5158, 179.8899), rel=1e-6)
    serving = gate_rows.pairs_from(_results("compare-2026-12-03-work.json"), "serving")
    assert gate_rows.ratio_of(*serving["serving capture / PyTorch, 67 graphs"]) == pytest.approx(15.727 / 41.838,
                                                                                                 rel=1e-3)
    gaps = gate_rows.pairs_from(_results("gaps-2026-12-04.json"), "gaps")
    assert gate_rows.ratio_of(*gaps["WHILE / unrolled, 2-op body, PDL on"]) == pytest.approx(3.95, abs=0.005)
    # a row that a run does not have is "not measured", with the reason
    assert "no result row" in gate_rows.pairs_from(_results("compare-2026-12-02-c.json"), "work")[
        "matmul 4096^2 bf16 GPU / PyTorch"]
    # every memory case and figure of a full memory section has its baseline row
    memory = gate_rows.memory_pairs(_results("compare-2026-12-02-c.json"))
    baseline = judge.load_baseline(BENCH / "gate_baseline.json")["rows"]
    assert len(memory) == 27 and set(memory) <= set(baseline)
    assert memory["memory: 100 capture + reset cycles, 1 MiB input + 4 MiB temporary: growth"] == (0.0, 24.0)


def test_ratios_are_medians_of_rounds_and_say_what_was_missing(gate_rows):
    ratios, notes = gate_rows.ratios_from({"a": [(1.0, 1.0), (3.0, 1.0), (2.0, 1.0)], "b": ["PyTorch: boom"],
                                           "c": [(2.0, 1.0), "lost"], "m": [(0.0, 0.0)], "z": [(2.0, 0.0)]})
    assert ratios == {"a": 2.0, "b": None, "c": 2.0, "m": 1.0, "z": float("inf")}
    assert notes == {"b": "PyTorch: boom", "c": "1 of 2 rounds not measured: lost"}
    rows = [{"section": "s", "case": "c", "library": "tp", "gpu_us": 2.0, "error": None},
            {"section": "s", "case": "c", "library": "PT", "gpu_us": 4.0, "error": "wrong result"}]
    assert gate_rows.pair(rows, "s", "c", ("tp", "PT"), "gpu_us") == "PT: wrong result"


# ---------------------------------------------------------------- the benchmark modules

def _benchmark_modules():
    """{module name: path} of benchmarks/*.py and of the package's modules."""
    modules = {p.stem: p for p in BENCH.glob("*.py")}
    for p in (BENCH / PACKAGE).glob("*.py"):
        modules[PACKAGE if p.stem == "__init__" else f"{PACKAGE}.{p.stem}"] = p
    return modules


def _imports(path, known):
    """The benchmark modules that ``path`` imports, anywhere in it (functions too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out.update(n for n in names if n in known)
    return out


def test_the_benchmark_modules_import_no_cycle_and_sections_import_only_shared_modules():
    modules = _benchmark_modules()
    graph = {m: _imports(p, modules) - {m} for m, p in modules.items()}
    assert {"compare", "gaps", "gate"} <= set(graph) and SECTIONS <= set(graph)
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"
    scripts = {m for m in modules if not m.startswith(PACKAGE)}
    for m in SECTIONS | SHARED:
        assert graph[m] <= SHARED | {PACKAGE}, f"{m} imports {sorted(graph[m] - SHARED - {PACKAGE})}"
    for m in modules:
        if m.startswith(PACKAGE):
            assert not graph[m] & scripts, f"{m} imports a script: {sorted(graph[m] & scripts)}"
    assert graph[f"{PACKAGE}.judge"] == set(), "judge.py must load by path: it imports no benchmark module"


def test_every_benchmark_module_imports_from_benchmarks():
    names = sorted(_benchmark_modules())
    res = subprocess.run([sys.executable, "-c", f"import {', '.join(names)}"], capture_output=True, text=True,
                         cwd=BENCH, timeout=300)
    assert res.returncode == 0, res.stderr
