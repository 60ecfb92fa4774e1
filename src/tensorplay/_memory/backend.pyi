# SPDX-License-Identifier: Apache-2.0
from typing import final

class Backend:
    @property
    def device(self) -> int: ...

@final
class DriverBackend(Backend):
    def __new__(cls, device: int) -> DriverBackend: ...
