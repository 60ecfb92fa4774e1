# SPDX-License-Identifier: Apache-2.0
"""Kernels: CUDA C generation (``codegen``), NVRTC compilation to CUBIN with the
on-disk cache (``nvrtc``), and the loaded-kernel cache and launchers
(``cache``), and the kernel families: elementwise launches, reductions
(``reduce_kernels``), random numbers (``philox``, the NumPy reference and
CPU path, and ``random_kernels``), sampling and sorting. The ops, the graph
layer and the custom kernels use these; this package uses none of them."""
