# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs: capture, conditional nodes, replay, staging and rebinding
(compiled), the public ``CUDAGraph`` and ``graph`` (``graphs``), structured
conditionals, descriptions and DOT, and ``cudagraphify`` (``cudagraphs``)."""
