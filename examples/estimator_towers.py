"""An Estimator `model_fn` over two CPU towers with `TowerOptimizer` and `replicate_model_fn`.

`fusedopt.estimator.replicate_model_fn` calls the `model_fn` once per device ("tower"), each
on a slice of the batch; the variables are shared, and `TowerOptimizer` sums the towers'
gradients and applies them once per step with the optimizer it wraps, here
`fusedopt.compat.v1.AdagradOptimizer`. The model: a bag of ids per example, an embedding
table, a linear output; trained, then evaluated on the whole batch.

    python examples/estimator_towers.py                           # 1M-row table
    python examples/estimator_towers.py --rows 10000 --steps 20   # a quick look

Needs TensorFlow 2.15 with tensorflow-estimator (the last TensorFlow with tf.estimator),
and fusedopt. On a machine with GPUs, pass devices=["/gpu:0", "/gpu:1"] instead.
"""
import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusedopt.compat.v1 as fv1  # noqa: E402
from fusedopt import estimator as fe  # noqa: E402

TOWERS = ["/cpu:0", "/cpu:1"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="embedding table rows")
    p.add_argument("--dim", type=int, default=16, help="embedding width")
    p.add_argument("--bag", type=int, default=4, help="ids per example")
    p.add_argument("--batch", type=int, default=4096, help="examples per step (both towers)")
    p.add_argument("--steps", type=int, default=100, help="training steps")
    return p.parse_args(argv)


def model_fn(features, labels, mode, params):
    table = tf.compat.v1.get_variable(
        "table", [params["rows"], params["dim"]],
        initializer=tf.compat.v1.random_normal_initializer(0, 0.01))
    out = tf.compat.v1.get_variable("out", [params["dim"], 1])
    bag = tf.reduce_mean(tf.nn.embedding_lookup(table, features["ids"]), axis=1)
    prediction = tf.matmul(bag, out)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return fe.EstimatorSpec(mode, predictions={"score": prediction})
    loss = tf.compat.v1.losses.mean_squared_error(labels, prediction)
    if mode == tf.estimator.ModeKeys.EVAL:
        return fe.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "mae": tf.compat.v1.metrics.mean_absolute_error(labels, prediction)})
    optimizer = fe.TowerOptimizer(fv1.AdagradOptimizer(0.5))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return fe.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn(rows, bag, batch, seed):
    rng = np.random.default_rng(seed)
    ids = ((rng.zipf(1.3, size=(batch * 8, bag)) - 1) % rows).astype(np.int64)
    target = np.random.default_rng(7).normal(size=rows).astype(np.float32)
    labels = target[ids].mean(axis=1, keepdims=True)
    return lambda: tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).batch(
        batch, drop_remainder=True).repeat()  # both towers get batch / 2


def main(argv=None):
    args = parse_args(argv)
    if not hasattr(tf, "estimator") or not hasattr(tf.estimator, "Estimator"):
        sys.exit(f"This example needs tf.estimator: TensorFlow 2.15 with tensorflow-estimator "
                 f"(this is TensorFlow {tf.__version__}).")
    session = tf.compat.v1.ConfigProto(device_count={"CPU": len(TOWERS)})
    params = {"rows": args.rows, "dim": args.dim}
    with tempfile.TemporaryDirectory() as model_dir:
        estimator = tf.compat.v1.estimator.Estimator(
            fe.replicate_model_fn(model_fn, devices=TOWERS), model_dir=model_dir, params=params,
            config=tf.estimator.RunConfig(session_config=session, log_step_count_steps=None))
        data = input_fn(args.rows, args.bag, args.batch, seed=1)
        print(f"Training a {args.rows:,} x {args.dim} table on batches of {args.batch:,} "
              f"examples split over {len(TOWERS)} towers ({', '.join(TOWERS)}) with "
              f"TowerOptimizer(fusedopt.compat.v1.AdagradOptimizer) (TensorFlow {tf.__version__}).")
        for _ in range(2):
            estimator.train(data, steps=max(args.steps // 2, 1))
            metrics = estimator.evaluate(data, steps=4)
            print(f"  after {metrics['global_step']} steps: loss {metrics['loss']:.5f}, "
                  f"mean absolute error {metrics['mae']:.4f} (4 batches, both towers)")


if __name__ == "__main__":
    main()
