// SPDX-License-Identifier: Apache-2.0
// Thread-local state of the compiled layer. Each extension module that
// includes this header gets its own copy, so only _cuda (device, bound
// context) and _stream (current streams) include it; other modules go
// through the functions those two export.
#pragma once
#include <cstdint>

#include "tp_limits.hpp"

namespace tp {
// Index of the device whose primary context this thread made current (-1: none).
inline thread_local int tls_bound_device = -1;
// The thread's current device, as cudaSetDevice's per-thread notion.
inline thread_local int tls_current_device = 0;
// The thread's current stream per device; 0 is the legacy default stream.
inline thread_local std::uintptr_t tls_current_stream[TP_MAX_DEVICES] = {0};
}  // namespace tp
