"""Migrating from tensorflow-addons' LazyAdam (docs/MIGRATING.md).

TF 2.15 (the CI environment with the real tensorflow-addons 0.23): a model compiled with
``tfa.optimizers.LazyAdam`` is trained, saved as .h5, as a SavedModel and as a checkpoint,
loaded with ``fusedopt.keras.legacy.LazyAdam`` in tfa's place, and trained on; the weights
must be those tfa itself reaches. tfa's constructor arguments give the same optimizer.

TF 2.21 (Keras 3, no tfa): the committed tfa-trained model (tests/frontends/data/tfa_lazy_adam, made
by tests/frontends/tfa_fixture.py and checked against tfa on TF 2.15 here) moves to Keras 3 with
``fusedopt.keras.LazyAdam`` and ``fusedopt.keras.migrate`` and continues with tfa's numbers.
Each test runs in one of CI's two environments and is skipped in the other.
"""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfa_fixture as fx

KERAS3 = tuple(int(x) for x in tf.__version__.split(".")[:2]) >= (2, 16) and \
    os.environ.get("TF_USE_LEGACY_KERAS") != "1"
FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tfa_lazy_adam")

try:
    with warnings.catch_warnings():  # tfa warns that it is winding down (addons#2807)
        warnings.simplefilter("ignore")
        import tensorflow_addons as tfa
except ImportError:
    tfa = None

needs_tfa = pytest.mark.skipif(
    tfa is None, reason="needs the real tensorflow-addons (TF 2.15 environment; CI runs it)")
needs_keras3 = pytest.mark.skipif(
    not KERAS3, reason="Keras 3 move: TF >= 2.16 environment (CI runs it on TF 2.21)")

# Weights of two float32 runs of the same math, summed in different orders.
RTOL, ATOL = 2e-5, 1e-6


def assert_same_weights(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def assert_not_same_weights(got, want):
    assert any(not np.allclose(g, w, rtol=RTOL, atol=ATOL) for g, w in zip(got, want))


# --- TF 2.15: tensorflow-addons -> fusedopt.keras.legacy.LazyAdam ---------------------------

@needs_tfa
@pytest.mark.parametrize("args,kwargs", [
    ((), {}),
    ((0.01,), {}),
    ((0.01, 0.8, 0.99, 1e-6, False, "LazyAdam"), {}),  # tfa's positional order
    ((), dict(learning_rate=0.05, beta_1=0.85, epsilon=1e-5, clipnorm=1.0, name="emb_opt")),
    ((), dict(learning_rate=0.01, clipvalue=0.5, decay=1e-3)),
    ((), dict(global_clipnorm=2.0)),
], ids=["defaults", "lr", "positional", "keywords", "clipvalue_decay", "global_clipnorm"])
def test_tfa_constructor_arguments_give_the_same_optimizer(args, kwargs):
    from fusedopt.keras import legacy as fl

    theirs = tfa.optimizers.LazyAdam(*args, **kwargs)
    ours = fl.LazyAdam(*args, **kwargs)
    want, got = theirs.get_config(), ours.get_config()
    if len(args) < 6 and "name" not in kwargs:  # the one difference: Keras's default name
        assert (want.pop("name"), got.pop("name")) == ("LazyAdam", "Adam")
    assert got == want
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert fl.LazyAdam(learning_rate=schedule).get_config() == {
        **tfa.optimizers.LazyAdam(learning_rate=schedule).get_config(), "name": "Adam"}
    # A saved tfa config deserializes into our class.
    assert fl.LazyAdam.from_config(theirs.get_config()).get_config() == theirs.get_config()


@pytest.fixture(scope="module")
def tfa_trained(tmp_path_factory):
    """A model trained FIRST_STEPS steps with tfa's LazyAdam, saved three ways, and the
    weights tfa reaches CONTINUE_STEPS steps later."""
    out = tmp_path_factory.mktemp("tfa")
    model = fx.build_model(tf.keras)
    model.compile(optimizer=tfa.optimizers.LazyAdam(**fx.HYPER), loss="mse")
    fx.fit(model, *fx.data(1, fx.FIRST_STEPS))
    paths = {"h5": str(out / "model.h5"), "savedmodel": str(out / "savedmodel"),
             "checkpoint": str(out / "ckpt")}
    model.save(paths["h5"])
    model.save(paths["savedmodel"], save_format="tf")
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(paths["checkpoint"])
    x, y = fx.data(2, fx.CONTINUE_STEPS)
    before = model.get_weights()
    fx.fit(model, x, y)
    return dict(paths, x=x, y=y, before=before, after=model.get_weights())


def continue_in_fresh_process(path, optimizer, tmp_path):
    """tfa_fixture.continue_training in a new interpreter that never imports tfa, as a
    migrated program would run (with tfa imported, Keras 2 resolves "Addons>LazyAdam" from
    its global registry before custom_objects: test_with_tfa_imported_keras2_loads_tfas_class)."""
    out = str(tmp_path / f"continued_{optimizer}.npz")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, fx.__file__, "continue", path, optimizer, out],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return fx.load_continued(out)


def check_continues_as_tfa(model_optimizer, iterations, before, after, tfa_trained):
    assert model_optimizer == "fusedopt.keras.legacy.LazyAdam"
    assert iterations == fx.FIRST_STEPS  # the optimizer's state came along
    assert_same_weights(before, tfa_trained["before"])
    assert_same_weights(after, tfa_trained["after"])
    # Lazy like tfa: embedding rows no batch named (8..11) never moved.
    np.testing.assert_array_equal(after[0][8:], tfa_trained["before"][0][8:])


@needs_tfa
@pytest.mark.parametrize("form", ["h5", "savedmodel"])
def test_tfa_model_loads_with_custom_objects_and_continues_as_tfa(tfa_trained, form, tmp_path):
    check_continues_as_tfa(*continue_in_fresh_process(tfa_trained[form], "fusedopt", tmp_path),
                           tfa_trained)


@needs_tfa
def test_with_tfa_imported_keras2_loads_tfas_class(tfa_trained):
    # The caveat in docs/MIGRATING.md: Keras 2's load_model merges its global registry over
    # custom_objects (and custom_object_scope), so in a process that imported tfa,
    # "Addons>LazyAdam" stays tfa's class. Migrated code must not import tfa.
    from fusedopt.keras import legacy as fl

    with tf.keras.utils.custom_object_scope({"Addons>LazyAdam": fl.LazyAdam}):
        model = tf.keras.models.load_model(
            tfa_trained["h5"], custom_objects={"Addons>LazyAdam": fl.LazyAdam})
    assert type(model.optimizer) is tfa.optimizers.LazyAdam


@needs_tfa
def test_tfa_checkpoint_restores_into_fusedopt_and_continues_as_tfa(tfa_trained):
    from fusedopt.keras import legacy as fl

    model = fx.build_model(tf.keras)
    model.compile(optimizer=fl.LazyAdam(**fx.HYPER), loss="mse")
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(
        tfa_trained["checkpoint"])
    status.assert_existing_objects_matched()
    before = model.get_weights()
    fx.fit(model, tfa_trained["x"], tfa_trained["y"])
    status.assert_consumed()  # step count and slots restored as the first step made them
    check_continues_as_tfa("fusedopt.keras.legacy.LazyAdam",
                           int(model.optimizer.iterations.numpy()) - fx.CONTINUE_STEPS,
                           before, model.get_weights(), tfa_trained)


@needs_tfa
def test_keras_adam_would_not_continue_as_tfa(tfa_trained, tmp_path):
    # What the comparisons above can tell apart: the non-lazy Keras Adam moves rows that no
    # batch names (their moments are nonzero), so its weights differ from tfa's.
    optimizer, _, _, after = continue_in_fresh_process(tfa_trained["h5"], "keras_adam", tmp_path)
    assert optimizer.endswith(".Adam")
    assert_not_same_weights(after, tfa_trained["after"])


@needs_tfa
def test_committed_fixture_is_what_tfa_produces(tmp_path):
    fx.make(str(tmp_path))
    x, y, weights = fx.expected_weights(str(tmp_path))
    cx, cy, committed = fx.expected_weights(FIXTURE)
    np.testing.assert_array_equal(x, cx)
    np.testing.assert_array_equal(y, cy)
    assert_same_weights(weights, committed)
    saved = tf.keras.models.load_model(os.path.join(FIXTURE, "model.h5"),
                                       custom_objects={"Addons>LazyAdam": tfa.optimizers.LazyAdam})
    fresh = tf.keras.models.load_model(str(tmp_path / "model.h5"),
                                       custom_objects={"Addons>LazyAdam": tfa.optimizers.LazyAdam})
    assert_same_weights(saved.get_weights(), fresh.get_weights())
    assert_same_weights(saved.optimizer.get_weights(), fresh.optimizer.get_weights())


# --- TF 2.21: the tfa model moves to Keras 3 with fusedopt.keras.LazyAdam --------------------

def _keras3_model_and_optimizer(optimizer_class=None):
    import keras

    from fusedopt.keras import migrate

    path = os.path.join(FIXTURE, "model.h5")
    model = keras.models.load_model(path, compile=False)
    if optimizer_class is None:
        optimizer = migrate.lazy_adam_from_h5(path)
    else:
        optimizer = optimizer_class(**fx.HYPER)
    model.compile(optimizer=optimizer, loss="mse")
    migrate.restore_optimizer_state(optimizer, model.trainable_variables, path)
    return model, optimizer


@needs_keras3
def test_tfa_h5_moves_to_keras3_and_continues_as_tfa():
    import fusedopt.keras

    model, optimizer = _keras3_model_and_optimizer()
    assert type(optimizer) is fusedopt.keras.LazyAdam
    config = optimizer.get_config()
    assert {k: config[k] for k in fx.HYPER} == pytest.approx(fx.HYPER)
    assert int(optimizer.iterations.numpy()) == fx.FIRST_STEPS
    x, y, want = fx.expected_weights(FIXTURE)
    before = model.get_weights()
    fx.fit(model, x, y)
    assert int(optimizer.iterations.numpy()) == fx.FIRST_STEPS + fx.CONTINUE_STEPS
    after = model.get_weights()
    assert_same_weights(after, want)
    np.testing.assert_array_equal(after[0][8:], before[0][8:])


@needs_keras3
def test_keras3_adam_would_not_continue_as_tfa():
    # The same move with Keras 3's own (non-lazy) Adam: the comparison above can tell.
    import keras

    model, _ = _keras3_model_and_optimizer(keras.optimizers.Adam)
    x, y, want = fx.expected_weights(FIXTURE)
    fx.fit(model, x, y)
    assert_not_same_weights(model.get_weights(), want)


@needs_keras3
def test_keras3_move_refuses_what_it_cannot_carry(tmp_path):
    import h5py
    import keras

    from fusedopt.keras import migrate

    path = str(tmp_path / "model.h5")
    with open(os.path.join(FIXTURE, "model.h5"), "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    model = keras.models.load_model(path, compile=False)
    optimizer = migrate.lazy_adam_from_h5(path)
    with pytest.raises(ValueError, match="has 'm' for 5 variables, the model has 4"):
        migrate.restore_optimizer_state(optimizer, model.trainable_variables[1:], path)
    with h5py.File(path, "a") as f:
        config = f.attrs["training_config"]
        f.attrs["training_config"] = config.replace('"decay": 0.0', '"decay": 0.01') \
            if isinstance(config, str) else config.replace(b'"decay": 0.0', b'"decay": 0.01')
        del f["optimizer_weights"]
    with pytest.raises(ValueError, match="decay=0.01"):
        migrate.lazy_adam_from_h5(path)
    with pytest.raises(ValueError, match="holds no optimizer weights"):
        migrate.restore_optimizer_state(optimizer, model.trainable_variables, path)
