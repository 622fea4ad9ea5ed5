"""``fusedopt.keras.Embedding``: Keras's ``Embedding`` layer, looking its rows up without
reading the whole table.

Keras 3's ``Embedding`` computes ``ops.take(embeddings, ids)``: a dense read of the table,
then a gather. Once a sparse update has touched the table, TensorFlow serves every dense
read of it by copying the whole table (its copy-on-read mode keeps readers consistent with
in-place row updates), so each training step copies the table once: at 1M x 32, ~700 ms a
step instead of ~8. This subclass gathers the rows from the variable itself
(``tf.nn.embedding_lookup``, TensorFlow's ``ResourceGather``), as Keras 2's layer does, and
is otherwise Keras's layer: same arguments, weights, masking, saving. Where Keras's own
path is needed (LoRA enabled, a quantized layer) it is used unchanged.

    keras.layers.Embedding(1_000_000, 32)        # ->
    fusedopt.keras.Embedding(1_000_000, 32)
"""
import inspect

import tensorflow as tf

__all__ = ["Embedding"]

_Embedding = tf.keras.layers.Embedding


@tf.keras.utils.register_keras_serializable(package="fusedopt")
class Embedding(_Embedding):
    __doc__ = inspect.cleandoc("""Keras's ``Embedding`` layer, gathering rows from the table's
        variable (``ResourceGather``) instead of reading the whole table.

        On Keras 3, use it for tables that sparse updates train: Keras's own layer reads
        the whole table to look rows up, which TensorFlow serves with a copy of the table
        once sparse updates write it in place (every step). Everything else is Keras's layer
        (a subclass). Keras's description of the layer follows.
        """) + "\n\n" + inspect.cleandoc(_Embedding.__doc__ or "")

    def call(self, inputs):
        table = self._table_variable()
        if table is None:
            return super().call(inputs)
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int32)  # as Keras's layer does
        return tf.cast(tf.nn.embedding_lookup(table, inputs), self.compute_dtype)

    def _table_variable(self):
        """The TensorFlow variable under Keras 3's table, or None where Keras's own path
        applies: Keras 2 (its table is a tf.Variable already looked up by row), LoRA, a
        quantized layer."""
        if getattr(self, "lora_enabled", False) or getattr(self, "quantization_mode", None):
            return None
        table = getattr(self, "_embeddings", None)
        for inner in (getattr(table, "value", None), getattr(table, "_value", None)):
            if isinstance(inner, tf.Variable):  # (.value is the cast tensor under autocast)
                return inner
        return None
