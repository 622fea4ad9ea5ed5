"""docs/guides/saving.md: what a fresh process needs to load what was saved with
fusedopt's optimizers (Keras 3 on TF >= 2.16, Keras 2.15 on TF 2.15).

- A ``.keras`` file: the optimizer is a registered custom class. Keras 3 finds it only once
  ``fusedopt.keras`` is imported (it auto-imports only its own packages); then it loads
  with its state and trains on; without the import it fails (the documented behaviour), or
  loads without the optimizer with ``compile=False``. Keras 2.15 imports the module itself.
- A SavedModel: a serving signature holds no fusedopt op and loads where fusedopt is not even
  imported; a saved training function holds the fused ops and needs the op library loaded
  first (``import fusedopt.ops``), else TensorFlow names the unregistered op.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import fusedopt.keras as fk

keras = tf.keras
KERAS3 = hasattr(keras.optimizers.Optimizer, "stateless_apply")  # Keras 3 (not 2.x)
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def fresh_python(code):
    """Runs `code` in a new interpreter (this one's sys.path, so the same fusedopt is
    importable, but nothing imported)."""
    env = dict(ENV, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=300)


def small_model():
    keras.utils.set_random_seed(1)
    inp = keras.Input((3,), dtype="int32")
    h = keras.layers.Embedding(10, 4)(inp)
    h = keras.layers.Flatten()(h)
    out = keras.layers.Dense(1)(h)
    return keras.Model(inp, out)


def batches(seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 10, (8, 3)).astype(np.int32),
            rng.normal(size=(8, 1)).astype(np.float32))


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("keras") / "m.keras")
    model = small_model()
    model.compile(optimizer=fk.LazyAdam(0.01), loss="mse")
    model.fit(*batches(0), batch_size=4, verbose=0)
    model.save(path)
    model.fit(*batches(1), batch_size=4, shuffle=False, verbose=0)
    np.save(path + ".after.npy", model.get_weights()[0])
    return path


LOAD_AND_TRAIN = """
    import sys
    import numpy as np
    import tensorflow as tf
    {imports}
    model = tf.keras.models.load_model({path!r})
    print(type(model.optimizer).__module__, type(model.optimizer).__name__,
          int(model.optimizer.iterations.numpy()))
    rng = np.random.default_rng(1)
    x = rng.integers(0, 10, (8, 3)).astype(np.int32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
    np.testing.assert_allclose(model.get_weights()[0], np.load({path!r} + ".after.npy"),
                               rtol=1e-6, atol=1e-7)
    print("trained on")
"""


@pytest.mark.slow
def test_keras_file_loads_in_a_fresh_process_after_importing_fusedopt_keras(keras_file):
    proc = fresh_python(LOAD_AND_TRAIN.format(imports="import fusedopt.keras",
                                              path=keras_file))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["fusedopt.keras", "LazyAdam", "2", "trained", "on"]


@pytest.mark.slow
def test_keras_file_without_the_import(keras_file):
    proc = fresh_python(LOAD_AND_TRAIN.format(imports="", path=keras_file))
    if KERAS3:  # Keras 3 imports only Keras's own packages: it fails naming the class
        assert proc.returncode != 0
        assert "Could not locate class 'LazyAdam'" in proc.stderr, proc.stderr[-3000:]
    else:  # Keras 2.15 imports the module the file names (fusedopt.keras) itself
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == ["fusedopt.keras", "LazyAdam", "2", "trained", "on"]
    # compile=False: the model and its weights, without the optimizer.
    weights_only = fresh_python(f"""
        import sys, tensorflow as tf
        model = tf.keras.models.load_model({keras_file!r}, compile=False)
        print(len(model.get_weights()), "fusedopt" in sys.modules)
    """)
    assert weights_only.returncode == 0, weights_only.stderr[-3000:]
    assert weights_only.stdout.split() == ["3", "False"]


class Serving(tf.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32)])
    def serve(self, x):
        return self.model(x)


class Training(Serving):
    def __init__(self, model, optimizer):
        super().__init__(model)
        self.optimizer = optimizer

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32),
                                  tf.TensorSpec([None, 1], tf.float32)])
    def train(self, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.model(x) - y))
        variables = self.model.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("savedmodel")
    model = small_model()
    optimizer = fk.LazyAdam(0.01)
    training = Training(model, optimizer)
    training.train(*batches(0))  # creates the slots; the function now holds the fused ops
    x = batches(2)[0]
    tf.saved_model.save(Serving(model), str(out / "serving"))
    tf.saved_model.save(training, str(out / "training"))
    np.save(str(out / "x.npy"), x)
    np.save(str(out / "y.npy"), model(x).numpy())
    return out


@pytest.mark.slow
def test_serving_savedmodel_loads_without_fusedopt(saved_models):
    proc = fresh_python(f"""
        import sys, numpy as np, tensorflow as tf
        loaded = tf.saved_model.load({str(saved_models / 'serving')!r})
        y = loaded.serve(np.load({str(saved_models / 'x.npy')!r})).numpy()
        np.testing.assert_allclose(y, np.load({str(saved_models / 'y.npy')!r}), rtol=1e-6)
        print("served", "fusedopt" in sys.modules)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["served", "False"]


@pytest.mark.slow
@pytest.mark.parametrize("load_library", [False, True])
def test_training_savedmodel_needs_the_op_library(saved_models, load_library):
    proc = fresh_python(f"""
        import numpy as np, tensorflow as tf
        {"import fusedopt.ops" if load_library else ""}
        loaded = tf.saved_model.load({str(saved_models / 'training')!r})
        x = np.load({str(saved_models / 'x.npy')!r})
        loss = loaded.train(x, np.zeros((len(x), 1), np.float32))
        print("trained", np.isfinite(loss.numpy()))
    """)
    if load_library:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == ["trained", "True"]
    else:
        assert proc.returncode != 0
        assert "Op type not registered 'FusedOpt>" in proc.stderr, proc.stderr[-3000:]


# --- a .keras file opened where fusedopt is not installed --------------------------------

_WITHOUT_FUSEDOPT = r"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "fusedopt" or name.startswith("fusedopt."):
            raise ImportError("fusedopt is not installed here")
sys.meta_path.insert(0, Block())
import numpy as np, keras
path, compile_it = sys.argv[1], sys.argv[2] == "1"
layers = {"fusedopt>Embedding": keras.layers.Embedding}
if compile_it:
    model = keras.models.load_model(path, custom_objects={
        "fusedopt>LazyAdam": keras.optimizers.Adam, **layers})
    before = int(model.optimizer.iterations)
    x = np.arange(48, dtype="int32").reshape(16, 3) % 50
    model.fit(x, np.ones((16, 1), "float32"), epochs=1, verbose=0)
    print(type(model.optimizer).__name__, before, int(model.optimizer.iterations))
else:
    model = keras.models.load_model(path, compile=False, custom_objects=layers)
    print("weights", len(model.get_weights()))
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(tf.keras.optimizers.Optimizer, "stateless_apply"),
                    reason="Keras 3's .keras format (the saving guide's recipe)")
def test_a_colleague_without_fusedopt_opens_the_keras_file(tmp_path):
    """The saving guide's recipe: custom_objects maps fusedopt's classes to Keras's (the
    optimizer's state carries on; the Embedding layer's table too); compile=False where the
    config holds fusedopt's own keywords."""
    def saved(optimizer, name):
        inp = tf.keras.Input((3,), dtype="int32")
        x = tf.keras.layers.Flatten()(fk.Embedding(50, 4)(inp))
        model = tf.keras.Model(inp, tf.keras.layers.Dense(1)(x))
        model.compile(optimizer=optimizer, loss="mse")
        x = np.arange(48, dtype="int32").reshape(16, 3) % 50
        model.fit(x, np.ones((16, 1), "float32"), epochs=1, verbose=0)
        path = str(tmp_path / name)
        model.save(path)
        return path

    def open_without_fusedopt(path, compile_it):
        out = subprocess.run([sys.executable, "-c", _WITHOUT_FUSEDOPT, path, compile_it],
                             capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip().splitlines()[-1]

    assert open_without_fusedopt(saved(fk.LazyAdam(1e-2), "lazy.keras"), "1") == "Adam 1 2"
    compact = saved(fk.LazyAdam(1e-2, slot_dtype="bfloat16"), "compact.keras")
    assert open_without_fusedopt(compact, "0").startswith("weights")
    row_wise = saved(fk.RowWiseAdagrad(0.1), "row_wise.keras")
    assert open_without_fusedopt(row_wise, "0").startswith("weights")
