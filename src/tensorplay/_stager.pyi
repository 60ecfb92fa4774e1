# SPDX-License-Identifier: Apache-2.0
STAGE_CAPACITIES: tuple[int, ...]

def staged_builds() -> int: ...

class Stager:
    @property
    def one_launch(self) -> bool: ...
