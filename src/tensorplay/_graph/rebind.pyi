# SPDX-License-Identifier: Apache-2.0
from typing import final

@final
class Rebinder:
    @property
    def rebound(self) -> bool: ...
    @property
    def patch_calls(self) -> int: ...
    def rebindable(self) -> list[bool]: ...
