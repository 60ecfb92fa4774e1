# SPDX-License-Identifier: Apache-2.0
# Node introspection has no Python API: CUDAGraph.describe() calls its C function.
