# SPDX-License-Identifier: Apache-2.0
from tensorplay._driver.stream import Stream

CAPTURE_MODES: dict[str, int]

def warmup_stream(device: int) -> Stream: ...
def is_stream_capturing(stream: int, device: int) -> bool: ...
