# SPDX-License-Identifier: Apache-2.0
from typing import final

@final
class ChildHold:
    def record_stream(self, stream_handle: int) -> None: ...
