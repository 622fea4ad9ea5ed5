"""TF1-style training: a graph, a `Session` and `fusedopt.compat.v1.LazyAdamOptimizer`.

A linear click model over an embedding table, written as TF1 code (placeholders,
`tf.compat.v1.get_variable`, `opt.minimize`, `Session.run`), trained with fusedopt's
LazyAdam in place of `tf.compat.v1.train.AdamOptimizer`. The checkpoint it writes with
`Saver` is then restored into a graph that uses TensorFlow's own `AdamOptimizer`: the slot
and non-slot variables have TensorFlow's names, so checkpoints move both ways.

    python examples/compat_v1_session.py                          # 1M-row table
    python examples/compat_v1_session.py --rows 10000 --steps 20  # a quick look

Needs fusedopt, on any TensorFlow it supports (2.15 to 2.21).
"""
import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusedopt.compat.v1 as fv1  # noqa: E402

v1 = tf.compat.v1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="embedding table rows")
    p.add_argument("--dim", type=int, default=16, help="embedding width")
    p.add_argument("--batch", type=int, default=8192, help="ids per step")
    p.add_argument("--steps", type=int, default=200, help="training steps")
    return p.parse_args(argv)


def graph(rows, dim, optimizer):
    """The model's graph: returns (ids, labels, loss, train_op, saver)."""
    ids = v1.placeholder(tf.int64, [None], name="ids")
    labels = v1.placeholder(tf.float32, [None], name="labels")
    table = v1.get_variable("table", [rows, dim], initializer=v1.random_normal_initializer(0, 0.01))
    weights = v1.get_variable("weights", [dim], initializer=v1.zeros_initializer())
    logits = tf.linalg.matvec(tf.nn.embedding_lookup(table, ids), weights) + 0.1 * tf.reduce_sum(
        tf.nn.embedding_lookup(table, ids), axis=1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = optimizer.minimize(loss, global_step=v1.train.get_or_create_global_step())
    return ids, labels, loss, train_op, v1.train.Saver()


def main(argv=None):
    args = parse_args(argv)
    rng = np.random.default_rng(0)
    liked = rng.random(args.rows) < 0.3  # a hidden label per id

    def batch():
        ids = (rng.zipf(1.2, args.batch) - 1) % args.rows
        return ids, liked[ids].astype(np.float32)

    with tempfile.TemporaryDirectory() as tmp:
        train_and_restore(args, batch, os.path.join(tmp, "model.ckpt"))


def train_and_restore(args, batch, checkpoint):
    with tf.Graph().as_default():
        ids, labels, loss, train_op, saver = graph(args.rows, args.dim, fv1.LazyAdamOptimizer(0.05))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            x, y = batch()
            first = sess.run(loss, {ids: x, labels: y})
            start = time.perf_counter()
            for _ in range(args.steps):
                x, y = batch()
                last, _ = sess.run([loss, train_op], {ids: x, labels: y})
            ms = (time.perf_counter() - start) * 1000 / args.steps
            saver.save(sess, checkpoint)
            names = sorted(name for name, _ in tf.train.list_variables(checkpoint))
    print(f"Trained a {args.rows:,} x {args.dim} table for {args.steps} steps of "
          f"{args.batch:,} ids "
          f"with fusedopt.compat.v1.LazyAdamOptimizer in a Session (TensorFlow {tf.__version__}): "
          f"loss {first:.4f} -> {last:.4f}, {ms:.2f} ms per step.")
    print(f"Saver wrote {', '.join(names)}.")

    with tf.Graph().as_default():
        tf_adam = v1.train.AdamOptimizer(0.05)
        ids, labels, loss, train_op, saver = graph(args.rows, args.dim, tf_adam)
        with v1.Session() as sess:
            saver.restore(sess, checkpoint)
            step = sess.run(v1.train.get_global_step())
            x, y = batch()
            sess.run(train_op, {ids: x, labels: y})
    print(f"Restored that checkpoint into tf.compat.v1.train.AdamOptimizer at step {step} "
          "and trained one more step: the variables' names are TensorFlow's.")


if __name__ == "__main__":
    main()
