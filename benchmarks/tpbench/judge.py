# SPDX-License-Identifier: Apache-2.0
"""The performance gate's verdicts: measured ratios against a committed baseline.

Pure Python with no import of its own package, so that it runs (and is
tested) without a GPU; gate.py measures the ratios and calls it.

A baseline file is JSON: ``{"about": ..., "rows": {NAME: ROW}}`` where ROW is

- ``baseline``: the ratio measured before (a number), or null for "no
  baseline yet": the row is reported and never fails;
- ``tolerance``: how much worse the ratio may get, relative to the
  baseline (0.1: up to 10 % above it);
- ``higher_is_better`` (optional, false by default): every row's ratio is
  lower-is-better unless this says otherwise;
- ``source`` and ``date``: where the baseline came from (kept as they are).

A row fails ("worse") when its ratio is beyond ``baseline * (1 + tolerance)``
(``baseline * (1 - tolerance)`` for a higher-is-better row), and when a row
with a baseline was not measured (the gate cannot vouch for it). A row
beyond the tolerance the other way is "better": it passes, and suggests
updating the baseline.
"""

from __future__ import annotations

import fnmatch
import json
import math

# verdicts; only the first two fail the gate
WORSE, NOT_MEASURED, OK, BETTER, NO_BASELINE = "WORSE", "not measured", "ok", "better", "no baseline"
FAILING = (WORSE, NOT_MEASURED)
# the tolerance a row gets when --update-baseline adds it to the file
DEFAULT_TOLERANCE = 0.10


class BaselineError(ValueError):
    """A baseline file, or a --degrade request, that cannot be used."""


def load_baseline(path):
    """Read and check a baseline file.

    Parameters
    ----------
    path : str
        The JSON file (see the module's docstring).

    Returns
    -------
    dict
        The whole document; its ``"rows"`` maps each row's name to its entry.

    Raises
    ------
    BaselineError
        When the file is not JSON or a row lacks a usable baseline or tolerance.
    """
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise BaselineError(f"cannot read the baseline {path}: {exc}") from exc
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, dict):
        raise BaselineError(f"{path}: no \"rows\" object")
    for name, row in rows.items():
        base, tol = row.get("baseline"), row.get("tolerance")
        if base is not None and not (isinstance(base, (int, float)) and math.isfinite(base) and base >= 0):
            raise BaselineError(f"{path}: row {name!r}: baseline must be a number >= 0 or null, not {base!r}")
        if not (isinstance(tol, (int, float)) and 0 <= tol < 10):
            raise BaselineError(f"{path}: row {name!r}: tolerance must be a number in [0, 10), not {tol!r}")
    return doc


def parse_degrade(specs):
    """Turn ``ROW=FACTOR`` requests into (pattern, factor) pairs.

    Parameters
    ----------
    specs : list of str
        Each ``ROW=FACTOR``: ROW a row's name or an fnmatch pattern (``*``,
        ``?``), FACTOR a positive number that the row's measured ratio is
        multiplied by (above 1 makes a lower-is-better row worse).

    Returns
    -------
    list of (str, float)

    Raises
    ------
    BaselineError
        When a request is not of that form.
    """
    out = []
    for spec in specs or ():
        pattern, sep, factor = spec.rpartition("=")     # names may hold '=', the factor never does
        try:
            value = float(factor)
        except ValueError:
            value = math.nan
        if not sep or not pattern or not (math.isfinite(value) and value > 0):
            raise BaselineError(f"--degrade {spec!r}: expected ROW=FACTOR with a positive FACTOR")
        out.append((pattern, value))
    return out


def apply_degrade(ratios, degrade):
    """Multiply the ratios of the rows that ``degrade`` names: the gate's self-test.

    Parameters
    ----------
    ratios : dict
        Row name to measured ratio (None where not measured).
    degrade : list of (str, float)
        From ``parse_degrade``.

    Returns
    -------
    (dict, dict)
        The new ratios, and each degraded row's factor (the product when
        several patterns match it).

    Raises
    ------
    BaselineError
        When a pattern matches no row (a typo would otherwise test nothing).
    """
    out, factors = dict(ratios), {}
    for pattern, factor in degrade:
        hits = [name for name in ratios if name == pattern or fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            raise BaselineError(f"--degrade {pattern!r}: no row of that name (see the table's names)")
        for name in hits:
            factors[name] = factors.get(name, 1.0) * factor
            if out[name] is not None:
                out[name] = out[name] * factor
    return out, factors


def limit_of(row):
    """The worst ratio ``row`` (a baseline entry with a baseline) still passes with."""
    sign = -1.0 if row.get("higher_is_better") else 1.0
    return row["baseline"] * (1.0 + sign * row["tolerance"])


def judge_row(ratio, row):
    """The verdict on one measured ``ratio`` (None: not measured) against its baseline entry ``row`` (or None)."""
    if row is None or row.get("baseline") is None:
        return NO_BASELINE
    if ratio is None or math.isnan(ratio):
        return NOT_MEASURED
    # the limits as the table prints them: a ratio right at one is within it
    worst, best = limit_of(row), limit_of(dict(row, higher_is_better=not row.get("higher_is_better")))
    if row.get("higher_is_better"):
        worst, best, ratio = -worst, -best, -ratio      # one comparison for both directions
    if ratio > worst:
        return WORSE
    if ratio < best:
        return BETTER
    return OK


def judge(ratios, baseline_rows, what=None, notes=None, degraded=None):
    """Judge every row measured or held in the baseline.

    Parameters
    ----------
    ratios : dict
        Row name to measured ratio (None where not measured).
    baseline_rows : dict
        The baseline document's ``"rows"``.
    what, notes, degraded : dict, optional
        Per row: how it is measured, why it was not measured, its --degrade factor.

    Returns
    -------
    list of dict
        One verdict a row, measured rows first in their order, then the
        baseline's rows that were not measured: ``name``, ``what``,
        ``ratio``, ``baseline``, ``tolerance``, ``higher_is_better``,
        ``limit``, ``verdict``, ``failed``, ``note``, ``degraded_by``.
    """
    what, notes, degraded = what or {}, notes or {}, degraded or {}
    names = list(ratios) + [name for name in baseline_rows if name not in ratios]
    out = []
    for name in names:
        row = baseline_rows.get(name)
        ratio = ratios.get(name)
        verdict = judge_row(ratio, row)
        has_base = row is not None and row.get("baseline") is not None
        out.append({"name": name, "what": what.get(name), "ratio": ratio,
                    "baseline": row.get("baseline") if row else None,
                    "tolerance": row.get("tolerance") if row else None,
                    "higher_is_better": bool(row.get("higher_is_better")) if row else False,
                    "limit": limit_of(row) if has_base else None, "verdict": verdict,
                    "failed": verdict in FAILING, "note": notes.get(name), "degraded_by": degraded.get(name)})
    return out


def exit_code(verdicts):
    """0 when no row failed, else 1."""
    return 1 if any(v["failed"] for v in verdicts) else 0


def failed_names(verdicts):
    return [v["name"] for v in verdicts if v["failed"]]


def _num(value, fmt=".3f"):
    return "-" if value is None else format(value, fmt)


def format_table(verdicts):
    """The gate's table, one line a row, then a line naming every row that failed."""
    width = max([len(v["name"]) for v in verdicts] + [4])
    lines = [f"{'row':<{width}} {'ratio':>8} {'baseline':>8} {'tol':>5} {'limit':>8}  {'verdict':<12}  how measured"]
    for v in verdicts:
        direction = "higher is better; " if v["higher_is_better"] else ""
        extra = [x for x in (v["note"], f"degraded x{v['degraded_by']:g}" if v["degraded_by"] else None) if x]
        tol = "-" if v["tolerance"] is None else f"{v['tolerance']:.0%}"
        lines.append(f"{v['name']:<{width}} {_num(v['ratio']):>8} {_num(v['baseline']):>8} {tol:>5} "
                     f"{_num(v['limit']):>8}  {v['verdict']:<12}  {direction}{v['what'] or '-'}"
                     + (f" [{'; '.join(extra)}]" if extra else ""))
    failed = failed_names(verdicts)
    if failed:
        lines.append(f"gate FAILED: {len(failed)} row(s) worse than the baseline allows or not measured: "
                     + "; ".join(failed))
    else:
        lines.append(f"gate passed: {len(verdicts)} rows, none worse than its tolerance")
    return "\n".join(lines)


def updated_baseline(doc, ratios, source, date):
    """A copy of the baseline document with each measured ratio as the row's new baseline.

    Tolerances, directions and the rows that were not measured are kept; a
    measured row the file lacks is added with ``DEFAULT_TOLERANCE``.

    Parameters
    ----------
    doc : dict
        The baseline document.
    ratios : dict
        Row name to measured ratio (None: not measured, left as it was).
    source, date : str
        What measured the ratios, and when; written on every updated row.

    Returns
    -------
    dict
    """
    new = json.loads(json.dumps(doc))
    rows = new.setdefault("rows", {})
    for name, ratio in ratios.items():
        if ratio is None or not math.isfinite(ratio):
            continue
        row = rows.setdefault(name, {"tolerance": DEFAULT_TOLERANCE, "note": "added by --update-baseline: "
                                                                            "review its tolerance"})
        row["baseline"] = round(ratio, 4)
        row["source"] = source
        row["date"] = date
    return new


def write_baseline(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
