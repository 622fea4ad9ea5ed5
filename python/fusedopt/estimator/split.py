"""Splitting a batch (features or labels) into one part per tower."""
from typing import Any, List

import tensorflow as tf

__all__ = ["split_batch"]


def split_batch(value: Any, n: int, path: str) -> List[Any]:
    """``value`` (None, tensor, SparseTensor, dict/list/tuple of them) split into n parts.

    `path` names the value in error messages (e.g. ``features['ids']``).
    """
    if value is None:
        return [None] * n
    if isinstance(value, dict):
        parts = {k: split_batch(v, n, "%s[%r]" % (path, k)) for k, v in value.items()}
        return [type(value)((k, parts[k][i]) for k in value) for i in range(n)]
    if isinstance(value, (tf.SparseTensor, tf.compat.v1.SparseTensorValue)):
        value = tf.SparseTensor.from_value(value)
        if n == 1:
            return [value]
        # Rows split as evenly as possible: the first (rows % n) parts get one more.
        return tf.sparse.split(sp_input=value, num_split=n, axis=0)
    if isinstance(value, (list, tuple)):
        parts = [split_batch(v, n, "%s[%d]" % (path, j)) for j, v in enumerate(value)]
        shards = [[p[i] for p in parts] for i in range(n)]
        if hasattr(value, "_fields"):  # namedtuple
            return [type(value)(*s) for s in shards]
        return [type(value)(s) for s in shards]
    return _split_tensor(tf.convert_to_tensor(value), n, path)


def _split_tensor(tensor, n, path):
    """A dense tensor split along its first dimension, which n must divide."""
    if n == 1:
        return [tensor]
    if tensor.shape.rank == 0:
        raise ValueError("replicate_model_fn: %s is a scalar; cannot split it into %d towers"
                         % (path, n))
    batch = tf.compat.dimension_value(tensor.shape[0]) if tensor.shape.rank else None
    if batch is not None:
        if batch % n:
            raise ValueError(_not_divisible(path, n, batch))
        return tf.split(tensor, n, axis=0)
    message = _not_divisible(path, n)
    # Unknown batch size: checked when the graph runs.
    check = tf.compat.v1.assert_equal(tf.math.floormod(tf.shape(tensor)[0], n), 0,
                                      message=message)
    with tf.control_dependencies([check]):
        tensor = tf.identity(tensor)
    return tf.split(tensor, n, axis=0)


def _not_divisible(path, n, batch=None):
    # Contrib's words first (users and tests match on them), then ours.
    size = "Batch size" if batch is None else "Batch size %d" % batch
    return ("%s needs to be divisible by the number of GPUs, which is %d: "
            "replicate_model_fn: the batch size of %s is not divisible by the number of "
            "towers (%d); make the batch size a multiple of it." % (size, n, path, n))
