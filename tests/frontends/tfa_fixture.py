"""A model trained with the real tensorflow-addons LazyAdam (TF 2.15), for the migration tests.

``python tests/frontends/tfa_fixture.py DIR`` (TF 2.15 + tensorflow-addons 0.23) writes:
  DIR/model.h5         the model after FIRST_STEPS steps of tfa.optimizers.LazyAdam (Keras 2
                       .h5, optimizer state included);
  DIR/expected.npz     the batches of the next CONTINUE_STEPS steps ("x", "y") and the
                       weights tfa reaches after them ("weight_<i>", model.get_weights() order).
tests/frontends/data/tfa_lazy_adam/ holds the committed copy that the Keras 3 test (TF 2.21, no tfa)
continues from; test_migrate_tfa.py regenerates it on TF 2.15 and checks it is unchanged.

``python tests/frontends/tfa_fixture.py continue PATH fusedopt|keras_adam OUT``: continue_training.

The model has an Embedding (sparse gradients: LazyAdam touches only the rows of a batch)
and Dense layers; ids are drawn from part of the table so that many rows stay untouched.
"""
import os
import sys

import numpy as np

FIRST_STEPS = 6
CONTINUE_STEPS = 4
BATCH = 4
ROWS, DIM, IDS = 12, 4, 3
HYPER = dict(learning_rate=0.02, beta_1=0.8, beta_2=0.95, epsilon=1e-6)


def data(seed, steps):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, ROWS - 4, (steps * BATCH, IDS)).astype(np.int32)  # rows 8..11 never
    y = rng.normal(size=(steps * BATCH, 1)).astype(np.float32)
    return x, y


def build_model(keras):
    """The same architecture in Keras 2 (tf.keras 2.15) and Keras 3, with fixed weights."""
    rng = np.random.default_rng(7)
    inp = keras.Input((IDS,), dtype="int32")
    h = keras.layers.Embedding(ROWS, DIM, name="emb")(inp)
    h = keras.layers.Flatten(name="flat")(h)
    h = keras.layers.Dense(5, activation="tanh", name="hidden")(h)
    out = keras.layers.Dense(1, name="out")(h)
    model = keras.Model(inp, out)
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


def fit(model, x, y):
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)


def make(directory):
    import tensorflow as tf
    import tensorflow_addons as tfa

    os.makedirs(directory, exist_ok=True)
    model = build_model(tf.keras)
    model.compile(optimizer=tfa.optimizers.LazyAdam(**HYPER), loss="mse")
    fit(model, *data(1, FIRST_STEPS))
    model.save(os.path.join(directory, "model.h5"))
    x, y = data(2, CONTINUE_STEPS)
    fit(model, x, y)
    np.savez(os.path.join(directory, "expected.npz"), x=x, y=y,
             **{f"weight_{i}": w for i, w in enumerate(model.get_weights())})


def expected_weights(directory):
    with np.load(os.path.join(directory, "expected.npz")) as f:
        count = len([k for k in f.files if k.startswith("weight_")])
        return f["x"], f["y"], [f[f"weight_{i}"] for i in range(count)]


def continue_training(path, optimizer, out):
    """Loads the Keras 2 model at `path` (.h5 or SavedModel) the way docs/MIGRATING.md says,
    in a process that never imported tfa (a migrated program), with "Addons>LazyAdam" mapped
    to `optimizer` ("fusedopt": fusedopt.keras.legacy.LazyAdam, "keras_adam": Keras's
    non-lazy legacy Adam), trains CONTINUE_STEPS steps on data(2) and saves to `out` the
    optimizer's class and step count and the weights before and after."""
    import tensorflow as tf

    from fusedopt.keras import legacy

    classes = {"fusedopt": legacy.LazyAdam, "keras_adam": tf.keras.optimizers.legacy.Adam}
    model = tf.keras.models.load_model(path, custom_objects={"Addons>LazyAdam":
                                                             classes[optimizer]})
    if os.path.isdir(path):
        # Keras 2.15's load_model of a SavedModel leaves the optimizer's state behind (with
        # tfa's class too); the SavedModel's variables, read as weights, bring it back.
        model.load_weights(os.path.join(path, "variables", "variables")).expect_partial()
    assert "tensorflow_addons" not in sys.modules
    loaded = type(model.optimizer)
    iterations = int(model.optimizer.iterations.numpy())
    before = model.get_weights()
    fit(model, *data(2, CONTINUE_STEPS))
    np.savez(out, optimizer=f"{loaded.__module__}.{loaded.__name__}", iterations=iterations,
             **{f"before_{i}": w for i, w in enumerate(before)},
             **{f"after_{i}": w for i, w in enumerate(model.get_weights())})


def load_continued(out):
    with np.load(out) as f:
        count = len([k for k in f.files if k.startswith("after_")])
        return (str(f["optimizer"]), int(f["iterations"]),
                [f[f"before_{i}"] for i in range(count)], [f[f"after_{i}"] for i in range(count)])


if __name__ == "__main__":
    if sys.argv[1] == "continue":
        continue_training(*sys.argv[2:5])
    else:
        make(sys.argv[1])
