# SPDX-License-Identifier: Apache-2.0
from typing import Any

from tensorplay._tensor.base import TensorBase

DLPACK_DEVICE_CPU: int
DLPACK_DEVICE_CUDA: int

def to_capsule(t: TensorBase, versioned: bool) -> Any: ...

class DLPackOwner: ...

def dlpack_import(capsule: Any) -> tuple[Any, ...]: ...
