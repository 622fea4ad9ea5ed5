"""Checkpoints across slot dtypes: float32 slots <-> compact (bfloat16/float16) slots.

An optimizer with compact slots (``slot_dtype=``, fusedopt._compact) writes 16-bit slots
into its checkpoints, and TensorFlow's restore refuses a tensor whose dtype is not the
variable's: such a checkpoint does not restore into TF's or Keras's optimizers (float32
slots), nor a float32-slot checkpoint into a compact optimizer. ``cast_slots`` writes a
copy of a checkpoint with its optimizer slots cast, which then restores:

    fusedopt.checkpoint.cast_slots("run/ckpt-100", "run32/ckpt-100", "float32")
    tf.train.Checkpoint(model=model, optimizer=keras.optimizers.Adam()).restore("run32/ckpt-100")

The slots are found in the checkpoint's object graph (TF2 object-based checkpoints of
``tf.train.Checkpoint``, Keras's and ``fusedopt``'s optimizers of every API); a
name-based ``tf.compat.v1.train.Saver`` checkpoint has none: pass ``keys``.
"""
from typing import Iterable, Optional, Set, Union

import tensorflow as tf

from fusedopt import _compact, rules

__all__ = ["slot_keys", "cast_slots"]

_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
_FLOATS = (tf.float32, tf.bfloat16, tf.float16)


def _keras_slot_lists():
    """The attribute names under which Keras 3 optimizers keep their slot lists (e.g.
    ``_momentums``): checkpoint children of the optimizer."""
    specs = [spec for _, spec in rules.front_end_specs("KERAS")]
    specs += [spec for _, spec in rules.variant_specs("KERAS").values()]
    return {attr for spec in specs for attr in spec.slots}


def slot_keys(path: str) -> Set[str]:
    """The checkpoint keys of the optimizer slots in the object-based checkpoint `path`:
    slot variables (``tf.compat.v1`` and Keras 2 optimizers) and the members of Keras 3
    optimizers' slot lists. Empty for a name-based checkpoint."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(path)
    if _OBJECT_GRAPH not in reader.get_variable_to_dtype_map():
        return set()
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH))
    slot_lists = _keras_slot_lists()
    nodes = set()
    for node in graph.nodes:
        nodes.update(ref.slot_variable_node_id for ref in node.slot_variables)
        for child in node.children:
            if child.local_name in slot_lists:
                nodes.update(c.node_id for c in graph.nodes[child.node_id].children)
    return {attribute.checkpoint_key for n in nodes for attribute in graph.nodes[n].attributes}


def cast_slots(source: str, target: str, dtype: Union[str, tf.DType],
               keys: Optional[Iterable[str]] = None) -> str:
    """Writes checkpoint `target` (a prefix): `source` with its optimizer slots in `dtype`.

    Every tensor is read into memory once.

    Args:
      source: the checkpoint to read (a prefix, as ``tf.train.Checkpoint.write`` returns).
      target: the checkpoint to write (a prefix).
      dtype: "float32" (restore into float32-slot optimizers: TF's, Keras's, fusedopt's by
        default) or "bfloat16"/"float16" (into compact ones). Only float32/bfloat16/float16
        slots are cast (a float64 variable's stay float64, as its optimizer keeps them).
      keys: the slots' checkpoint keys; default ``slot_keys(source)`` (required for a
        name-based checkpoint, e.g. ``{"emb/Adam", "emb/Adam_1"}``).

    Returns:
      `target`.

    Raises:
      ValueError: no optimizer slots are found in `source` (a name-based checkpoint needs
        `keys`), or a key is not in it.
    """
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"keys must be a list of checkpoint keys, got the string {keys!r} "
                        "(one key: keys=[key])")
    dtype = _compact.parse_slot_dtype(dtype) or tf.float32
    reader = tf.train.load_checkpoint(source)
    dtypes = reader.get_variable_to_dtype_map()
    keys = slot_keys(source) if keys is None else set(keys)
    if not keys:
        raise ValueError(f"no optimizer slots found in {source!r}: a name-based checkpoint "
                         "needs keys= (its slot variables' names)")
    missing = sorted(keys - set(dtypes))
    if missing:
        raise ValueError(f"not in {source!r}: {missing}")
    names, tensors = [], []
    for name in sorted(dtypes):
        value = reader.get_tensor(name)
        if name in keys and dtypes[name] in _FLOATS:
            value = tf.cast(tf.constant(value, dtypes[name]), dtype)
        names.append(name)
        tensors.append(tf.constant(value, dtypes[name]) if not tf.is_tensor(value) else value)
    with tf.device("/cpu:0"):
        tf.raw_ops.SaveV2(prefix=target, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=tensors)
    return target
