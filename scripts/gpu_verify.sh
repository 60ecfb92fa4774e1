#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A GPU machine's verification run in one command, for machines lent by the
# minute: the whole test suite (shuffled), the performance gate and the
# benchmarks the open work asks for, each under its own time limit, every
# result in one of at most eight files under OUTDIR:
#   tests.log    the suite (scripts/gpu_tests.sh), with the GPU's name first
#   gate.json    gate.txt    benchmarks/gate.py
#   profile.txt  benchmarks/profile_nodes_vs_ncu.py
#   bench.txt    probe_lazy_launch, probe_module_loading, first_call_time, peer_memory_time
#   decode.txt   examples/decode_loop.py --transformers-only, compiled_decode.py
#   capture.txt  probe_serving_phases.py, profile_capture_phases.py (capture time by phase)
# Usage (tensorplay installed for $PYTHON):
#   PYTHON=python3 bash scripts/gpu_verify.sh OUTDIR [PARTS]
# PARTS: any of suite gate profile bench decode capture (default all but
# capture; about 12 minutes on an H100: pass fewer to fit a shorter limit).
# Environment: TENSORPLAY_TEST_SHUFFLE (the suite's order; default 1), TP_TEST_WORKERS (default 12).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_verify.sh OUTDIR [PARTS]}
parts=${2:-suite gate profile bench decode}
mkdir -p "$out"
out=$(cd "$out" && pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

has() { [[ " $parts " == *" $1 "* ]]; }

if has suite; then
    nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/tests.log" 2>&1
    TENSORPLAY_TEST_SHUFFLE=${TENSORPLAY_TEST_SHUFFLE:-1} PYTHON=$PY TP_TEST_WORKERS=${TP_TEST_WORKERS:-12} \
        timeout 300 bash scripts/gpu_tests.sh --durations=15 >> "$out/tests.log" 2>&1
    echo "suite rc $?" >> "$out/tests.log"
fi
cd benchmarks
if has gate; then
    timeout 100 "$PY" gate.py --out "$out/gate" > "$out/gate.txt" 2>&1
    echo "gate rc $?" >> "$out/gate.txt"
fi
if has profile; then
    timeout 90 "$PY" profile_nodes_vs_ncu.py --replays 10 > "$out/profile.txt" 2>&1
    echo "profile rc $?" >> "$out/profile.txt"
fi
if has bench; then
    for cmd in "probe_lazy_launch.py --repeats 60" "probe_module_loading.py --repeats 30" \
               "first_call_time.py --reps 1" "peer_memory_time.py"; do
        echo "== $cmd" >> "$out/bench.txt"
        # shellcheck disable=SC2086
        timeout 70 "$PY" $cmd >> "$out/bench.txt" 2>&1
        echo "rc $?" >> "$out/bench.txt"
    done
fi
if has capture; then
    echo "== probe_serving_phases.py --rounds 5" >> "$out/capture.txt"
    timeout 100 "$PY" probe_serving_phases.py --rounds 5 >> "$out/capture.txt" 2>&1
    echo "rc $?" >> "$out/capture.txt"
    echo "== profile_capture_phases.py --nodes 10 100 --repeats 60" >> "$out/capture.txt"
    timeout 60 "$PY" profile_capture_phases.py --nodes 10 100 --repeats 60 >> "$out/capture.txt" 2>&1
    echo "rc $?" >> "$out/capture.txt"
fi
if has decode; then
    echo "== decode_loop.py --transformers-only" >> "$out/decode.txt"
    timeout 60 "$PY" ../examples/decode_loop.py --transformers-only >> "$out/decode.txt" 2>&1
    echo "rc $?" >> "$out/decode.txt"
    echo "== compiled_decode.py --tokens 32 --rounds 3" >> "$out/decode.txt"
    timeout 150 "$PY" compiled_decode.py --tokens 32 --rounds 3 >> "$out/decode.txt" 2>&1
    echo "rc $?" >> "$out/decode.txt"
fi
