# SPDX-License-Identifier: Apache-2.0
"""compare.py's output: the timing table, the GPU work and serving tables,
the memory table (with each section's legend) and the chart of host times.
"""

from __future__ import annotations

from tpbench.common import RESULTS
from tpbench.inputs import REBIND_LEGEND
from tpbench.memory import MEMORY_FIGURES, MEMORY_LEGEND
from tpbench.serving_set import SERVING_SET_LEGEND

GPU_SECTIONS = ("work", "serving", "serving_set", "random", "gaps")
WORK_LEGEND = """\
GPU us: CUDA events around 20-100 back-to-back calls queued behind a spin kernel (so the GPU runs them
  without waiting on the host), median over rounds after warm-up; host us: time to enqueue one call;
  rate: the row's FLOPs (TFLOP/s) or bytes read + written (GB/s) over GPU us; tp/PT: PyTorch's GPU time
  over tensorplay's (>1: tensorplay faster). tensorplay's result is checked against PyTorch's once per row
  and a wrong one is not timed. Serving capture: wall time of all captures, reserved growth over the
  library's baseline (weights and inputs allocated, each batch size warmed up, cache emptied).
  Random: rand/randn are checked for their distribution's mean and std, not against PyTorch (other
  generators); the replay rows' host us is the host time per replay and tp/PT PyTorch's over tensorplay's."""


def print_table():
    """The timing table, the GPU work and serving tables, then the memory table."""
    timed = [r for r in RESULTS if r["section"] not in ("memory",) + GPU_SECTIONS]
    if timed:
        print_timing_table(timed)
    if any(r["section"] == "rebind" for r in timed):
        print(REBIND_LEGEND)
    print_gpu_tables([r for r in RESULTS if r["section"] in GPU_SECTIONS])
    print_memory_table([r for r in RESULTS if r["section"] == "memory"])


def print_timing_table(rows):
    print(f"{'section':<9} {'case':<20} {'library':<52} {'host us':>10} {'latency us':>11}  note")
    for r in rows:
        h = f"{r['host_us']:.2f}" if r["host_us"] is not None else "-"
        lat = f"{r['latency_us']:.1f}" if r["latency_us"] is not None else "-"
        note = r["error"] or r["note"] or (f"{r['extra']:.0f} launches/s" if r["extra"] else "")
        print(f"{r['section']:<9} {r['case']:<20} {r['library']:<52} {h:>10} {lat:>11}  {note}")


def _cell(value, fmt):
    return format(value, fmt) if value is not None else "-"


def print_gpu_tables(rows):
    """Work and serving rows: GPU time, rate, host time, speed against PyTorch;
    serving's capture rows as capture time and reserved growth."""
    if not rows:
        return
    captures = [r for r in rows if r["section"] in ("serving", "serving_set") and r["case"].startswith("capture")]
    sleeps = [r for r in rows if r["section"] == "serving_set" and r["case"].startswith("sleep/wake")]
    timed = [r for r in rows if r not in captures and r not in sleeps]
    print()
    print(f"{'section':<11} {'case':<64} {'library':<28} {'GPU us':>10} {'rate':>9} {'unit':<7} "
          f"{'host us':>8} {'tp/PT':>6}  note")
    for r in timed:
        note = "; ".join(x for x in (r["error"], r["note"]) if x)
        print(f"{r['section']:<11} {r['case']:<64} {r['library']:<28} {_cell(r['gpu_us'], '.2f'):>10} "
              f"{_cell(r['rate'], '.1f'):>9} {r['unit'] or '':<7} {_cell(r['host_us'], '.2f'):>8} "
              f"{_cell(r['speed_vs_torch'], '.2f'):>6}  {note}")
    if captures:
        print()
        print(f"{'serving capture':<80} {'library':<58} {'wall ms':>9} {'MiB':>8} {'tp/PT':>6}  note")
        for r in captures:
            note = "; ".join(x for x in (r["error"], r["note"]) if x)
            print(f"{r['case']:<80} {r['library']:<58} {_cell(r['capture_ms'], '.1f'):>9} "
                  f"{_cell(r['reserved_mib'], '.1f'):>8} {_cell(r['speed_vs_torch'], '.2f'):>6}  {note}")
    if sleeps:
        print_sleep_table(sleeps)
    print(WORK_LEGEND)
    if any(r["section"] == "serving_set" for r in rows):
        print(SERVING_SET_LEGEND)


def print_sleep_table(rows):
    """serving_set's sleep/wake rows: the medians kept in ``extra``."""
    print()
    print(f"{'sleep/wake (medians)':<64} {'library':<22} {'mapped MiB':>10} {'given':>7} {'freed MiB':>9} "
          f"{'sleep ms':>8} {'wake ms':>8} {'1st call ms':>11}  note")
    for r in rows:
        e = r["extra"] or {}
        note = "; ".join(x for x in (r["error"], r["note"]) if x)
        print(f"{r['case']:<64} {r['library']:<22} {_cell(e.get('mapped_mib'), '.1f'):>10} "
              f"{_cell(e.get('given_share'), '.1%'):>7} {_cell(e.get('freed_mib'), '.1f'):>9} "
              f"{_cell(e.get('sleep_ms'), '.2f'):>8} {_cell(e.get('wake_ms'), '.2f'):>8} "
              f"{_cell(e.get('first_ms'), '.2f'):>11}  {note}")


def _mib_cell(value):
    return f"{value:.2f}" if value is not None else "-"


def print_memory_table(rows):
    """One line per case and figure: tensorplay MiB, PyTorch MiB, their
    difference and ratio; a library's error goes in the case's first note."""
    if not rows:
        return
    by_case = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["library"]] = r
    print()
    print(f"{'memory: reserved MiB':<76} {'tensorplay':>10} {'PyTorch':>10} {'tp - PT':>9} {'tp / PT':>8}  note")
    for case, libs in by_case.items():
        tpr, ptr = libs.get("tensorplay", {}), libs.get("PyTorch", {})
        figures = [(key, label) for key, label in MEMORY_FIGURES
                   if tpr.get(key) is not None or ptr.get(key) is not None] or MEMORY_FIGURES[:1]
        note = "; ".join(f"{name}: {r['error']}" for name, r in libs.items() if r.get("error"))
        for key, label in figures:
            a, b = tpr.get(key), ptr.get(key)
            diff = f"{a - b:+.2f}" if a is not None and b is not None else "-"
            ratio = f"{a / b:.2f}" if a is not None and b is not None and b > 0 else "-"
            print(f"{case + ': ' + label:<76} {_mib_cell(a):>10} {_mib_cell(b):>10} {diff:>9} {ratio:>8}  {note}")
            note = ""
    print(MEMORY_LEGEND)


def write_chart(path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart")
        return
    rows = [r for r in RESULTS if r["section"] in ("replay", "staging", "rebind") and r["host_us"] is not None]
    if not rows:
        print("no replay or staging rows: no chart")
        return
    cases = list(dict.fromkeys((r["section"], r["case"]) for r in rows))
    libs = list(dict.fromkeys(r["library"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, len(cases) * 1.4), 5))
    width = 0.8 / max(len(libs), 1)
    for j, lib in enumerate(libs):
        vals = [next((r["host_us"] for r in rows if (r["section"], r["case"]) == c and r["library"] == lib), 0)
                for c in cases]
        ax.bar([i + j * width for i in range(len(cases))], vals, width, label=lib)
    ax.set_xticks([i + 0.4 for i in range(len(cases))])
    ax.set_xticklabels([f"{s}\n{c}" for s, c in cases], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("host time per call (us, log)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
