# SPDX-License-Identifier: Apache-2.0
"""Operations on tensors: generated CUDA kernels and their NumPy counterparts."""
