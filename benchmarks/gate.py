# SPDX-License-Identifier: Apache-2.0
"""The performance gate: key ratios, measured quickly, against a committed baseline.

Run on the GPU machine, from benchmarks/ (a few minutes on an H200)::

    python gate.py [--out NAME] [--baseline FILE] [--rounds 3]
    python gate.py --update-baseline        # measure, then write the ratios into the baseline
    python gate.py --degrade 'tiny*=1.5'    # self-test: that row made worse on purpose must fail
    python gate.py --judge NAME.json        # judge an earlier --out file again (no GPU needed)

Each row is a ratio of two figures measured in the same run (tensorplay
against PyTorch, or against a floor such as a C loop of cuGraphLaunch), so
that it holds between machines; lower is better unless the baseline says
otherwise. The rows come from quick subsets of compare.py's sections and
gaps.py's cases (tpbench/gate_rows.py says which), host-time rows as the
median of --rounds interleaved rounds. Every row is compared with its entry
in gate_baseline.json (baseline ratio and tolerance); the script prints a
table, names each row that got worse by more than its tolerance, and exits
1 if any did (or a row with a baseline could not be measured), 0 if none
did, 2 for a baseline or --degrade it cannot use. A row whose baseline is
null ("no baseline yet") is reported and never fails.

--degrade ROW=FACTOR multiplies that row's measured ratio by FACTOR before
judging (ROW: a name from the table or an fnmatch pattern; repeatable): a
self-test showing that the gate fails when a row gets worse. It is refused
with --update-baseline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

from tpbench import judge

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BASELINE = os.path.join(HERE, "gate_baseline.json")


def git_commit():
    """The checkout's commit, or None where there is no git history (a copy of the tree)."""
    try:
        out = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def measure_here(rounds):
    """Measure every row on this machine: (ratios, notes, rounds' pairs, meta), or an exit code when it cannot."""
    from tpbench import gate_rows          # tensorplay and the sections: only when measuring
    from tpbench.common import gpu_and_torch
    import tensorplay as tp
    torch, code = gpu_and_torch("most rows set tensorplay against PyTorch")
    if torch is None:
        return code
    t0 = time.perf_counter()
    ratios, notes, pairs = gate_rows.measure(torch, rounds, log=lambda line: print(line, flush=True))
    meta = {"date": datetime.date.today().isoformat(), "gpu": tp.cuda.get_device_name(0),
            "driver": ".".join(map(str, tp.cuda.driver_version())), "tensorplay": tp.__version__,
            "torch": torch.__version__, "python": sys.version.split()[0], "commit": git_commit(),
            "rounds": rounds, "elapsed_s": round(time.perf_counter() - t0, 1)}
    what = gate_rows.row_descriptions(ratios)
    return ratios, notes, pairs, meta, what


def read_judged(path):
    """The ratios, notes, pairs, meta and descriptions of an earlier --out file."""
    with open(path) as f:
        doc = json.load(f)
    rows = doc["rows"]
    ratios = {r["name"]: r.get("measured", r["ratio"]) for r in rows}
    notes = {r["name"]: r["note"] for r in rows if r.get("note")}
    pairs = {r["name"]: r.get("rounds") for r in rows}
    return ratios, notes, pairs, doc.get("meta", {}), {r["name"]: r.get("what") for r in rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", metavar="FILE", default=DEFAULT_BASELINE,
                    help="the baseline to judge against (default: gate_baseline.json beside this script)")
    ap.add_argument("--out", metavar="NAME", help="also write the verdicts and the measurements to NAME.json")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the host-time rows (default 3)")
    ap.add_argument("--update-baseline", action="store_true",
                    help="write the measured ratios into the baseline file (tolerances kept)")
    ap.add_argument("--degrade", metavar="ROW=FACTOR", action="append", default=[],
                    help="multiply ROW's measured ratio by FACTOR (self-test of the gate; repeatable)")
    ap.add_argument("--judge", metavar="JSON", help="judge an earlier --out file instead of measuring")
    args = ap.parse_args(argv)
    try:
        baseline = judge.load_baseline(args.baseline)
        degrade = judge.parse_degrade(args.degrade)
        if degrade and args.update_baseline:
            raise judge.BaselineError("--degrade is a self-test: it cannot go with --update-baseline")
        if args.rounds < 1:
            raise judge.BaselineError("--rounds must be at least 1")
    except judge.BaselineError as exc:
        print(f"gate.py: {exc}", file=sys.stderr)
        return 2
    if args.judge:
        ratios, notes, pairs, meta, what = read_judged(args.judge)
    else:
        measured = measure_here(args.rounds)
        if isinstance(measured, int):
            return measured
        ratios, notes, pairs, meta, what = measured
    try:
        judged, degraded = judge.apply_degrade(ratios, degrade)
    except judge.BaselineError as exc:
        print(f"gate.py: {exc}", file=sys.stderr)
        return 2
    verdicts = judge.judge(judged, baseline["rows"], what=what, notes=notes, degraded=degraded)
    print(judge.format_table(verdicts))
    if args.out:
        for v in verdicts:
            v["measured"] = ratios.get(v["name"])       # before --degrade, for --judge and --update-baseline
            v["rounds"] = pairs.get(v["name"])
        meta = dict(meta, baseline=os.path.relpath(args.baseline), degrade=args.degrade)
        with open(args.out + ".json", "w") as f:
            json.dump({"meta": meta, "rows": verdicts, "failed": judge.failed_names(verdicts)}, f, indent=1)
    if args.update_baseline:
        source = (f"gate.py --update-baseline on {meta.get('gpu')}, tensorplay {meta.get('tensorplay')}, "
                  f"torch {meta.get('torch')}, commit {meta.get('commit')}, {meta.get('rounds')} rounds")
        doc = judge.updated_baseline(baseline, ratios, source, meta.get("date") or datetime.date.today().isoformat())
        judge.write_baseline(args.baseline, doc)
        print(f"baseline updated: {args.baseline}")
        return 0
    return judge.exit_code(verdicts)


if __name__ == "__main__":
    sys.exit(main())
