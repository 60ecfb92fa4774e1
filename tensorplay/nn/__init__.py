# SPDX-License-Identifier: Apache-2.0
"""Neural-network helpers: ``tensorplay.nn.functional``."""

from __future__ import annotations

from tensorplay.nn import functional

__all__ = ["functional"]
