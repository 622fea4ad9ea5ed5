"""The stand-in "device": memory and streams, on the CPU, in one process.

Memory: each allocation is a NumPy byte buffer aligned like cudaMalloc (256 bytes); its host
address is its "device pointer", so pointers, offsets and alignment behave as on a GPU and a
raw `{"data": (ptr, False), ...}` dict resolves back to the buffer it points into.

Streams: a stream is a FIFO of work. It runs ahead as far as it can, as a fast GPU would:
work enqueued on an idle stream runs at once; work behind a hold (the stand-in for a kernel
that keeps the stream busy) waits until the hold is released or its deadline passes, which is
what waiting on that stream (synchronize, a blocking copy) amounts to. So a backend that
enqueues on the wrong stream, or synchronises when it should not, is seen to. The legacy
default stream (pointer 0) runs work at once, after draining the blocking streams (CUDA's
legacy semantics); non-blocking streams are independent of it.

Errors raised by work that ran asynchronously are sticky, as CUDA's are: the next
synchronize of that stream (or deviceSynchronize) raises them.
"""
import threading
import time
import weakref
from collections import deque

import numpy as np

ALIGNMENT = 256  # cudaMalloc's

_lock = threading.RLock()  # one "device": queues advance under it, from any thread
_allocations = weakref.WeakValueDictionary()  # base address -> Allocation
_streams = weakref.WeakValueDictionary()  # stream pointer -> Stream (0 excluded)


class Allocation:
    def __init__(self, nbytes):
        raw = np.empty(nbytes + ALIGNMENT, np.uint8)
        shift = -raw.__array_interface__["data"][0] % ALIGNMENT
        self.buffer = raw[shift:shift + nbytes]
        self.base = self.buffer.__array_interface__["data"][0]
        self.nbytes = nbytes
        _allocations[self.base] = self


def find_allocation(ptr, nbytes):
    """The live allocation holding [ptr, ptr + nbytes), or None."""
    for base in list(_allocations.keys()):
        alloc = _allocations.get(base)
        if alloc is not None and base <= ptr and ptr + nbytes <= base + alloc.nbytes:
            return alloc
    return None


def host_view(ptr, shape, dtype):
    """A NumPy view of device memory at ptr (C order), or None if ptr is not device memory."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    alloc = find_allocation(ptr, nbytes)
    if alloc is None:
        return None
    return np.ndarray(shape, dtype, buffer=alloc.buffer, offset=ptr - alloc.base)


class Work:
    def __init__(self, fn):
        self.fn = fn
        self.finished = False


class Hold:
    """Keeps a stream busy until release() or until max_seconds have passed."""

    def __init__(self, stream, max_seconds):
        self._stream = stream
        self._released = threading.Event()
        self.deadline = time.monotonic() + max_seconds

    @property
    def over(self):
        return self._released.is_set() or time.monotonic() >= self.deadline

    def release(self):
        self._released.set()
        with _lock:
            self._stream.advance()

    def wait(self):
        self._released.wait(max(0.0, self.deadline - time.monotonic()))


class StreamQueue:
    """The queue behind one stream (see the module docstring for its semantics)."""

    def __init__(self, blocking):
        self.blocking = blocking
        self.items = deque()
        self.error = None  # sticky: raised by the next synchronize

    def advance(self):
        while self.items:
            head = self.items[0]
            if isinstance(head, Hold):
                if not head.over:
                    return
            else:
                try:
                    head.fn()
                except Exception as e:  # async failure: reported at the next synchronize
                    self.error = self.error or e
                head.finished = True
            self.items.popleft()

    def enqueue(self, item):
        with _lock:
            self.items.append(item)
            self.advance()
        return item

    def wait_for(self, item=None):
        """Blocks until item (None: everything enqueued so far) has run."""
        with _lock:
            target = item if item is not None else (self.items[-1] if self.items else None)
        while True:
            with _lock:
                self.advance()
                if target is None or target not in self.items:
                    return
                head = self.items[0]
            head.wait()  # a hold: until released or past its deadline

    def raise_sticky_error(self):
        error, self.error = self.error, None
        if error is not None:
            raise RuntimeError(f"stand-in stream: asynchronous work failed: {error!r}") from error


def live_queues():
    return [s.queue for s in list(_streams.values())]


def launch(stream_ptr, fn):
    """Runs fn on the stream with that pointer (0: the legacy default stream); returns its Work."""
    work = Work(fn)
    if stream_ptr == 0:
        for queue in live_queues():
            if queue.blocking:
                queue.wait_for()
        fn()
        work.finished = True
        return work
    stream = _streams.get(stream_ptr)
    if stream is None:
        raise RuntimeError(f"cudaErrorInvalidResourceHandle: stand-in stream {stream_ptr:#x} "
                           "is not a live stream")
    return stream.queue.enqueue(work)


def queue_of(stream_ptr):
    return None if stream_ptr == 0 else _streams[stream_ptr].queue


def register_stream(stream):
    _streams[stream.ptr] = stream


def synchronize_device():
    queues = live_queues()
    for queue in queues:
        queue.wait_for()
    for queue in queues:
        queue.raise_sticky_error()
