#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite on a machine with one GPU, in two phases:
#   1. everything not marked `serial`, in pytest-xdist worker processes that
#      share the GPU (--dist load: tests go to whichever worker is free, so a
#      file of slow compilations is spread over all of them);
#   2. the tests marked `serial` (they measure device-wide memory or time, or
#      fill the device), alone, after the workers are gone.
# Both phases share one kernel cache, so a kernel NVRTC compiled for one worker
# is read from disk by the others and by phase 2. Run it after setup:
#   bash scripts/setup.sh && .venv/bin/pip install -q pytest-xdist && bash scripts/gpu_tests.sh [pytest options]
# (pytest options such as -x, -k EXPR, --durations=30).
# Environment:
#   TP_TEST_WORKERS=N   workers of phase 1 (default: half the cores, 2 to 8; 1 runs it without xdist)
#   TP_TEST_DIST=MODE   pytest-xdist's --dist (default load; loadfile keeps each file in one worker,
#                       which halves the speed: a few files hold most of the NVRTC compilations)
#   TP_TEST_SCOPE=gpu   only the tests marked cuda or multigpu (default: all, the CPU tests too)
#   PYTHON=...          the interpreter that has tensorplay installed (default .venv/bin/python, else python3)
#   TENSORPLAY_TEST_CACHE_DIR=/folder  keeps the kernel cache (default: a temporary one, removed at the end)
# Exit status: 0 when both phases pass, else the first failing phase's status.
# Options go to both phases; set the workers with TP_TEST_WORKERS, not -n.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
# -P: the repository root (with the source folder tensorplay/) stays off
# sys.path, so the installed package is tested; pytest-xdist's workers get the
# same sys.path as this process.
PYTEST=("$PY" -P -m pytest tests -q -rfEs)

cores=$(nproc 2>/dev/null || echo 2)
default_workers=$((cores / 2))
[ "$default_workers" -gt 8 ] && default_workers=8
[ "$default_workers" -lt 2 ] && default_workers=2
workers=${TP_TEST_WORKERS:-$default_workers}
dist=${TP_TEST_DIST:-load}

if [ "$workers" -gt 1 ] && ! "$PY" -c "import xdist" 2>/dev/null; then
    echo "gpu_tests: pytest-xdist is not installed for $PY: phase 1 runs in one process" \
         "(install it there, or set PYTHON to a python with tensorplay and pytest-xdist, for $workers workers)"
    workers=1
fi
# A GPU in exclusive-process compute mode takes one process at a time
if [ "$workers" -gt 1 ] && command -v nvidia-smi >/dev/null 2>&1 \
        && nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | grep -qi exclusive; then
    echo "gpu_tests: the GPU is in exclusive-process compute mode: phase 1 runs in one process"
    workers=1
fi

case ${TP_TEST_SCOPE:-all} in
    gpu) parallel_marks="(cuda or multigpu) and not serial"; serial_marks="(cuda or multigpu) and serial" ;;
    all) parallel_marks="not serial"; serial_marks="serial" ;;
    *) echo "gpu_tests: TP_TEST_SCOPE is 'all' or 'gpu', not '${TP_TEST_SCOPE}'" >&2; exit 2 ;;
esac

# One kernel cache for every process of both phases (conftest.py reads it)
if [ -z "${TENSORPLAY_TEST_CACHE_DIR:-}" ]; then
    TENSORPLAY_TEST_CACHE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tensorplay-test-cache-XXXXXX")
    trap 'rm -rf "$TENSORPLAY_TEST_CACHE_DIR"' EXIT
fi
export TENSORPLAY_TEST_CACHE_DIR

now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

t0=$(now)
if [ "$workers" -gt 1 ]; then
    # BLAS and OpenMP threads of each worker: its share of the cores, not all of them each
    threads=$((cores / workers > 0 ? cores / workers : 1))
    how="$workers workers, --dist $dist"
    echo "gpu_tests: phase 1: -m \"$parallel_marks\", $how (kernel cache $TENSORPLAY_TEST_CACHE_DIR)"
    env OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-$threads}" \
        MKL_NUM_THREADS="${MKL_NUM_THREADS:-$threads}" \
        "${PYTEST[@]}" -m "$parallel_marks" -p xdist -n "$workers" --dist "$dist" "$@"
else
    how="one process"
    echo "gpu_tests: phase 1: -m \"$parallel_marks\", $how (kernel cache $TENSORPLAY_TEST_CACHE_DIR)"
    "${PYTEST[@]}" -m "$parallel_marks" "$@"
fi
rc1=$?
t1=$(now)
echo "gpu_tests: phase 1 ($how) took $(took "$t0" "$t1") s, exit status $rc1"

echo "gpu_tests: phase 2: -m \"$serial_marks\", alone"
"${PYTEST[@]}" -m "$serial_marks" "$@"
rc2=$?
t2=$(now)
echo "gpu_tests: phase 2 (serial) took $(took "$t1" "$t2") s, exit status $rc2"

# 5: no test selected (extra options may leave a phase empty)
[ "$rc1" = 5 ] && rc1=0
[ "$rc2" = 5 ] && rc2=0
echo "gpu_tests: both phases took $(took "$t0" "$t2") s"
if [ "$rc1" != 0 ]; then exit "$rc1"; fi
exit "$rc2"
