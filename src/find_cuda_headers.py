# SPDX-License-Identifier: Apache-2.0
"""Find the CUDA headers and cuda-bindings' Cython layer in the build environment.

meson.build runs this with the build's Python:

    python find_cuda_headers.py PYPROJECT

and reads two lines from stdout: the folder holding ``cuda.h`` and the folder
holding ``cuda/bindings/cydriver.pxd``. The pin is the build requirement
``nvidia-cuda-runtime==X.Y.*`` in pyproject.toml (the one place it is written);
the headers are those of that distribution as installed where this Python
looks (pip's isolated build environment, or the environment of a
``--no-build-isolation`` build), never a system CUDA toolkit, and
``CUDA_VERSION`` in their ``cuda.h`` must be X.Y. cuda-bindings, whose
``cydriver`` the compiled modules cimport, must be the same minor.

On any failure: one message on stderr naming what to install, exit status 1.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import tomllib

HEADERS = "nvidia-cuda-runtime"
BINDINGS = "cuda-bindings"


class BuildError(Exception):
    pass


def pins(pyproject: str) -> tuple[int, int]:
    """The (major, minor) pinned by the ``X.Y.*`` build requirements on the CUDA
    headers and cuda-bindings, which must agree."""
    with open(pyproject, "rb") as f:
        requires = tomllib.load(f)["build-system"]["requires"]
    found = {}
    for req in requires:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*(\d+)\.(\d+)\.\*\s*", req)
        if m and m.group(1).lower().replace("_", "-") in (HEADERS, BINDINGS):
            found[m.group(1).lower().replace("_", "-")] = (int(m.group(2)), int(m.group(3)))
    for name in (HEADERS, BINDINGS):
        if name not in found:
            raise BuildError(f"{pyproject}: [build-system] requires must pin {name}==X.Y.* "
                             f"(the CUDA minor version tensorplay is built for)")
    if found[HEADERS] != found[BINDINGS]:
        raise BuildError(f"{pyproject}: the build requirements pin {HEADERS} "
                         f"{'.'.join(map(str, found[HEADERS]))} and {BINDINGS} "
                         f"{'.'.join(map(str, found[BINDINGS]))}: they must pin the same minor")
    return found[HEADERS]


def cuda_version_of(header: str) -> tuple[int, int]:
    with open(header, encoding="utf-8", errors="replace") as f:
        m = re.search(r"^#define\s+CUDA_VERSION\s+(\d+)", f.read(), re.MULTILINE)
    if not m:
        raise BuildError(f"{header} defines no CUDA_VERSION")
    v = int(m.group(1))                 # 13050 for CUDA 13.5
    return v // 1000, v % 1000 // 10


def distribution_files(name: str, install: str) -> tuple[importlib.metadata.Distribution, list]:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"{name} is not installed in the build environment ({sys.executable}): "
                         f"pip install \"{install}\", or build with pip's default build isolation, "
                         f"which installs it") from None
    return dist, list(dist.files or [])


def find(pyproject: str) -> tuple[str, str]:
    major, minor = pins(pyproject)
    want = f"{major}.{minor}"
    install = f"{HEADERS}=={want}.*"

    dist, files = distribution_files(HEADERS, install)
    headers = [f for f in files if str(f).replace(os.sep, "/").endswith("/include/cuda.h")]
    if not headers:
        raise BuildError(f"{HEADERS} {dist.version} holds no include/cuda.h: pip install \"{install}\"")
    header = os.path.abspath(str(headers[0].locate()))
    if not os.path.isfile(header):
        raise BuildError(f"{header} is listed by {HEADERS} {dist.version} but missing: "
                         f"pip install --force-reinstall \"{install}\"")
    got = cuda_version_of(header)
    if got != (major, minor):
        raise BuildError(f"{header} is CUDA {got[0]}.{got[1]} ({HEADERS} {dist.version}); tensorplay "
                         f"builds against CUDA {want}: pip install \"{install}\"")

    install = f"{BINDINGS}=={want}.*"
    dist, files = distribution_files(BINDINGS, install)
    if not dist.version.startswith(want + "."):
        raise BuildError(f"{BINDINGS} {dist.version} is installed in the build environment; tensorplay "
                         f"cimports the Cython layer of {want}: pip install \"{install}\"")
    pxd = [f for f in files if str(f).replace(os.sep, "/") == "cuda/bindings/cydriver.pxd"]
    if not pxd:
        raise BuildError(f"{BINDINGS} {dist.version} holds no cuda/bindings/cydriver.pxd: "
                         f"pip install \"{install}\"")
    root = os.path.abspath(str(pxd[0].locate()))
    for _ in range(3):                  # .../cuda/bindings/cydriver.pxd -> ...
        root = os.path.dirname(root)
    return os.path.dirname(header), root


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} PYPROJECT", file=sys.stderr)
        return 2
    try:
        include, bindings_root = find(argv[1])
    except BuildError as exc:
        print(f"tensorplay build: {exc}", file=sys.stderr)
        return 1
    print(include)
    print(bindings_root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
