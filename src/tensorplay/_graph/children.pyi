# SPDX-License-Identifier: Apache-2.0
from typing import final

@final
class ChildHold:
    def record_stream(self, stream_handle: int) -> None: ...

@final
class GraphHold:
    @property
    def owner(self) -> object: ...
    def record_stream(self, stream_handle: int) -> None: ...

def embed_graph(device: int, stream: int, graph: int, owner: object, what: str = ...) -> None: ...
