# SPDX-License-Identifier: Apache-2.0
from typing import Any, final

@final
class LaunchPacker:
    def __init__(self, f: Any, device: int, n: int, nptrs: int, kinds: Any, geom: bytes, grid: Any,
                 block: Any) -> None: ...
    def launch(self, ptrs: Any, scalars: Any, stream: int | None = ...) -> None: ...
    def launch_operands(self, out: Any, operands: tuple[Any, ...], tensor_pos: tuple[int, ...],
                        scalar_pos: tuple[int, ...]) -> None: ...
