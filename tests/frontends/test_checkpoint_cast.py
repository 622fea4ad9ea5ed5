"""fusedopt.checkpoint.cast_slots: checkpoints of compact-slot optimizers restore into
float32-slot ones (TF's, Keras's) after a cast, and back; TF's own restore refuses the
changed dtype (the reason it exists)."""
import os

import numpy as np
import pytest
import tensorflow as tf

import fusedopt.checkpoint as fck
import fusedopt.compat.v1 as fv1
import fusedopt.keras as fk

keras = tf.keras
KERAS3 = hasattr(keras.optimizers.Optimizer, "stateless_apply")


def _v1_trained(opt):
    var = tf.Variable(np.random.default_rng(0).uniform(-1, 1, (6, 4)).astype(np.float32))
    grad = tf.IndexedSlices(tf.ones((3, 4)), tf.constant([0, 2, 0]), tf.constant([6, 4]))
    for _ in range(3):
        opt.apply_gradients([(grad, var)])
    return var


def _slots(opt, var):
    return [opt.get_slot(var, name) for name in opt.get_slot_names()]


@pytest.mark.parametrize("direction", ["compact_to_float32", "float32_to_compact"])
def test_compat_v1_object_checkpoint(tmp_path, direction):
    narrow = fv1.LazyAdamOptimizer(0.1, slot_dtype="bfloat16")
    wide = tf.compat.v1.train.AdamOptimizer(0.1)
    source_opt, target_opt = (narrow, wide) if direction == "compact_to_float32" else (wide, narrow)
    var = _v1_trained(source_opt)
    path = tf.train.Checkpoint(var=var, optimizer=source_opt).write(
        os.path.join(tmp_path, "source"))
    fresh = tf.Variable(tf.zeros_like(var))
    # The target's slots exist before the restore (built by one zero-step update).
    target_opt.apply_gradients([(tf.zeros_like(fresh), fresh)])
    target = tf.train.Checkpoint(var=fresh, optimizer=target_opt)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        target.read(path).assert_consumed()
    keys = fck.slot_keys(path)
    assert len(keys) == 2 and all(".OPTIMIZER_SLOT" in k for k in keys)
    want = "float32" if direction == "compact_to_float32" else "bfloat16"
    cast = fck.cast_slots(path, os.path.join(tmp_path, "cast"), want)
    target.read(cast).assert_consumed()
    np.testing.assert_array_equal(fresh.numpy(), var.numpy())
    for a, b in zip(_slots(source_opt, var), _slots(target_opt, fresh)):
        assert b.dtype.base_dtype == tf.as_dtype(want)
        np.testing.assert_array_equal(b.numpy(), tf.cast(a, b.dtype.base_dtype).numpy())


def test_name_based_saver_checkpoint_needs_keys(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        var = tf.compat.v1.get_variable("emb", initializer=tf.ones((4, 2)), use_resource=True)
        opt = fv1.AdagradOptimizer(0.1, slot_dtype="float16")
        train = opt.apply_gradients([(tf.ones((4, 2)), var)])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train)
            path = saver.save(session, os.path.join(tmp_path, "v1"))
            slot_name = opt.get_slot(var, "accumulator").op.name
    with pytest.raises(ValueError, match="needs keys="):
        fck.cast_slots(path, os.path.join(tmp_path, "cast"), "float32")
    cast = fck.cast_slots(path, os.path.join(tmp_path, "cast"), "float32", keys=[slot_name])
    graph = tf.Graph()
    with graph.as_default():
        var = tf.compat.v1.get_variable("emb", initializer=tf.zeros((4, 2)), use_resource=True)
        opt = tf.compat.v1.train.AdagradOptimizer(0.1)
        opt.apply_gradients([(tf.ones((4, 2)), var)])
        with tf.compat.v1.Session(graph=graph) as session:
            tf.compat.v1.train.Saver().restore(session, cast)
            accum = session.run(opt.get_slot(var, "accumulator"))
    np.testing.assert_array_equal(accum, np.full((4, 2), np.float16(1.1), np.float32))


@pytest.mark.skipif(not KERAS3, reason="Keras 3's slot lists (Keras 2.15: the v1/legacy "
                    "slot variables, tested above)")
def test_keras3_checkpoint_into_keras_adam(tmp_path):
    var = keras.Variable(np.random.default_rng(1).uniform(-1, 1, (6, 4)).astype(np.float32))
    narrow = fk.LazyAdam(0.1, slot_dtype="bfloat16", use_ema=True)
    for _ in range(2):
        narrow.apply_gradients([(tf.ones((6, 4)), var)])
    path = tf.train.Checkpoint(optimizer=narrow).write(os.path.join(tmp_path, "k3"))
    keys = fck.slot_keys(path)
    assert len(keys) == 2  # momentum and velocity, not the EMA average
    cast = fck.cast_slots(path, os.path.join(tmp_path, "cast"), "float32")
    wide = keras.optimizers.Adam(0.1, use_ema=True)
    wide.build([keras.Variable(np.zeros((6, 4), np.float32))])
    tf.train.Checkpoint(optimizer=wide).read(cast).assert_consumed()
    for a, b in zip(narrow.variables, wide.variables):
        np.testing.assert_array_equal(np.asarray(b),
                                      np.asarray(a).astype(np.asarray(b).dtype))
