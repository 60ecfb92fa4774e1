# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs. Compiled: capture streams and modes (``streams``), the
open-capture registry (``registry``), conditional nodes (``conditionals``),
the multi-copy kernel's table (``copytable``), staging (``stager``),
rebinding (``rebind``), node descriptions (``describe``), the executable and
its launches (``replay``) and capture (``capture``). Pure Python: the public
``CUDAGraph`` and ``graph`` (``graphs``), structured conditionals, DOT, the
graph layer's kernels and ``cudagraphify`` (``cudagraphs``)."""
