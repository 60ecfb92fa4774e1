# SPDX-License-Identifier: Apache-2.0
from tensorplay._tensor.base cimport TensorBase


# The multi-copy kernel's table: the entry count, then (src, dst, nbytes)
# triples; blockIdx.y picks the entry, COPY_BLOCK threads per block. The
# largest table, MAX_COPY_ENTRIES entries, keeps the kernel's parameters
# under 4 KiB; COPY_TABLE_WORDS holds it.
cdef enum:
    COPY_BLOCK = 256
    MAX_COPY_ENTRIES = 128
    COPY_TABLE_WORDS = 1 + 3 * MAX_COPY_ENTRIES


cdef inline void set_copy_entry(unsigned long long* table, Py_ssize_t i, unsigned long long src,
                                unsigned long long dst, unsigned long long nbytes) noexcept nogil:
    cdef unsigned long long* e = &table[1 + 3 * i]
    e[0] = src
    e[1] = dst
    e[2] = nbytes


cdef inline size_t copy_table_bytes(Py_ssize_t entries) noexcept nogil:
    """The bytes of a table's first ``entries`` entries, with the count."""
    return sizeof(unsigned long long) * (1 + 3 * entries)


cdef inline unsigned int copy_grid_x(unsigned long long maxbytes) noexcept nogil:
    """Blocks per entry: one per 4 KiB of the largest entry, 1 to 1024."""
    return <unsigned int>min(1024, max(1, (maxbytes + 4095) // 4096))


cdef inline bint is_tensor_list(object obj) noexcept:
    """What the graph calls take as a sequence of tensors: a list or a tuple."""
    return type(obj) is list or type(obj) is tuple


cdef Py_ssize_t copy_capacity(Py_ssize_t entries) noexcept
cdef TensorBase static_tensor(object obj, int device, str api, str what)
