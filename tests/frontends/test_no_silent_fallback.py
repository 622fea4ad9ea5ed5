"""No silent fallback: a setting that runs the replaced Keras class's own (unfused) update
says so once (``fusedopt.FallbackWarning``), and an option that cannot take effect says so
once (``fusedopt.IgnoredOptionWarning``); fused settings stay quiet. The numbers are the
replaced class's in every case (the update is still right)."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import fusedopt
import fusedopt.keras as fk
from fusedopt.compat import v1 as fv1


def _caught(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if issubclass(w.category, fusedopt.FusedOptWarning)]


def _train(opt, steps=3, dtype=np.float32):
    var = tf.Variable(np.linspace(-1, 1, 12).reshape(4, 3).astype(dtype))
    for step in range(steps):
        grad = tf.constant(np.full((4, 3), 0.1 * (step + 1), dtype))
        opt.apply_gradients([(grad, var)])
    return var.numpy()


@pytest.mark.parametrize("name,kwargs,setting,base", [
    ("RMSprop", {}, "momentum=0", "RMSprop"),
    ("RMSprop", {"centered": True}, "momentum=0", "RMSprop"),
    ("LazyAdam", {"amsgrad": True}, "amsgrad=True", "Adam"),
])
def test_keras_fallback_warns_once_and_matches_keras(name, kwargs, setting, base):
    opt, caught = _caught(lambda: getattr(fk, name)(learning_rate=0.01, **kwargs))
    (warning,) = caught
    assert issubclass(warning.category, fusedopt.FallbackWarning)
    message = str(warning.message)
    assert f"{name}({setting}) runs the replaced Keras class's own {base} update" in message
    ours, again = _caught(lambda: _train(opt))
    assert not again  # once
    theirs = _train(getattr(tf.keras.optimizers, base)(learning_rate=0.01, **kwargs))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize("name,kwargs", [
    ("RMSprop", {"momentum": 0.9}), ("RMSprop", {"momentum": 0.9, "centered": True}),
    ("LazyAdam", {}), ("Adagrad", {}), ("Adamax", {}),
])
def test_fused_settings_are_quiet(name, kwargs):
    def run():
        return _train(getattr(fk, name)(learning_rate=0.01, **kwargs))
    _, caught = _caught(run)
    assert not caught


def test_legacy_fallback_warns():
    from fusedopt.keras import legacy
    _, caught = _caught(lambda: legacy.RMSprop(0.01))
    (warning,) = caught
    assert issubclass(warning.category, fusedopt.FallbackWarning)
    assert "RMSprop(momentum=0)" in str(warning.message)
    _, caught = _caught(lambda: legacy.RMSprop(0.01, momentum=0.9))
    assert not caught


@pytest.mark.parametrize("make", [
    lambda: fk.Adagrad(0.1, stochastic_rounding=True),
    lambda: fv1.AdagradOptimizer(0.1, stochastic_rounding=True),
], ids=["keras", "compat_v1"])
def test_stochastic_rounding_without_16_bit_slots_warns_once(make):
    opt = make()
    _, caught = _caught(lambda: _train(opt))
    (warning,) = caught
    assert issubclass(warning.category, fusedopt.IgnoredOptionWarning)
    assert "stochastic_rounding=True has no effect" in str(warning.message)
    assert "float32" in str(warning.message)


def test_stochastic_rounding_of_16_bit_variables_is_quiet():
    """A float16 variable's slots are 16-bit: stochastic rounding applies to them."""
    _, caught = _caught(lambda: _train(fv1.AdagradOptimizer(0.1, stochastic_rounding=True),
                                       dtype=np.float16))
    assert not caught
    _, caught = _caught(lambda: _train(fk.Adagrad(0.1, slot_dtype="bfloat16",
                                                  stochastic_rounding=True)))
    assert not caught


def test_warning_categories_are_importable_without_tensorflow():
    import subprocess
    import sys
    out = subprocess.run(
        [sys.executable, "-c", "import sys, fusedopt; "
         "assert issubclass(fusedopt.FallbackWarning, fusedopt.FusedOptWarning); "
         "assert issubclass(fusedopt.IgnoredOptionWarning, UserWarning); "
         "print('tensorflow' in sys.modules)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- fusedopt.explain: which kernel updates which variable --------------------------------


def test_explain_names_each_variables_kernels():
    emb = tf.Variable(np.zeros((10, 4), np.float32), name="emb")
    wide = tf.Variable(np.zeros((3,), np.float64), name="wide")
    opt = fk.LazyAdam(slot_dtype="bfloat16", stochastic_rounding=True)
    explanation = fusedopt.explain(opt, [emb, wide])
    assert explanation.rule == "lazy_adam" and explanation.fused
    by_name = {r.name.split(":")[0]: r for r in explanation.variables}
    assert by_name["emb"].slot_dtype == "bfloat16" and by_name["wide"].slot_dtype == "float64"
    assert by_name["emb"].dense.startswith("FusedOpt>ResourceGroupApplyLazyAdam")
    assert by_name["emb"].sparse.startswith("FusedOpt>ResourceSparseApplyLazyAdam")
    text = str(explanation)
    assert "compact slots: bfloat16" in text and "stochastic rounding" in text


def test_explain_says_where_keras_runs_its_own_update():
    emb = tf.Variable(np.zeros((10, 4), np.float32))
    complex_var = tf.Variable(np.zeros((2,), np.complex64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fusedopt.FallbackWarning)
        explanation = fusedopt.explain(fk.RMSprop(), [emb])
    assert not explanation.fused
    assert explanation.variables[0].dense == "Keras's own RMSprop update (momentum=0)"
    explanation = fusedopt.explain(fk.RMSprop(momentum=0.9, centered=True), [emb, complex_var])
    assert explanation.rule == "centered_rms_prop" and not explanation.fused
    assert "no fused kernel for complex64" in explanation.variables[1].dense
    assert "not a fusedopt optimizer" in str(fusedopt.explain(tf.keras.optimizers.SGD(), [emb]))


def test_explain_compat_v1_ref_and_resource_variables_and_overrides():
    class Mine(fv1.AdagradOptimizer):
        def _resource_apply_dense(self, grad, var):
            return super()._resource_apply_dense(grad, var)

    with tf.Graph().as_default():
        ref = tf.compat.v1.Variable(np.zeros((4, 2), np.float32), use_resource=False)
        resource = tf.compat.v1.Variable(np.zeros((4, 2), np.float32), use_resource=True)
        routes = fusedopt.explain(fv1.AdagradOptimizer(0.1), [ref, resource]).variables
        assert routes[0].dense.startswith("FusedOpt>ApplyAdagrad")
        assert routes[0].sparse.startswith("FusedOpt>SparseApplyAdagrad")
        assert routes[1].dense.startswith("FusedOpt>ResourceGroupApplyAdagrad")
        mine = fusedopt.explain(Mine(0.1), [resource])
        assert mine.variables[0].dense == "FusedOpt>ResourceApplyAdagrad"
        assert "overridden" in mine.note


def test_explain_needs_variables_where_the_optimizer_keeps_none():
    with pytest.raises(ValueError, match=r"needs the variables: fusedopt.explain\(optimizer, "
                                         r"model.trainable_variables\)"):
        fusedopt.explain(fv1.AdagradOptimizer(0.1))
    opt = fk.Adagrad(0.1)
    var = tf.Variable(np.zeros((3,), np.float32))
    opt.apply_gradients([(tf.ones(3), var)])
    if hasattr(opt, "_trainable_variables"):  # Keras 3 keeps the variables it was built for
        assert len(fusedopt.explain(opt).variables) == 1
