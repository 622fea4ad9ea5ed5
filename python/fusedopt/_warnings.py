"""The warning categories of fusedopt, importable without TensorFlow.

Each names one kind of thing a user may want to silence or turn into an error:

    import warnings, fusedopt
    warnings.filterwarnings("error", category=fusedopt.FallbackWarning)

Every warning is given once per optimizer (or once per process for module-level notes).
"""
import warnings

__all__ = ["FusedOptWarning", "FallbackWarning", "IgnoredOptionWarning", "warn_once"]


class FusedOptWarning(UserWarning):
    """The base of fusedopt's warnings."""


class FallbackWarning(FusedOptWarning):
    """A setting or dtype runs the replaced optimizer's own (unfused) update instead of
    fusedopt's kernels: the numbers are the replaced class's, the speed is not fusedopt's."""


class IgnoredOptionWarning(FusedOptWarning):
    """An option was given that cannot take effect where it was given (e.g. compact slots
    whose variables another library made in float32)."""


def warn_once(owner, key, category, message, stacklevel=3):
    """Warns `message` (of `category`) the first time `key` is seen for `owner` (an
    optimizer; None: the process)."""
    seen = _PROCESS_SEEN if owner is None else owner.__dict__.setdefault(
        "_fusedopt_warned", set())
    if key in seen:
        return
    seen.add(key)
    warnings.warn(message, category, stacklevel=stacklevel)


_PROCESS_SEEN = set()
