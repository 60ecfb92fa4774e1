# SPDX-License-Identifier: Apache-2.0
"""Neural-network helpers: ``tensorplay.nn.functional``."""

from __future__ import annotations

from . import functional

__all__ = ["functional"]
