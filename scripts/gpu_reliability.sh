#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The reliability run of docs/reliability.md, on a GPU machine with the project
# built and importable (pip install . in its environment). Logs go to $OUT.
#   STEPS="tests soak memcheck racecheck" FUZZ_SCALE=3 bash scripts/gpu_reliability.sh
# SKIP_FILES="test_ops_codegen.py ..." leaves files out by basename (they also run on CI);
# SANITIZE_FILES="tests/..." picks the files the sanitizers run.
set -u
OUT=${OUT:-/tmp/tp_reliability}
STEPS=${STEPS:-"tests soak memcheck racecheck"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
# graph core, conditionals, staging, cudagraphify, make_graphed_callables, CUDA ops
SANITIZE_DEFAULT="tests/graph/test_graphs.py tests/graph/test_conditional.py tests/graph/test_staging.py
  tests/graph/test_cudagraphify.py tests/graph/test_make_graphed_callables.py tests/ops/test_ops_cuda.py"
cd "$ROOT"
for step in $STEPS; do
  case $step in
    tests)   # one pytest process per file, so that a crash cannot hide the files after it
      : > "$OUT/tests.log"
      for f in tests/*/test_*.py; do
        case " ${SKIP_FILES:-} " in *" $(basename "$f") "*) continue ;; esac
        TP_FUZZ_SCALE=${FUZZ_SCALE:-5} timeout 300 pytest "$f" -q -rs --timeout 200 -p no:cacheprovider \
          > "$OUT/one.log" 2>&1
        rc=$?
        { echo "=== $f rc=$rc"; cat "$OUT/one.log"; } >> "$OUT/tests.log"
        echo "$(basename "$f" .py) rc=$rc $(tail -1 "$OUT/one.log")"
        grep -h "fuzzed calls" "$OUT/one.log"
      done
      rm -f "$OUT/one.log" ;;
    soak)
      (cd scripts && timeout 300 python3 soak.py > "$OUT/soak.log" 2>&1; echo "soak rc=$?"; tail -1 "$OUT/soak.log") ;;
    memcheck|racecheck)
      # api errors off: the tests provoke driver errors on purpose; memory and race reports stay on
      # backtraces off: the sanitizer's Python backtraces keep frames (and the
      # tensors their closures hold) alive, which the memory-baseline checks see
      timeout 240 compute-sanitizer --tool "$step" --error-exitcode 9 --report-api-errors no --show-backtrace no \
        pytest ${SANITIZE_FILES:-$SANITIZE_DEFAULT} \
        -q -p no:cacheprovider -k "not fork and not thread" ${SANITIZE_K:+-k "$SANITIZE_K"} > "$OUT/$step.log" 2>&1
      echo "$step rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$step.log" | tail -1) $(grep -E 'passed|failed' "$OUT/$step.log" | tail -1)" ;;
  esac
done
