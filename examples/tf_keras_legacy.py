"""Keras 2 (tf_keras) training with `fusedopt.keras.legacy.LazyAdam`, saved and loaded.

For code on Keras 2's `OptimizerV2`: tf_keras on TensorFlow 2.16 and later (this script sets
`TF_USE_LEGACY_KERAS=1` before importing TensorFlow where tf_keras is installed), or
`tf.keras` on TensorFlow 2.15. A
model with a bag-of-ids embedding (each example a few ids of a Zipf-distributed feature) is
trained with `model.fit`, saved to an .h5 file, loaded as a new model, and trained on: the
optimizer's class, step count and state carry over.

    python examples/tf_keras_legacy.py                              # 500K-row table
    python examples/tf_keras_legacy.py --rows 10000 --steps 20      # a quick look

Needs tf_keras (`pip install tf-keras` of your TensorFlow's minor) on TensorFlow 2.16 or
later, and fusedopt.
"""
import argparse
import importlib.util
import os
import sys
import tempfile
import warnings

if importlib.util.find_spec("tf_keras") is not None:  # TensorFlow 2.16 and later
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras (Keras 2) from here on
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from fusedopt.keras import legacy  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=500_000, help="embedding table rows")
    p.add_argument("--dim", type=int, default=16, help="embedding width")
    p.add_argument("--bag", type=int, default=8, help="ids per example")
    p.add_argument("--batch", type=int, default=2048, help="examples per step")
    p.add_argument("--steps", type=int, default=200, help="training steps before saving")
    return p.parse_args(argv)


def bags_of_ids(rows, bag, n, seed):
    """n examples of `bag` Zipf ids each; the target is a hidden score per id, summed."""
    rng = np.random.default_rng(seed)
    ids = ((rng.zipf(1.3, size=(n, bag)) - 1) % rows).astype(np.int32)
    score = np.random.default_rng(99).normal(size=rows).astype(np.float32)
    return ids, score[ids].sum(axis=1, keepdims=True)


def keras_version():
    try:
        import tf_keras  # TensorFlow 2.16 and later
        return tf_keras.__version__
    except ImportError:  # TensorFlow 2.15: tf.keras is Keras 2.15
        import keras
        return keras.__version__


def main(argv=None):
    args = parse_args(argv)
    keras = tf.keras
    if not hasattr(keras.optimizers, "legacy"):
        sys.exit("This example needs Keras 2: install tf_keras for your TensorFlow "
                 "(pip install tf-keras), or use TensorFlow 2.15.")
    tf.random.set_seed(0)
    model = keras.Sequential([
        keras.Input((args.bag,), dtype="int32"),
        keras.layers.Embedding(args.rows, args.dim),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=legacy.LazyAdam(learning_rate=0.01), loss="mse")
    x, y = bags_of_ids(args.rows, args.bag, args.batch * args.steps, seed=1)
    history = model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False)
    print(f"Trained {args.steps} steps of {args.batch:,} examples on a {args.rows:,} x {args.dim} "
          f"table with fusedopt.keras.legacy.LazyAdam (TensorFlow {tf.__version__}, "
          f"Keras {keras_version()}): loss {history.history['loss'][0]:.4f}.")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.h5")
        with warnings.catch_warnings():  # tf_keras calls .h5 "legacy"; it keeps the state
            warnings.simplefilter("ignore", UserWarning)
            model.save(path)
        # An .h5 file names the optimizer class without its module ("LazyAdam"): say which.
        loaded = keras.models.load_model(path, custom_objects={"LazyAdam": legacy.LazyAdam})
        print(f"Saved to {os.path.basename(path)} and loaded: {type(loaded.optimizer).__module__}."
              f"{type(loaded.optimizer).__name__} at step {int(loaded.optimizer.iterations)}.")
    x2, y2 = bags_of_ids(args.rows, args.bag, args.batch * 4, seed=2)
    before = loaded.evaluate(x2, y2, batch_size=args.batch, verbose=0)
    loaded.fit(x2, y2, batch_size=args.batch, epochs=1, verbose=0, shuffle=False)
    after = loaded.evaluate(x2, y2, batch_size=args.batch, verbose=0)
    print(f"Trained on 4 more steps after loading: loss on those batches {before:.4f} -> "
          f"{after:.4f}; the optimizer is at step {int(loaded.optimizer.iterations)}.")


if __name__ == "__main__":
    main()
