# SPDX-License-Identifier: Apache-2.0
from typing import final

def staged_builds() -> int: ...

@final
class Stager:
    @property
    def one_launch(self) -> bool: ...
