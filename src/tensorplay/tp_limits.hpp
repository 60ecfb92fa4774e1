// SPDX-License-Identifier: Apache-2.0
// Limits shared by the C++ headers and the Cython modules (via _cuda.pxd):
// each is defined here only.
#pragma once

// Devices tensorplay addresses; higher ordinals are not used.
#define TP_MAX_DEVICES 64
