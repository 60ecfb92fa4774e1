# SPDX-License-Identifier: Apache-2.0
"""Checked by ``mypy --strict`` (tests/api/test_typing.py): ``from tensorplay import *``
brings in the API and leaves the builtins bool, int and float alone."""

from __future__ import annotations

from typing import assert_type

from tensorplay import *  # noqa: F403


def use() -> None:
    assert_type(int("3"), int)
    assert_type(float("0.5"), float)
    assert_type(bool(0), bool)
    x = zeros(3, dtype=float32)  # noqa: F405
    assert_type(x, Tensor)  # noqa: F405
    assert_type(isinstance(x, int), bool)
    assert_type(bool_, dtype)  # noqa: F405
