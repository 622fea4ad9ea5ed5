"""Stand-in for cupy.cuda: Stream (non_blocking, ptr, done, synchronize, context manager) and
get_current_stream. Semantics: ../_device.py."""
import threading

from cupy import _device
from cupy.cuda import runtime  # noqa: F401  (cupy.cuda.runtime.deviceSynchronize)

_current = threading.local()


class Stream:
    """A stand-in CUDA stream. `Stream.null` is the legacy default stream (ptr 0)."""

    null = None  # set below

    def __init__(self, null=False, non_blocking=False):
        self._null = null
        self.non_blocking = non_blocking
        self.queue = None if null else _device.StreamQueue(blocking=not non_blocking)
        if not null:
            _device.register_stream(self)

    @property
    def ptr(self):
        return 0 if self._null else id(self)

    @property
    def done(self):
        if self._null:
            return True
        with _device._lock:
            self.queue.advance()
            return not self.queue.items

    def synchronize(self):
        if self._null:
            _device.launch(0, lambda: None)  # drains the blocking streams
            return
        self.queue.wait_for()
        self.queue.raise_sticky_error()

    def standin_hold(self, max_seconds=5.0):
        """Stand-in only: keeps this stream busy (work enqueued after it waits) until the
        returned hold's release(), or max_seconds. Real GPU equivalent: a spinning kernel."""
        if self._null:
            raise ValueError("the legacy default stream cannot be held in the stand-in")
        return self.queue.enqueue(_device.Hold(self.queue, max_seconds))

    def __del__(self):
        # cudaStreamDestroy lets the work already enqueued finish; so does the stand-in.
        if getattr(self, "queue", None) is not None:
            self.queue.wait_for()

    def use(self):
        _current.stream = self
        return self

    def __enter__(self):
        stack = _current.__dict__.setdefault("stack", [])
        stack.append(get_current_stream())
        return self.use()

    def __exit__(self, *exc):
        _current.stream = _current.stack.pop()

    def __repr__(self):
        return f"<stand-in Stream {self.ptr:#x}>"


Stream.null = Stream(null=True)


def get_current_stream():
    return getattr(_current, "stream", Stream.null)
