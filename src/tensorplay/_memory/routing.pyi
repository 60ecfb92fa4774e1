# SPDX-License-Identifier: Apache-2.0
from typing import final

@final
class CaptureRoutes:
    def __len__(self) -> int: ...
