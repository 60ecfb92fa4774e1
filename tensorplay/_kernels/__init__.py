# SPDX-License-Identifier: Apache-2.0
"""Kernels: CUDA C generation (``codegen``), NVRTC compilation to CUBIN with the
on-disk cache (``nvrtc``), and the loaded-kernel cache and launchers
(``cache``). The ops, the graph layer and the custom kernels use these; this
package uses none of them."""
