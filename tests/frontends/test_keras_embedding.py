"""fusedopt.keras.Embedding: Keras's Embedding layer, its rows gathered from the variable
itself (ResourceGather), never by a dense read of the table (which, once a sparse update
has touched the table, TensorFlow serves with a copy of the whole table). Otherwise it is
Keras's layer: the same outputs, gradients and training, masking, configuration, saving;
LoRA and mixed precision as Keras does them."""
import re

import numpy as np
import pytest
import tensorflow as tf

import fusedopt.keras

keras = tf.keras
KERAS3 = hasattr(keras.layers.Embedding, "enable_lora")
ROWS, DIM = 50, 4


def _model(layer_class, optimizer, **layer_kwargs):
    model = keras.Sequential([keras.Input((3,), dtype="int64"),
                              layer_class(ROWS, DIM, name="table", **layer_kwargs),
                              keras.layers.Flatten(), keras.layers.Dense(1, name="head")])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, ROWS, (16, 3)).astype(np.int64), rng.normal(size=(16, 1))


@pytest.mark.parametrize("optimizer", ["LazyAdam", "RowWiseAdagrad", "keras Adam"])
def test_trains_exactly_as_kerass_layer(optimizer):
    """Same initial weights, same batches: the same weights bit for bit after each step."""
    x, y = _data()
    weights = None
    result = {}
    for layer_class in (keras.layers.Embedding, fusedopt.keras.Embedding):
        opt = (keras.optimizers.Adam(0.01) if optimizer == "keras Adam"
               else getattr(fusedopt.keras, optimizer)(0.01))
        model = _model(layer_class, opt)
        if weights is None:
            weights = [w.copy() for w in model.get_weights()]
        model.set_weights(weights)
        for step in range(3):
            model.train_on_batch(x[step::3], y[step::3])
        result[layer_class] = model.get_weights()
    for got, want in zip(result[fusedopt.keras.Embedding], result[keras.layers.Embedding]):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(result[fusedopt.keras.Embedding][0], weights[0])  # it trained


def _table_uses(layer_class):
    """Op types that take the table's variable handle in a traced forward and backward."""
    model = _model(layer_class, "sgd")
    table = model.get_layer("table").embeddings
    variable = getattr(table, "value", table)
    variable = variable if isinstance(variable, tf.Variable) else table

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return tape.gradient(loss, model.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec([None, 3], tf.int64)).graph
    inner = [internal for external, internal in graph.captures
             if external is variable.handle]
    assert len(inner) == 1, graph.captures
    return sorted({op.type for op in graph.get_operations()
                   if any(t is inner[0] for t in op.inputs)})


def test_the_table_is_gathered_by_row_never_read_whole():
    uses = _table_uses(fusedopt.keras.Embedding)
    assert "ResourceGather" in uses and "ReadVariableOp" not in uses, uses
    if KERAS3:  # what the layer fixes: Keras 3's own layer reads the whole table
        assert "ReadVariableOp" in _table_uses(keras.layers.Embedding)


def test_outputs_masks_and_config_are_kerass():
    x, _ = _data(1)
    x[0, 0] = 0
    ours = fusedopt.keras.Embedding(ROWS, DIM, mask_zero=True)
    theirs = keras.layers.Embedding(ROWS, DIM, mask_zero=True)
    ours.build((None, 3))
    theirs.build((None, 3))
    theirs.set_weights(ours.get_weights())
    for ids in (x, x.astype(np.int32), x.astype(np.float32)):  # Keras casts other dtypes
        np.testing.assert_array_equal(ours(ids).numpy(), theirs(ids).numpy())
    np.testing.assert_array_equal(ours.compute_mask(x).numpy(), theirs.compute_mask(x).numpy())
    ours_config, theirs_config = ours.get_config(), theirs.get_config()
    # Keras's default name (its class name, numbered after the first in a process)
    assert re.fullmatch(r"embedding(_\d+)?", ours_config.pop("name"))
    assert ours_config == {k: v for k, v in theirs_config.items() if k != "name"}
    clone = fusedopt.keras.Embedding.from_config(ours.get_config())
    assert type(clone) is fusedopt.keras.Embedding


def test_docstring_is_ours_then_kerass():
    import inspect
    doc = inspect.getdoc(fusedopt.keras.Embedding)
    assert doc.startswith("Keras's ``Embedding`` layer, gathering rows")
    assert doc.endswith(inspect.cleandoc(keras.layers.Embedding.__doc__))


def test_mixed_precision_outputs_the_compute_dtype():
    ours = fusedopt.keras.Embedding(ROWS, DIM, dtype="mixed_float16")
    theirs = keras.layers.Embedding(ROWS, DIM, dtype="mixed_float16")
    ours.build((None, 3))
    theirs.build((None, 3))
    theirs.set_weights(ours.get_weights())
    x, _ = _data(2)
    out = ours(x)
    assert out.dtype == tf.float16
    np.testing.assert_array_equal(out.numpy(), theirs(x).numpy())


@pytest.mark.skipif(not KERAS3, reason="LoRA is Keras 3's")
def test_lora_runs_kerass_own_path():
    ours = fusedopt.keras.Embedding(ROWS, DIM)
    ours.build((None, 3))
    ours.enable_lora(2)
    ours.lora_embeddings_b.assign(tf.ones_like(ours.lora_embeddings_b))
    x, _ = _data(3)
    want = tf.gather(ours.embeddings, x)  # the table with its LoRA update added
    np.testing.assert_allclose(ours(x).numpy(), want.numpy(), rtol=1e-6)


def test_saved_and_loaded_with_its_weights(tmp_path):
    x, y = _data(4)
    model = _model(fusedopt.keras.Embedding, fusedopt.keras.LazyAdam(0.01))
    model.train_on_batch(x, y)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.get_layer("table")) is fusedopt.keras.Embedding
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
