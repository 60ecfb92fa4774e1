# SPDX-License-Identifier: Apache-2.0
from typing import final

IF_NODE: int
WHILE_NODE: int
SWITCH_NODE: int
KIND_NAMES: tuple[str, ...]
MAX_SWITCH_CASES: int

@final
class ConditionalFrame: ...

@final
class Conditionals: ...
