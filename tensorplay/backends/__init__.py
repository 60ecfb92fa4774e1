# SPDX-License-Identifier: Apache-2.0
"""Backend switches, as ``torch.backends``: ``tensorplay.backends.cuda.matmul.allow_tf32``."""

from tensorplay.backends import cuda

__all__ = ["cuda"]
