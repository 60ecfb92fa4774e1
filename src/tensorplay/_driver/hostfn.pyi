# SPDX-License-Identifier: Apache-2.0
from collections.abc import Callable
from typing import Any, final

@final
class HostCall: ...

def launch_host_func(fn: Callable[[], Any], stream: Any = ...) -> None: ...
