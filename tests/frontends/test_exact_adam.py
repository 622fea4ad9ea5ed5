"""Adam beside LazyAdam: fusedopt.keras.Adam, fusedopt.keras.legacy.Adam and
fusedopt.compat.v1.AdamOptimizer update every row on a sparse gradient, as the classes they
replace do (rows no id names take a zero gradient: their moments decay and the variable
moves), in one fused dense pass on the summed gradient.

Each is run side by side with the class it replaces over many sparse steps (ids repeated
within a batch, rows left untouched for many steps), and against an independent NumPy
float64 Adam. Keras 3's own sparse path squares each repeated id's gradient on its own
(v gets sum(g_i^2), not (sum g_i)^2, unlike its dense path and every other Adam); fusedopt's
class follows Adam's math on the summed gradient, so there it is compared with Keras 3 on
batches without repeats and, with repeats, with Keras 3 given the same gradient dense.
"""
import numpy as np
import pytest
import tensorflow as tf

import fusedopt.keras as fk
from fusedopt import _dispatch
from fusedopt.compat import v1 as fv1

keras = tf.keras
KERAS3 = hasattr(keras.optimizers.Optimizer, "stateless_apply")
ROWS, DIM, BATCH, STEPS = 40, 3, 12, 60
HYPER = dict(lr=0.01, b1=0.9, b2=0.999)


def _batches(seed, repeats, steps=STEPS):
    """[(ids, values)] per step: ids from the first half of the rows only (the rest are never
    touched), with or without repeats within a batch."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        if repeats:
            ids = rng.integers(0, ROWS // 2, BATCH)
        else:
            ids = rng.permutation(ROWS // 2)[:BATCH]
        out.append((ids.astype(np.int32), rng.standard_normal((BATCH, DIM)).astype(np.float32)))
    return out


def _initial():
    return np.random.default_rng(7).uniform(-1, 1, (ROWS, DIM)).astype(np.float32)


def numpy_adam(batches, epsilon, lr=HYPER["lr"], b1=HYPER["b1"], b2=HYPER["b2"]):
    """Adam in float64 on the dense gradient of each batch (repeats summed)."""
    w = _initial().astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, (ids, values) in enumerate(batches, start=1):
        g = np.zeros_like(w)
        np.add.at(g, ids, values.astype(np.float64))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + epsilon)
    return w, m, v


def _sparse(ids, values):
    return tf.IndexedSlices(tf.constant(values), tf.constant(ids), tf.constant([ROWS, DIM]))


def _keras_run(make, batches, dense=False, wrap=None):
    """(var, m, v) after `batches` with the Keras optimizer make(); `dense`: each batch's
    gradient densified first; `wrap`: the step function's decorator."""
    var = tf.Variable(_initial())
    opt = make()
    if hasattr(opt, "build") and not hasattr(opt, "get_slot"):
        opt.build([var])

    def step(ids, values):
        grad = _sparse(ids, values) if not isinstance(ids, tf.Tensor) else tf.IndexedSlices(
            values, ids, tf.constant([ROWS, DIM]))
        if dense:
            grad = tf.convert_to_tensor(grad)
        opt.apply_gradients([(grad, var)])

    run = wrap(step) if wrap else step
    for ids, values in batches:
        if wrap:
            run(tf.constant(ids), tf.constant(values))
        else:
            run(ids, values)
    return var.numpy(), _keras_slots(opt, var)


def _keras_slots(opt, var):
    if hasattr(opt, "_momentums"):  # Keras 3 and 2.15's optimizer
        index = opt._get_variable_index(var) if hasattr(opt, "_get_variable_index") else \
            opt._index_dict[opt._var_key(var)]
        return opt._momentums[index].numpy(), opt._velocities[index].numpy()
    return opt.get_slot(var, "m").numpy(), opt.get_slot(var, "v").numpy()


def _close(ours, theirs, rtol=2e-5, atol=2e-6):
    for a, b in zip(ours if isinstance(ours, tuple) else (ours,),
                    theirs if isinstance(theirs, tuple) else (theirs,)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def _flatten(result):
    var, (m, v) = result
    return var, m, v


# --- Keras (Keras 3 on TF >= 2.16, Keras 2.15 on TF 2.15) ---------------------------------

def _keras_adam(cls, **kwargs):
    return lambda: cls(learning_rate=HYPER["lr"], **kwargs)


def test_keras_adam_is_keras_adam_over_many_sparse_steps():
    batches = _batches(0, repeats=False)
    ours = _flatten(_keras_run(_keras_adam(fk.Adam), batches))
    theirs = _flatten(_keras_run(_keras_adam(keras.optimizers.Adam), batches))
    _close(ours, theirs)
    _close(ours, numpy_adam(batches, epsilon=1e-7), rtol=1e-4, atol=1e-5)


def test_keras_adam_with_repeated_ids_is_adam_of_the_summed_gradient():
    batches = _batches(1, repeats=True)
    ours = _flatten(_keras_run(_keras_adam(fk.Adam), batches))
    dense = _flatten(_keras_run(_keras_adam(keras.optimizers.Adam), batches, dense=True))
    _close(ours, dense)
    _close(ours, numpy_adam(batches, epsilon=1e-7), rtol=1e-4, atol=1e-5)
    if not KERAS3:  # Keras 2.15 sums repeats before its update: the same numbers sparse
        _close(ours, _flatten(_keras_run(_keras_adam(keras.optimizers.Adam), batches)))


def test_untouched_rows_decay_as_in_adam_and_stay_with_lazy_adam():
    batches = _batches(2, repeats=True, steps=3) + [
        (np.array([0], np.int32), np.ones((1, DIM), np.float32))] * 5
    exact = _flatten(_keras_run(_keras_adam(fk.Adam), batches))
    lazy = _flatten(_keras_run(_keras_adam(fk.LazyAdam), batches))
    rows = np.unique(np.concatenate([ids for ids, _ in batches[:3]]))
    rows = rows[rows != 0]
    # Touched in the first three steps only: Adam keeps moving them, LazyAdam does not.
    lazy_three = _flatten(_keras_run(_keras_adam(fk.LazyAdam), batches[:3]))
    exact_three = _flatten(_keras_run(_keras_adam(fk.Adam), batches[:3]))
    np.testing.assert_array_equal(lazy[0][rows], lazy_three[0][rows])
    np.testing.assert_array_equal(lazy[1][rows], lazy_three[1][rows])
    assert np.all(np.abs(exact[0][rows] - exact_three[0][rows]) > 0)
    np.testing.assert_allclose(exact[1][rows], exact_three[1][rows] * 0.9 ** 5, rtol=1e-5)
    np.testing.assert_allclose(exact[2][rows], exact_three[2][rows] * 0.999 ** 5, rtol=1e-5)
    _close(exact, numpy_adam(batches, epsilon=1e-7), rtol=1e-4, atol=1e-5)


def test_keras_adam_xla_and_tf_function_give_the_same_numbers():
    batches = _batches(3, repeats=True, steps=8)
    eager = _flatten(_keras_run(_keras_adam(fk.Adam), batches))
    for wrap in (tf.function, tf.function(jit_compile=True)):
        _close(_flatten(_keras_run(_keras_adam(fk.Adam), batches, wrap=wrap)), eager)


def _update_ops(jit_compile):
    var = tf.Variable(_initial())
    opt = fk.Adam(learning_rate=0.1)

    @tf.function(jit_compile=jit_compile)
    def step(ids, values):
        opt.apply_gradients([(tf.IndexedSlices(values, ids, tf.constant([ROWS, DIM])), var)])

    ids, values = _batches(4, repeats=True, steps=1)[0]
    graph = step.get_concrete_function(tf.constant(ids), tf.constant(values)).graph
    nodes = [(op.type, op.node_def) for op in graph.get_operations()]
    for f in graph._functions.values():
        nodes += [(n.op, n) for n in f.definition.node_def]
    return {(kind, node.attr["every_row"].b if "every_row" in node.attr else None)
            for kind, node in nodes if kind.startswith("FusedOpt>")}


def test_keras_adam_on_the_cpu_is_the_sparse_op_updating_every_row():
    assert _update_ops(jit_compile=False) == {("FusedOpt>ResourceSparseApplyLazyAdam", True)}


def test_keras_adam_under_xla_is_the_dense_op_on_the_summed_gradient():
    # The op's XLA kernels refuse every_row: the dense op on the densified gradient instead.
    assert _update_ops(jit_compile=True) == {("FusedOpt>ResourceApplyLazyAdam", None)}


def test_keras_adam_keeps_keras_adam_name_and_config():
    opt = fk.Adam(learning_rate=0.02, beta_1=0.8)
    config = opt.get_config()
    assert config["beta_1"] == 0.8 and opt.name.lower().startswith("adam")
    again = fk.Adam.from_config(config)
    assert type(again) is fk.Adam and again.get_config() == config
    assert keras.optimizers.deserialize(keras.optimizers.serialize(opt)).__class__ is fk.Adam


def test_keras_adam_refuses_lazy_weight_decay():
    with pytest.raises(ValueError, match="LazyAdam"):
        fk.Adam(weight_decay=0.01, lazy_weight_decay=True)


# --- a bad id: refused, nothing written --------------------------------------------------

@pytest.mark.parametrize("bad", [ROWS, -1])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_bad_id_is_refused_and_nothing_changes(bad, mode):
    var = tf.Variable(_initial())
    opt = fk.Adam(learning_rate=0.1)
    ids, values = _batches(5, repeats=True, steps=1)[0]
    opt.apply_gradients([(_sparse(ids, values), var)])  # slots exist and are non-zero
    before = [var.numpy().copy(), *(x.copy() for x in _keras_slots(opt, var))]
    ids = ids.copy()
    ids[3] = bad

    def step():
        opt.apply_gradients([(_sparse(ids, values), var)])

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[3\] = %d is not in "
                       r"\[0, %d\)" % (bad, ROWS)):
        (tf.function(step) if mode == "function" else step)()
    after = [var.numpy(), *_keras_slots(opt, var)]
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b, a)


# --- Keras 2 (tf_keras / tf.keras.optimizers.legacy) ---------------------------------------

def test_legacy_adam_is_keras2_adam_over_many_sparse_steps():
    fl = pytest.importorskip("fusedopt.keras.legacy")
    from fusedopt.keras.legacy import _keras

    batches = _batches(6, repeats=True)
    for wrap in (None, tf.function):
        ours = _flatten(_keras_run(_keras_adam(fl.Adam), batches, wrap=wrap))
        theirs = _flatten(_keras_run(_keras_adam(_keras.optimizers.legacy.Adam), batches,
                                     wrap=wrap))
        _close(ours, theirs)
    _close(ours, numpy_adam(batches, epsilon=1e-7), rtol=1e-4, atol=1e-5)


# --- tf.compat.v1 ------------------------------------------------------------------------

def _v1_graph_run(cls, batches, resource):
    graph = tf.Graph()
    with graph.as_default():
        var = tf.compat.v1.Variable(_initial(), use_resource=resource)
        ids = tf.compat.v1.placeholder(tf.int32, [None])
        values = tf.compat.v1.placeholder(tf.float32, [None, DIM])
        opt = cls(learning_rate=HYPER["lr"])
        train = opt.apply_gradients([(tf.IndexedSlices(values, ids, [ROWS, DIM]), var)])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for i, v in batches:
                sess.run(train, {ids: i, values: v})
            return tuple(sess.run([var, opt.get_slot(var, "m"), opt.get_slot(var, "v")]))


@pytest.mark.parametrize("resource", [True, False], ids=["resource", "ref"])
def test_compat_v1_adam_is_tf_adam_optimizer(resource):
    batches = _batches(8, repeats=True)
    ours = _v1_graph_run(fv1.AdamOptimizer, batches, resource)
    theirs = _v1_graph_run(tf.compat.v1.train.AdamOptimizer, batches, resource)
    _close(ours, theirs)
    _close(ours, numpy_adam(batches, epsilon=1e-8), rtol=1e-4, atol=1e-5)
    lazy = _v1_graph_run(fv1.LazyAdamOptimizer, batches, resource)
    assert not np.allclose(lazy[0], ours[0])  # LazyAdam: other numbers


def test_compat_v1_adam_eager_and_checkpoint_names():
    batches = _batches(9, repeats=True, steps=10)
    var = tf.Variable(_initial())
    theirs_var = tf.Variable(_initial())
    ours, theirs = fv1.AdamOptimizer(HYPER["lr"]), tf.compat.v1.train.AdamOptimizer(HYPER["lr"])
    for ids, values in batches:
        ours.apply_gradients([(_sparse(ids, values), var)])
        theirs.apply_gradients([(_sparse(ids, values), theirs_var)])
    _close(var.numpy(), theirs_var.numpy())
    assert ours.get_name() == "Adam" and sorted(ours.get_slot_names()) == ["m", "v"]


def test_densify_sums_repeats_and_checks_ids():
    var = tf.Variable(tf.zeros([4, 2]))
    grad = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([1, 1, 3], tf.int64))
    np.testing.assert_array_equal(_dispatch.densify(grad, var).numpy(),
                                  [[0, 0], [2, 2], [0, 0], [1, 1]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[2\] = 4"):
        _dispatch.densify(tf.IndexedSlices(tf.ones([3, 2]), tf.constant([1, 1, 4])), var)


def test_keras_fit_trains_an_embedding_model_as_keras_adam_on_the_summed_gradient():
    """model.fit with repeated ids in every batch: fusedopt.keras.Adam against Keras's Adam
    given each step's gradient dense (Keras 3's own sparse path squares repeats apart)."""

    class DenseGradientAdam(keras.optimizers.Adam):
        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            grads_and_vars = [(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices)
                               else g, v) for g, v in grads_and_vars]
            return super().apply_gradients(grads_and_vars, *args, **kwargs)

    rng = np.random.default_rng(11)
    ids = rng.integers(0, ROWS // 2, (256, 4))  # repeats in every batch; half the rows unused
    labels = rng.uniform(size=(256, 1)).astype(np.float32)

    def fit(optimizer):
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,), dtype="int32"),
                                  keras.layers.Embedding(ROWS, DIM),
                                  keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
        history = model.fit(ids, labels, batch_size=32, epochs=3, shuffle=False, verbose=0)
        return model.get_weights(), history.history["loss"]

    ours, our_loss = fit(fk.Adam(learning_rate=0.05))
    theirs, their_loss = fit(DenseGradientAdam(learning_rate=0.05))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(our_loss, their_loss, rtol=1e-4)
    assert our_loss[-1] < our_loss[0]  # it trains
