# SPDX-License-Identifier: Apache-2.0
"""rebind_and_launch's machinery: replay a graph with its kernels reading and
writing other tensors than the ones captured, without copying them.

A Rebinder is built once per graph and list of static tensors. It walks the
captured graph (conditional bodies too) and reads every kernel node's
argument buffer (cuGraphKernelNodeGetParams, laid out by cuFuncGetParamInfo).
An 8-byte argument of one of our kernels that points into a static tensor is
a slot: at a call, the slot gets the new tensor's address plus the same
offset, and each node whose slots changed is given its new buffer with
cuGraphExecKernelNodeSetParams before the launch, in one ``nogil`` block.

A static tensor that something else in the graph also uses (a foreign kernel
such as cuBLAS's, a pointer inside a struct argument, a memcpy or memset
node, a child graph, a node the driver refuses to update) is not rebound: its
new input is copied onto it before the launch and its new output copied from
it after, by the multi-tensor copy kernel (``copy`` for what that cannot
take). Kernels that reach a static tensor through another tensor's address
(a view's base) are not seen; they keep reading the static tensor.
"""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcmp, memcpy, memset
from libcpp.vector cimport vector

from tensorplay._driver.context cimport check, ensure_context
from tensorplay._driver.launch cimport Function, fill_launch_extra, is_own_function
from tensorplay._graph.copytable cimport (COPY_BLOCK, copy_capacity, copy_grid_x, copy_table_bytes, is_tensor_list,
                                          set_copy_entry, static_tensor)
from tensorplay._tensor.base cimport DEVICE_CUDA, MAX_NDIM, TensorBase

from tensorplay._graph.foreign import graph_tensor

DEF MAX_PARAMS = 4096

cdef int read_kernel_args(cydriver.CUDA_KERNEL_NODE_PARAMS* kp, vector[char]& buf,
                    vector[size_t]& offsets, vector[size_t]& sizes) except -1:
    """The packed argument buffer of a kernel node, with its arguments' offsets
    and sizes where the driver knows them; returns one of ARGS_*."""
    cdef size_t i = 0, off = 0, sz = 0, total = 0, nbytes = 0
    cdef void** p
    cdef char* data = NULL
    cdef cydriver.CUresult r
    offsets.clear()
    sizes.clear()
    buf.clear()
    while i < MAX_PARAMS:
        if kp.func != NULL:
            r = cydriver.cuFuncGetParamInfo(kp.func, i, &off, &sz)
        elif kp.kern != NULL:
            r = cydriver.cuKernelGetParamInfo(kp.kern, i, &off, &sz)
        else:
            break
        if r != cydriver.CUDA_SUCCESS:
            break
        offsets.push_back(off)
        sizes.push_back(sz)
        if off + sz > total:
            total = off + sz
        i += 1
    cdef bint laid_out = i > 0
    if kp.kernelParams != NULL:
        if not laid_out:
            return ARGS_UNREADABLE
        buf.assign(total, 0)
        for i in range(offsets.size()):
            memcpy(buf.data() + offsets[i], kp.kernelParams[i], sizes[i])
        return ARGS_LAID_OUT
    if kp.extra != NULL:
        p = kp.extra
        while p[0] != <void*>cydriver.CU_LAUNCH_PARAM_END:
            if p[0] == <void*>cydriver.CU_LAUNCH_PARAM_BUFFER_POINTER:
                data = <char*>p[1]
            elif p[0] == <void*>cydriver.CU_LAUNCH_PARAM_BUFFER_SIZE:
                nbytes = (<size_t*>p[1])[0]
            p += 2
        if nbytes and data == NULL:
            return ARGS_UNREADABLE
        buf.assign(data, data + nbytes)
        if laid_out and total > nbytes:
            return ARGS_RAW
        return ARGS_LAID_OUT if laid_out else ARGS_RAW
    return ARGS_LAID_OUT if not laid_out or total == 0 else ARGS_UNREADABLE


@cython.final
cdef class Rebinder:
    """Rebinds one list of static tensors of one graph (see the module)."""

    def __cinit__(self):
        self._exec = NULL
        self._cap = 0
        self.rebound = False
        self.patch_calls = 0

    cdef bint holds(self, object static_inputs, object static_outputs) noexcept:
        """True when these are the very tensors this rebinder was built for."""
        cdef Py_ssize_t k, n_out
        cdef tuple mine = self._given_statics
        if not is_tensor_list(static_inputs) or not is_tensor_list(static_outputs):
            return False
        n_out = len(static_outputs)
        if len(static_inputs) != self._n_in or self._n_in + n_out != self._n:
            return False
        for k in range(self._n_in):
            if static_inputs[k] is not mine[k]:
                return False
        for k in range(n_out):
            if static_outputs[k] is not mine[self._n_in + k]:
                return False
        return True

    def rebindable(self):
        """Per static tensor (inputs, then outputs): rebound in place (True) or copied (False)."""
        return [bool(self._rebindable[k]) for k in range(self._n)]

    cdef int launch(self, object inputs, object outputs, cydriver.CUstream stream) except -1:
        """Check every tensor against its static one, bind the rebindable ones,
        copy the others in (inputs) and out (outputs) around the launch."""
        cdef Py_ssize_t k, n = self._n, n_in = self._n_in, nin_fast = 0, nout_fast = 0
        cdef TensorBase t
        cdef uintptr_t* ptrs
        cdef uintptr_t* given
        cdef unsigned long long in_max = 0, out_max = 0
        cdef list slow_in = None, slow_out = None
        cdef list views = None          # the tensors as tensorplay views, where some are foreign
        if not is_tensor_list(inputs) or not is_tensor_list(outputs):
            raise TypeError("rebind_and_launch(static_inputs, inputs, static_outputs, outputs) takes "
                            "lists or tuples of tensors")
        if len(inputs) != n_in or len(inputs) + len(outputs) != n:
            raise ValueError(f"rebind_and_launch: {n_in} static inputs and {n - n_in} static outputs but "
                             f"{len(inputs)} inputs and {len(outputs)} outputs")
        # member buffers: no allocation per call
        self._ptrs.resize(n)
        self._given.resize(n)
        ptrs = self._ptrs.data()
        given = self._given.data()
        for k in range(n):
            obj = inputs[k] if k < n_in else outputs[k - n_in]
            if not isinstance(obj, TensorBase):
                obj = graph_tensor(obj)          # a PyTorch or CuPy tensor: a view of its memory
                if not isinstance(obj, TensorBase):
                    raise TypeError(f"rebind_and_launch: {self._name(k)} is a {type(obj).__name__}, not a tensor")
                if views is None:
                    views = list(inputs) + list(outputs)
                views[k] = obj
            t = <TensorBase>obj
            self._check_layout(t, k)
            ptrs[k] = t._ptr
            given[k] = t._ptr
            if t._ptr == self._static_ptr[k]:
                continue
            if self._rebindable[k] and (t._ptr & (self._align[k] - 1)) == 0:
                continue
            # copied (not rebindable, or less aligned than the static, whose
            # alignment chose the kernels' vector width): the graph keeps the
            # static's address
            ptrs[k] = self._static_ptr[k]
            if self._contiguous[k] and self._nbytes[k] and self._copy_fn is not None:
                if k < n_in and nin_fast < self._cap:
                    set_copy_entry(self._in_table, nin_fast, t._ptr, self._static_ptr[k], self._nbytes[k])
                    nin_fast += 1
                    in_max = max(in_max, self._nbytes[k])
                    continue
                if k >= n_in and nout_fast < self._cap:
                    set_copy_entry(self._out_table, nout_fast, self._static_ptr[k], t._ptr, self._nbytes[k])
                    nout_fast += 1
                    out_max = max(out_max, self._nbytes[k])
                    continue
            if not self._nbytes[k]:
                continue
            if k < n_in:
                if slow_in is None:
                    slow_in = []
                slow_in.append(k)
            else:
                if slow_out is None:
                    slow_out = []
                slow_out.append(k)
        # the same addresses as last call: checked then, and the tensors kept
        # then hold this memory
        cdef bint same = self._bound is not None and \
            memcmp(given, self._given_prev.data(), n * sizeof(uintptr_t)) == 0
        if not same:
            self._check_aliasing(given, ptrs)
        if slow_in is not None:
            for k in slow_in:
                self._copy(self._statics[k], inputs[k] if views is None else views[k])
        previous = self._bound
        if not same:
            # the nodes may point at these before the launch succeeds: keep
            # them alive with the previous ones until it has
            if views is None:
                self._bound = (tuple(inputs), tuple(outputs), previous)
            else:       # the tensorplay views, which keep the foreign tensors alive
                self._bound = (tuple(views[:n_in]), tuple(views[n_in:]), previous)
        self._bind(ptrs)
        self._in_table[0] = nin_fast
        self._out_table[0] = nout_fast
        with nogil:
            ensure_context(self._device)
            self._push_dirty()
            if nin_fast:
                self._copy_fn.c_launch(copy_grid_x(in_max), <unsigned int>nin_fast, 1, COPY_BLOCK, 1, 1, 0,
                                       stream, <const void*>self._in_table, self._table_size)
            check(cydriver.cuGraphLaunch(self._exec, stream))
            if nout_fast:
                self._copy_fn.c_launch(copy_grid_x(out_max), <unsigned int>nout_fast, 1, COPY_BLOCK, 1, 1, 0,
                                       stream, <const void*>self._out_table, self._table_size)
        if slow_out is not None:
            for k in slow_out:
                self._copy(outputs[k - n_in] if views is None else views[k], self._statics[k])
        if not same:
            self._bound = self._bound[:2]
            self._given_prev.swap(self._given)
            if previous is not None:
                _retire(previous, self._bound, <uintptr_t>stream)
        self._last_stream = <uintptr_t>stream
        return 0

    cdef int _check_aliasing(self, const uintptr_t* given, const uintptr_t* ptrs) except -1:
        """ValueError when two of the tensors passed (at ``given``) overlap, or
        one overlaps a static tensor this call copies into or out of (``ptrs``
        holds the static's address for those): the captured kernels were made
        for distinct memory, and a copy-in would overwrite what another
        replacement reads."""
        cdef Py_ssize_t a, b, n = self._n
        cdef uintptr_t alo, ahi, blo, bhi
        for a in range(n):
            if self._nbytes[a] == 0:
                continue
            alo = given[a] - self._lo_off[a]
            ahi = given[a] + self._hi_off[a]
            for b in range(n):
                if b == a or self._nbytes[b] == 0:
                    continue
                if b > a:
                    blo = given[b] - self._lo_off[b]
                    bhi = given[b] + self._hi_off[b]
                    if alo < bhi and blo < ahi:
                        raise ValueError(f"rebind_and_launch: {self._name(a)} and {self._name(b)} overlap in "
                                         f"memory; the graph was captured on distinct tensors")
                if ptrs[b] == self._static_ptr[b] and given[b] != self._static_ptr[b]:
                    blo = self._static_ptr[b] - self._lo_off[b]
                    bhi = self._static_ptr[b] + self._hi_off[b]
                    if alo < bhi and blo < ahi:
                        raise ValueError(f"rebind_and_launch: {self._name(a)} overlaps the static tensor of "
                                         f"{self._name(b)}, which this call copies; pass distinct memory")
        return 0

    cdef str _name(self, Py_ssize_t k):
        """The argument's name in messages (made only for one: formatting costs per call)."""
        return f"inputs[{k}]" if k < self._n_in else f"outputs[{k - self._n_in}]"

    cdef int _check_layout(self, TensorBase t, Py_ssize_t k) except -1:
        cdef int i
        if t._device_type == DEVICE_CUDA and t._device_index == self._device and \
                t._dtype_code == self._dtype[k] and t._ndim == self._ndim[k]:
            for i in range(t._ndim):
                if t._shape[i] != self._shapes[k * MAX_NDIM + i] or \
                        (t._shape[i] > 1 and t._strides[i] != self._strides[k * MAX_NDIM + i]):
                    break
            else:
                return 0
        cdef TensorBase st = <TensorBase>self._statics[k]
        cdef str what = self._name(k)
        if t._device_type != DEVICE_CUDA or t._device_index != self._device:
            raise ValueError(f"rebind_and_launch: {what} must live on cuda:{self._device}, like its "
                             f"static tensor")
        if t._dtype_code != self._dtype[k]:
            raise ValueError(f"rebind_and_launch: {what} is {t.dtype}, its static tensor {st.dtype}; "
                             f"stage_and_launch copies with a cast")
        if t._ndim != self._ndim[k]:
            raise ValueError(f"rebind_and_launch: {what} has shape {t.shape}, its static tensor {st.shape}")
        for i in range(t._ndim):
            if t._shape[i] != self._shapes[k * MAX_NDIM + i]:
                raise ValueError(f"rebind_and_launch: {what} has shape {t.shape}, its static tensor "
                                 f"{st.shape}; stage_and_launch broadcasts")
        for i in range(t._ndim):
            if t._shape[i] > 1 and t._strides[i] != self._strides[k * MAX_NDIM + i]:
                raise ValueError(f"rebind_and_launch: {what} has strides {t.stride()}, its static tensor "
                                 f"{st.stride()}; the captured kernels index with the static strides "
                                 f"(make it alike, or use stage_and_launch)")
        return 0

    cdef int _bind(self, const uintptr_t* ptrs) except -1:
        """Write the slots of every rebindable tensor whose address changes,
        marking their nodes dirty."""
        cdef Py_ssize_t k, j
        cdef ArgSlot* slot
        cdef unsigned long long value
        cdef bint rebound = False
        for k in range(self._n):
            if not self._rebindable[k]:
                continue
            if ptrs[k] != self._bound_ptr[k]:
                for j in range(self._slot_at[k], self._slot_at[k + 1]):
                    slot = &self._slots[j]
                    value = <unsigned long long>ptrs[k] + slot.delta
                    memcpy(self._args.data() + self._nodes[slot.node].args_at + slot.offset, &value, 8)
                    self._nodes[slot.node].dirty = True
                self._bound_ptr[k] = ptrs[k]
            if ptrs[k] != self._static_ptr[k]:
                rebound = True
        self.rebound = rebound
        return 0

    cdef int _push_dirty(self) except -1 nogil:
        """Give every dirty node its buffer (cuGraphExecKernelNodeSetParams). On
        a failure every node is marked dirty and every binding unknown, so the
        next call sets them all again."""
        cdef size_t i, j
        cdef cydriver.CUresult r
        cdef void* extra[5]
        cdef size_t size
        cdef PatchNode* pn
        for i in range(self._nodes.size()):
            pn = &self._nodes[i]
            if not pn.dirty:
                continue
            size = pn.args_size
            fill_launch_extra(extra, <const void*>(self._args.data() + pn.args_at), &size)
            pn.params.kernelParams = NULL
            pn.params.extra = extra
            r = cydriver.cuGraphExecKernelNodeSetParams(self._exec, pn.node, &pn.params)
            pn.params.extra = NULL
            self.patch_calls += 1
            if r != cydriver.CUDA_SUCCESS:
                for j in range(self._nodes.size()):
                    self._nodes[j].dirty = True
                for j in range(<size_t>self._n):
                    self._bound_ptr[j] = 0
                self.rebound = True          # unknown: the next replay() restores everything
                check(r)
            pn.dirty = False
        return 0

    cdef int restore(self) except -1:
        """Point the executable back at the static tensors (replay() and
        stage_and_launch() use them) and drop the bound tensors."""
        if not self.rebound:
            return 0
        self._bind(self._static_ptr.data())
        with nogil:
            ensure_context(self._device)
            self._push_dirty()
        if self._bound is not None:
            _retire(self._bound, (), self._last_stream)
        self._bound = None
        return 0

    cdef void release(self) noexcept:
        """Forget the executable (the graph owns it) and the bound tensors
        (reused only after the last launch's stream is past them)."""
        self._exec = NULL
        if self._bound is not None:
            try:
                _retire(self._bound, (), self._last_stream)
            except BaseException:
                pass
        self._bound = None
        self.rebound = False


cdef int _retire(tuple old, tuple new, uintptr_t stream) except -1:
    """Tensors of ``old`` not in ``new`` are dropped: their memory must wait for
    the launches on ``stream`` when it was allocated on another stream."""
    cdef Py_ssize_t i, j
    cdef TensorBase t
    for i in range(2):
        group = old[i]
        same = new[i] if len(new) > i else ()
        for j in range(len(group)):
            if j < len(same) and same[j] is group[j]:
                continue
            t = group[j]        # kept tensors are tensorplay's (foreign ones as views)
            st = t._storage
            if st is not None and getattr(st, "stream", stream) != stream:
                st.record_stream(stream)
    if len(old) > 2 and old[2] is not None:
        _retire(old[2], new, stream)
    return 0


cdef tuple _span(TensorBase t):
    """[lo, hi) of the bytes ``t`` can touch (empty for no elements)."""
    cdef int i
    cdef int64_t lo = 0, hi = 0
    if t.c_numel() == 0:
        return (t._ptr, t._ptr)
    for i in range(t._ndim):
        if t._strides[i] < 0:
            lo += (t._shape[i] - 1) * t._strides[i]
        else:
            hi += (t._shape[i] - 1) * t._strides[i]
    return (t._ptr + lo * t._itemsize, t._ptr + (hi + 1) * t._itemsize)


cdef class _Scan:
    """What the walk over a graph found, before it becomes a Rebinder."""
    cdef vector[uintptr_t] lo
    cdef vector[uintptr_t] hi
    cdef vector[uintptr_t] base                # each tensor's address (slots hold offsets from it)
    cdef vector[char] fallback                 # a tensor something unpatchable uses
    cdef list slots                            # per tensor: [(node index, offset, delta)]
    cdef vector[PatchNode] nodes
    cdef vector[char] args
    cdef dict conditionals

    cdef Py_ssize_t find(self, unsigned long long value) noexcept:
        cdef size_t k
        for k in range(self.lo.size()):
            if self.lo[k] <= value < self.hi[k]:
                return <Py_ssize_t>k
        return -1

    cdef void mark_range(self, uintptr_t lo, uintptr_t hi) noexcept:
        """Tensors overlapping [lo, hi) are used by something unpatchable."""
        cdef size_t k
        for k in range(self.lo.size()):
            if lo < self.hi[k] and self.lo[k] < hi:
                self.fallback[k] = True

    cdef void mark_all(self) noexcept:
        cdef size_t k
        for k in range(self.fallback.size()):
            self.fallback[k] = True

    cdef int scan_graph(self, cydriver.CUgraph g, bint patchable, cydriver.CUgraph paired) except -1:
        """Walk ``g``'s nodes; the executable knows them as ``paired``'s (the
        graph it was instantiated from, NULL: ``g`` itself), node for node in
        insertion order, which cuGraphExecUpdate requires to match."""
        cdef size_t n = 0, i
        cdef vector[cydriver.CUgraphNode] nodes, exec_nodes
        cdef cydriver.CUgraphNodeType t
        cdef cydriver.CUDA_MEMSET_NODE_PARAMS mp
        cdef cydriver.CUDA_MEMCPY3D cp
        cdef cydriver.CUgraph child
        check(cydriver.cuGraphGetNodes(g, NULL, &n))
        if n == 0:
            return 0
        nodes.resize(n)
        check(cydriver.cuGraphGetNodes(g, nodes.data(), &n))
        if paired == NULL or paired == g:
            exec_nodes = nodes
        elif not _paired_nodes(nodes, paired, exec_nodes):
            patchable = False           # no node-for-node match to trust: copy
            exec_nodes = nodes
        for i in range(n):
            check(cydriver.cuGraphNodeGetType(nodes[i], &t))
            if t == cydriver.CU_GRAPH_NODE_TYPE_KERNEL:
                self.scan_kernel(nodes[i], patchable, exec_nodes[i])
            elif t == cydriver.CU_GRAPH_NODE_TYPE_MEMSET:
                check(cydriver.cuGraphMemsetNodeGetParams(nodes[i], &mp))
                self.mark_range(mp.dst, mp.dst + mp.pitch * (mp.height - 1 if mp.height else 0)
                                + mp.width * mp.elementSize)
            elif t == cydriver.CU_GRAPH_NODE_TYPE_MEMCPY:
                check(cydriver.cuGraphMemcpyNodeGetParams(nodes[i], &cp))
                # conservative: from each side's first byte over the whole box; a
                # host side (a copy from pinned memory) names no device memory
                if cp.srcMemoryType != cydriver.CU_MEMORYTYPE_HOST:
                    self.mark_range(cp.srcDevice, cp.srcDevice + _box_bytes(cp.srcXInBytes, cp.srcY, cp.srcZ,
                                                                            cp.srcPitch, cp.srcHeight, &cp))
                if cp.dstMemoryType != cydriver.CU_MEMORYTYPE_HOST:
                    self.mark_range(cp.dstDevice, cp.dstDevice + _box_bytes(cp.dstXInBytes, cp.dstY, cp.dstZ,
                                                                            cp.dstPitch, cp.dstHeight, &cp))
            elif t == cydriver.CU_GRAPH_NODE_TYPE_GRAPH:
                check(cydriver.cuGraphChildGraphNodeGetGraph(nodes[i], &child))
                # the executable's kernels inside the child are patched by
                # the child's own nodes, as a conditional body's are; after
                # an update the child's nodes are the new capture's: copy
                self.scan_graph(child, patchable and (paired == NULL or paired == g), NULL)
            elif t == cydriver.CU_GRAPH_NODE_TYPE_CONDITIONAL:
                info = self.conditionals.get(<uintptr_t>nodes[i])
                if info is None:
                    self.mark_all()             # bodies the driver will not show us
                else:
                    # after an update the executable's bodies are the first
                    # capture's, which the driver does not show: copy
                    for body in info[1]:
                        self.scan_graph(<cydriver.CUgraph><uintptr_t>body,
                                        patchable and (paired == NULL or paired == g), NULL)
            elif t not in (cydriver.CU_GRAPH_NODE_TYPE_EMPTY, cydriver.CU_GRAPH_NODE_TYPE_HOST,
                           cydriver.CU_GRAPH_NODE_TYPE_WAIT_EVENT, cydriver.CU_GRAPH_NODE_TYPE_EVENT_RECORD,
                           cydriver.CU_GRAPH_NODE_TYPE_MEM_ALLOC, cydriver.CU_GRAPH_NODE_TYPE_MEM_FREE):
                self.mark_all()                 # memory operations we cannot read (batch mem ops, newer kinds)
        return 0

    cdef int scan_kernel(self, cydriver.CUgraphNode node, bint patchable,
                         cydriver.CUgraphNode exec_node) except -1:
        """Find the static tensors in ``node``'s arguments; patches go to the
        executable's ``exec_node``."""
        cdef cydriver.CUDA_KERNEL_NODE_PARAMS kp
        cdef vector[char] buf
        cdef vector[size_t] offsets, sizes
        cdef size_t i, w, off
        cdef unsigned long long value
        cdef Py_ssize_t k
        cdef int how
        cdef PatchNode pn
        memset(&kp, 0, sizeof(kp))
        check(cydriver.cuGraphKernelNodeGetParams(node, &kp))
        how = read_kernel_args(&kp, buf, offsets, sizes)
        if how == ARGS_UNREADABLE:
            self.mark_all()
            return 0
        own = patchable and how == ARGS_LAID_OUT and is_own_function(kp.func)
        found = []
        if own:
            for i in range(offsets.size()):
                for w in range(0, sizes[i] - 7 if sizes[i] >= 8 else 0, 8):
                    off = offsets[i] + w
                    memcpy(&value, buf.data() + off, 8)
                    k = self.find(value)
                    if k < 0:
                        continue
                    if sizes[i] == 8 and off % 8 == 0:
                        found.append((k, off, value - self.base[k]))
                    else:
                        self.fallback[k] = True  # an address inside a struct argument
        else:
            for off in range(0, buf.size() - 7 if buf.size() >= 8 else 0, 8):
                memcpy(&value, buf.data() + off, 8)
                k = self.find(value)
                if k >= 0:
                    self.fallback[k] = True
        if not found:
            return 0
        memset(&pn, 0, sizeof(pn))
        pn.node = exec_node
        pn.params = kp
        pn.params.kernelParams = NULL
        pn.params.extra = NULL
        pn.args_at = self.args.size()
        pn.args_size = buf.size()
        self.args.insert(self.args.end(), buf.begin(), buf.end())
        self.nodes.push_back(pn)
        for k, off, delta in found:
            self.slots[k].append((self.nodes.size() - 1, off, delta))
        return 0


cdef bint _paired_nodes(vector[cydriver.CUgraphNode]& nodes, cydriver.CUgraph paired,
                        vector[cydriver.CUgraphNode]& out) except -1:
    """``paired``'s nodes into ``out``, True when they match ``nodes`` one for
    one in kind and, for kernels, function (what a wrong pairing would break)."""
    cdef size_t n = 0, i
    cdef cydriver.CUgraphNodeType a, b
    cdef cydriver.CUDA_KERNEL_NODE_PARAMS ka, kb
    check(cydriver.cuGraphGetNodes(paired, NULL, &n))
    if n != nodes.size():
        return False
    out.resize(n)
    check(cydriver.cuGraphGetNodes(paired, out.data(), &n))
    for i in range(n):
        check(cydriver.cuGraphNodeGetType(nodes[i], &a))
        check(cydriver.cuGraphNodeGetType(out[i], &b))
        if a != b:
            return False
        if a == cydriver.CU_GRAPH_NODE_TYPE_KERNEL:
            memset(&ka, 0, sizeof(ka))
            memset(&kb, 0, sizeof(kb))
            check(cydriver.cuGraphKernelNodeGetParams(nodes[i], &ka))
            check(cydriver.cuGraphKernelNodeGetParams(out[i], &kb))
            if ka.func != kb.func:
                return False
    return True


cdef size_t _box_bytes(size_t x, size_t y, size_t z, size_t pitch, size_t height,
                       cydriver.CUDA_MEMCPY3D* cp) noexcept:
    """The bytes from a memcpy side's first byte to the end of its box (pitch
    0 means rows back to back)."""
    cdef size_t row = pitch if pitch else cp.WidthInBytes
    cdef size_t plane = row * (height if height else max(cp.Height, 1))
    return x + y * row + z * plane + plane * (max(cp.Depth, 1) - 1) + row * (max(cp.Height, 1) - 1) \
        + cp.WidthInBytes


cdef Rebinder make_rebinder(cydriver.CUgraph graph, cydriver.CUgraph exec_graph,
                            cydriver.CUgraphExec main, int device,
                            object static_inputs, object static_outputs, dict conditionals,
                            object multi_copy, object copy, str what):
    """Build the Rebinder of these static tensors for ``graph`` (whose
    executable is ``main``, instantiated from ``exec_graph``, NULL: from
    ``graph``; an in-place update leaves the first graph's nodes its own); ``conditionals`` maps conditional nodes to their
    bodies (as for describe); ``multi_copy(capacity, device)`` gives the copy
    kernel, ``copy(dst, src)`` copies what it cannot; ``what``, the public
    method that asked (rebind_and_launch or rebindable), leads its errors."""
    cdef Rebinder r = Rebinder.__new__(Rebinder)
    cdef _Scan scan = _Scan.__new__(_Scan)
    cdef Py_ssize_t k, j, n, n_in, nfall = 0
    cdef TensorBase st
    cdef int i
    cdef size_t p
    cdef cydriver.CUresult res
    cdef void* extra[5]
    cdef size_t size
    cdef PatchNode* pn
    cdef ArgSlot slot
    for name, seq in (("static_inputs", static_inputs), ("static_outputs", static_outputs)):
        if not is_tensor_list(seq):
            raise TypeError(f"{what}: {name} must be a list or tuple of tensors")
    r._given_statics = tuple(static_inputs) + tuple(static_outputs)
    statics = tuple(graph_tensor(x) for x in r._given_statics)     # foreign ones as views
    n_in = len(static_inputs)
    n = len(statics)
    r._device = device
    r._exec = main
    r._n = n
    r._n_in = n_in
    r._statics = statics
    r._copy = copy
    r._static_ptr.resize(n)
    r._bound_ptr.resize(n)
    r._dtype.resize(n)
    r._ndim.resize(n)
    r._shapes.resize(n * MAX_NDIM)
    r._strides.resize(n * MAX_NDIM)
    r._nbytes.resize(n)
    r._contiguous.resize(n)
    r._rebindable.resize(n)
    r._align.resize(n)
    r._lo_off.resize(n)
    r._hi_off.resize(n)
    scan.lo.resize(n)
    scan.hi.resize(n)
    scan.base.resize(n)
    scan.fallback.assign(n, False)
    scan.slots = [[] for _ in range(n)]
    scan.conditionals = conditionals
    for k in range(n):
        st = static_tensor(statics[k], device, what,
                           f"static_inputs[{k}]" if k < n_in else f"static_outputs[{k - n_in}]")
        r._static_ptr[k] = st._ptr
        r._bound_ptr[k] = st._ptr
        r._dtype[k] = st._dtype_code
        r._ndim[k] = st._ndim
        for i in range(st._ndim):
            r._shapes[k * MAX_NDIM + i] = st._shape[i]
            r._strides[k * MAX_NDIM + i] = st._strides[i]
        r._nbytes[k] = <unsigned long long>(st.c_numel() * st._itemsize)
        r._contiguous[k] = st.c_is_contiguous()
        scan.lo[k], scan.hi[k] = _span(st)
        scan.base[k] = st._ptr
        r._lo_off[k] = st._ptr - scan.lo[k]
        r._hi_off[k] = scan.hi[k] - st._ptr
        r._align[k] = min(256, st._ptr & (~st._ptr + 1)) if st._ptr else 256
        storage = st._storage
        if r._nbytes[k] and (storage is None or getattr(storage, "ptr", 0) != scan.lo[k] or
                             getattr(storage, "size", 0) != scan.hi[k] - scan.lo[k]):
            # a view of a larger storage: a kernel given its address may be
            # working on the larger tensor, beyond the static's bytes
            scan.fallback[k] = True
    for k in range(n):
        for j in range(k):
            if scan.lo[k] < scan.hi[j] and scan.lo[j] < scan.hi[k]:
                raise ValueError(f"{what}: static tensors {j} and {k} overlap in memory; "
                                 f"each must be its own memory to be rebound")
    ensure_context(device)
    scan.scan_graph(graph, True, exec_graph)
    # a node the driver refuses to update (in a body it cannot patch, say) is a fallback
    for p in range(scan.nodes.size()):
        pn = &scan.nodes[p]
        size = pn.args_size
        fill_launch_extra(extra, <const void*>(scan.args.data() + pn.args_at), &size)
        pn.params.extra = extra
        with nogil:
            res = cydriver.cuGraphExecKernelNodeSetParams(main, pn.node, &pn.params)
        pn.params.extra = NULL
        if res != cydriver.CUDA_SUCCESS:
            for k in range(n):
                for node_index, off, delta in scan.slots[k]:
                    if node_index == <Py_ssize_t>p:
                        scan.fallback[k] = True
    r._nodes = scan.nodes
    r._args = scan.args
    r._slot_at.resize(n + 1)
    for k in range(n):
        r._slot_at[k] = r._slots.size()
        # a tensor no patchable argument points at is copied: correct whoever uses it
        if r._nbytes[k] and not scan.slots[k]:
            scan.fallback[k] = True
        r._rebindable[k] = not scan.fallback[k]
        if scan.fallback[k]:
            nfall += 1
            continue
        for node_index, off, delta in scan.slots[k]:
            slot.node = node_index
            slot.offset = off
            slot.delta = delta
            r._slots.push_back(slot)
    r._slot_at[n] = r._slots.size()
    if nfall:
        r._cap = copy_capacity(nfall)
        r._copy_fn = multi_copy(r._cap, device)
        r._table_size = copy_table_bytes(r._cap)
    return r
