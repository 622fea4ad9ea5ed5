"""A CPU stand-in for the few CuPy calls tests/gpu makes (selected by FUSEDOPT_GPU_STANDIN=1,
see tests/gpu/conftest.py): device arrays (ndarray: shape, dtype, view, reshape, basic slicing,
.data.ptr, __cuda_array_interface__), asarray/asnumpy, cuda.Stream, cuda.runtime.
"Device" memory is host memory; streams defer work as _device.py describes. With the
_core_cuda stand-in beside it, it proves the GPU tests' logic and harness, not the kernels.
"""
import types

import numpy as np

from cupy import _device, cuda

IS_STANDIN = True


class ndarray:
    """A C-contiguous (or sliced) view of stand-in device memory. Read it with asnumpy."""

    def __init__(self, view, allocation):
        self._view = view  # host view of the device bytes; not for direct use by tests
        self._allocation = allocation  # keeps the memory alive, as CuPy's MemoryPointer does

    shape = property(lambda self: self._view.shape)
    dtype = property(lambda self: self._view.dtype)
    size = property(lambda self: self._view.size)
    ndim = property(lambda self: self._view.ndim)
    nbytes = property(lambda self: self._view.nbytes)
    strides = property(lambda self: self._view.strides)

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self._view.__array_interface__["data"][0])

    @property
    def __cuda_array_interface__(self):
        contiguous = self._view.flags.c_contiguous
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False),
                "strides": None if contiguous else self.strides, "version": 3}

    def view(self, dtype):
        return ndarray(self._view.view(dtype), self._allocation)

    def __getitem__(self, key):
        part = self._view[key]
        if not isinstance(part, np.ndarray) or part.base is None:
            raise NotImplementedError("the stand-in supports basic slicing only")
        return ndarray(part, self._allocation)

    def reshape(self, *shape):
        """A view in another shape (contiguous arrays only, as a view must be)."""
        if not self._view.flags.c_contiguous:
            raise NotImplementedError("the stand-in reshapes C-contiguous arrays only")
        return ndarray(self._view.reshape(*shape), self._allocation)

    def __len__(self):
        return len(self._view)

    def __repr__(self):
        return f"<stand-in cupy.ndarray shape={self.shape} dtype={self.dtype}>"


def asarray(a, dtype=None):
    """Copies host data to new device memory on the current stream (or returns a as is)."""
    if isinstance(a, ndarray) and dtype is None:
        return a
    host = np.ascontiguousarray(a, dtype=dtype)
    allocation = _device.Allocation(host.nbytes)
    device = np.ndarray(host.shape, host.dtype, buffer=allocation.buffer)
    snapshot = host.copy()  # the copy is stream-ordered; the caller may reuse its array
    _device.launch(cuda.get_current_stream().ptr, lambda: np.copyto(device, snapshot))
    return ndarray(device, allocation)


def asnumpy(a, stream=None):
    """Blocking copy to the host, ordered on `stream` (default: the current stream)."""
    stream = stream if stream is not None else cuda.get_current_stream()
    out = np.empty(a.shape, a.dtype)
    work = _device.launch(stream.ptr, lambda: np.copyto(out, a._view))
    queue = _device.queue_of(stream.ptr)
    if queue is not None:
        queue.wait_for(work)
        queue.raise_sticky_error()
    return out
