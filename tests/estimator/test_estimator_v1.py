"""fusedopt.compat.v1 optimizers inside a tf.compat.v1.estimator.Estimator model_fn.

Needs tf.estimator (TensorFlow <= 2.15 with tensorflow-estimator installed); skipped
elsewhere. Each optimizer trains a small model with a dense weight (dense gradient) and
an embedding (IndexedSlices gradient): the loss falls, the fused ops are in the graph,
and a second Estimator on the same model_dir resumes from the checkpoint (global_step,
slots and beta powers continue).
"""

import numpy as np
import pytest
import tensorflow as tf

import harness
from fusedopt.compat import v1 as fv1


pytestmark = harness.requires_estimator

ROWS, DIM, FEATURES = 8, 2, 3
OPTIMIZERS = {
    "lazy_adam": (lambda: fv1.LazyAdamOptimizer(0.05), "Adam", ["m", "v"],
                  ["beta1_power", "beta2_power"], "LazyAdam"),
    "adamax": (lambda: fv1.AdamaxOptimizer(0.05), "AdaMax", ["m", "v"], ["beta1_power"],
               "Adamax"),
    "adagrad": (lambda: fv1.AdagradOptimizer(0.3), "Adagrad", ["accumulator"], [],
                "Adagrad"),
    # per-row slots (one value per row of w and emb)
    "row_wise_adagrad": (lambda: fv1.RowWiseAdagradOptimizer(0.3), "RowWiseAdagrad",
                         ["accumulator"], [], "RowWiseAdagrad"),
    "partial_row_wise_adam": (lambda: fv1.PartialRowWiseAdamOptimizer(0.05),
                              "PartialRowWiseAdam", ["m", "v"],
                              ["beta1_power", "beta2_power"], "PartialRowWiseAdam"),
    # compact slots (bfloat16 beside float32 variables; ref variables: the ops' S attr)
    "lazy_adam_bf16": (lambda: fv1.LazyAdamOptimizer(0.05, slot_dtype="bfloat16",
                                                     stochastic_rounding=True),
                       "Adam", ["m", "v"], ["beta1_power", "beta2_power"], "LazyAdam"),
    "adagrad_bf16": (lambda: fv1.AdagradOptimizer(0.3, slot_dtype="bfloat16"), "Adagrad",
                     ["accumulator"], [], "Adagrad"),
}


def _data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, ROWS - 2, size=(32,)).astype(np.int64)  # rows 6, 7 never used
    x = rng.normal(size=(32, FEATURES)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3 * (ids % 3)).astype(np.float32)
    return ids, x, y


def _loss_np(w, emb):
    ids, x, y = _data()
    pred = x @ w[:, 0] + emb[ids].sum(axis=1)
    return float(np.mean((pred - y) ** 2))


def _input_fn():
    ids, x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices(({"ids": ids, "x": x}, y))
    return ds.repeat().batch(32)


_OP_TYPES = set()


def _model_fn(features, labels, mode, params):
    use_resource = params["use_resource"]
    w = tf.compat.v1.get_variable("w", [FEATURES, 1], initializer=tf.compat.v1.zeros_initializer(),
                                  use_resource=use_resource)
    emb = tf.compat.v1.get_variable("emb", [ROWS, DIM],
                                    initializer=tf.compat.v1.zeros_initializer(),
                                    use_resource=use_resource)
    pred = tf.squeeze(tf.matmul(features["x"], w), 1) + tf.reduce_sum(
        tf.gather(emb, features["ids"]), 1)
    loss = tf.reduce_mean(tf.square(pred - labels))
    opt = OPTIMIZERS[params["rule"]][0]()
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    # (Estimator deep-copies params: collect the graph's op types in a module global)
    _OP_TYPES.update(op.type for op in tf.compat.v1.get_default_graph().get_operations())
    return tf.compat.v1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _estimator(model_dir, rule, use_resource):
    est = tf.compat.v1.estimator
    config = est.RunConfig(model_dir=str(model_dir), save_summary_steps=None,
                           save_checkpoints_steps=1000,  # i.e. at the end of train()
                           log_step_count_steps=1000)
    return est.Estimator(_model_fn, config=config,
                         params={"rule": rule, "use_resource": use_resource})


@pytest.mark.parametrize("rule,use_resource", [("lazy_adam", True), ("adamax", True),
                                               ("adagrad", True), ("lazy_adam", False),
                                               ("row_wise_adagrad", True),
                                               ("partial_row_wise_adam", True),
                                               ("partial_row_wise_adam", False),
                                               ("lazy_adam_bf16", True),
                                               ("adagrad_bf16", False)])
def test_estimator_trains_and_resumes(tmp_path, rule, use_resource):
    _, name, slots, powers, op_suffix = OPTIMIZERS[rule]
    _OP_TYPES.clear()
    est = _estimator(tmp_path, rule, use_resource)
    est.train(_input_fn, steps=15)
    op_types = set(_OP_TYPES)
    kind = "Resource" if use_resource else ""
    # w: dense gradient (resource variables: the step's dense updates in one group op)
    dense = "ResourceGroupApply" if use_resource else "Apply"
    assert "FusedOpt>%s%s" % (dense, op_suffix) in op_types
    assert "FusedOpt>%sSparseApply%s" % (kind, op_suffix) in op_types  # emb: IndexedSlices
    assert not {"Unique", "UnsortedSegmentSum"} & op_types  # no Python-level dedup

    names = set(est.get_variable_names())
    suffix = {"m": "", "v": "_1", "accumulator": ""}
    for var in ("w", "emb"):
        for s in slots:
            assert "%s/%s%s" % (var, name, suffix[s]) in names
            if rule.endswith("_bf16"):  # in the checkpoint as 16-bit values
                value = est.get_variable_value("%s/%s%s" % (var, name, suffix[s]))
                assert str(value.dtype) == "bfloat16", (var, s, value.dtype)
    for p in powers:
        assert p in names
    per_row = {"row_wise_adagrad": "accumulator", "partial_row_wise_adam": "v"}.get(rule)
    if per_row:  # one value per row of the table, in the checkpoint too
        assert est.get_variable_value("emb/%s%s" % (name, suffix[per_row])).shape == (ROWS,)
    assert est.get_variable_value("global_step") == 15

    loss0 = _loss_np(np.zeros([FEATURES, 1]), np.zeros([ROWS, DIM]))
    loss15 = _loss_np(est.get_variable_value("w"), est.get_variable_value("emb"))
    assert loss15 < 0.8 * loss0, (loss0, loss15)
    emb15 = est.get_variable_value("emb")
    np.testing.assert_array_equal(emb15[6:], 0.0)  # untouched rows stay (lazy)

    # A fresh Estimator on the same model_dir resumes: global step, slots, powers continue.
    adagrad = rule.startswith("adagrad")
    acc15 = est.get_variable_value("w/Adagrad").astype(np.float32) if adagrad else None
    est2 = _estimator(tmp_path, rule, use_resource)
    est2.train(_input_fn, steps=10)
    assert est2.get_variable_value("global_step") == 25
    loss25 = _loss_np(est2.get_variable_value("w"), est2.get_variable_value("emb"))
    assert loss25 < loss15, (loss15, loss25)
    for p, beta in zip(powers, (0.9, 0.999)):
        np.testing.assert_allclose(est2.get_variable_value(p), beta ** 26, rtol=1e-5)
    if adagrad:
        acc = est2.get_variable_value("w/Adagrad").astype(np.float32)
        # 25 squared gradients accumulated on top of the initial 0.1, not restarted
        assert np.all(acc > 0.1)
        if rule.endswith("_bf16"):  # increments below half a bfloat16 step round away
            assert np.all(acc >= acc15) and np.any(acc > acc15)
        else:
            assert np.all(acc > acc15)
