// SPDX-License-Identifier: Apache-2.0
// The C entry points another library's allocator finds with dlsym in
// tensorplay/_memory/vmm (PyTorch's CUDAPluggableAllocator: alloc(size,
// device, stream) and free(ptr, size, device, stream)). They forward to the
// Cython functions vmm.pyx installs at import; included by vmm.pyx only.
#pragma once
#include <cstddef>

typedef void* (*tp_alloc_hook)(size_t, int, void*);
typedef void (*tp_free_hook)(void*, size_t, int, void*);

static tp_alloc_hook tp_alloc_impl = nullptr;
static tp_free_hook tp_free_impl = nullptr;

static inline void tp_install_hooks(tp_alloc_hook a, tp_free_hook f) {
    tp_alloc_impl = a;
    tp_free_impl = f;
}

extern "C" __attribute__((visibility("default"))) void* tensorplay_torch_malloc(size_t size, int device,
                                                                               void* stream) {
    return tp_alloc_impl ? tp_alloc_impl(size, device, stream) : nullptr;
}

extern "C" __attribute__((visibility("default"))) void tensorplay_torch_free(void* ptr, size_t size, int device,
                                                                            void* stream) {
    if (tp_free_impl) tp_free_impl(ptr, size, device, stream);
}
