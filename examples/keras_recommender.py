"""A recommender trained with Keras 3 `model.fit` and `fusedopt.keras.LazyAdam`.

Each example is a (user, item) pair and whether the user clicked. User and item ids are
drawn from Zipf distributions, as in real logs: a few are very frequent, most are rare.
The model is two embedding tables (`fusedopt.keras.Embedding`: Keras's layer, looking rows
up without copying the table), their dot product and a logistic output. It is trained
twice from the same weights on the same batches: once with `fusedopt.keras.LazyAdam`, once
with `keras.optimizers.Adam`, the class it replaces. The script prints each run's loss,
time per step, and how many rows of the user table one more step changed: LazyAdam moves
only the rows the batch names, Keras's Adam every row it has ever seen (their moments
keep moving them).

    python examples/keras_recommender.py                          # 1M users, 100K items
    python examples/keras_recommender.py --rows 10000 --steps 20  # a quick look

Needs TensorFlow 2.16 or later (Keras 3) and fusedopt.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusedopt.keras  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="users (items: a tenth)")
    p.add_argument("--dim", type=int, default=32, help="embedding width")
    p.add_argument("--batch", type=int, default=4096, help="examples per step")
    p.add_argument("--steps", type=int, default=100, help="training steps per optimizer")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate")
    p.add_argument("--no-baseline", action="store_true", help="skip keras.optimizers.Adam")
    return p.parse_args(argv)


def click_log(users, items, n, seed=0):
    """n synthetic (user, item, clicked) examples; clicks follow hidden user and item tastes."""
    rng = np.random.default_rng(seed)
    user = (rng.zipf(1.2, n) - 1) % users
    item = (rng.zipf(1.2, n) - 1) % items
    taste_u = rng.normal(size=users).astype(np.float32)
    taste_i = rng.normal(size=items).astype(np.float32)
    clicked = (rng.random(n) < 1 / (1 + np.exp(-taste_u[user] * taste_i[item]))).astype(np.float32)
    return {"user": user.astype(np.int32), "item": item.astype(np.int32)}, clicked


def build_model(users, items, dim):
    keras.utils.set_random_seed(1)  # the same initial weights for every optimizer
    user = keras.Input((), dtype="int32", name="user")
    item = keras.Input((), dtype="int32", name="item")
    # fusedopt's Embedding: Keras's layer, looking rows up without copying the whole table
    # each step (Keras 3's own layer does, once sparse updates write the table), for both.
    u = fusedopt.keras.Embedding(users, dim, name="user_table")(user)
    i = fusedopt.keras.Embedding(items, dim, name="item_table")(item)
    score = keras.layers.Dot(axes=1)([u, i])
    clicked = keras.layers.Dense(1, activation="sigmoid")(score)
    return keras.Model({"user": user, "item": item}, clicked)


def train(name, optimizer, args, dataset):
    model = build_model(args.rows, max(args.rows // 10, 1), args.dim)
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    model.fit(dataset.take(2), verbose=0, shuffle=False)  # compile the step before timing
    start = time.perf_counter()
    history = model.fit(dataset.skip(2).take(args.steps), verbose=0, shuffle=False)
    ms = (time.perf_counter() - start) * 1000 / args.steps
    # One more step: which rows of the user table does it move?
    table = model.get_layer("user_table").embeddings
    before = table.numpy()
    last = dataset.skip(2 + args.steps).take(1)
    model.fit(last, verbose=0, shuffle=False)
    moved = np.any(table.numpy() != before, axis=1).sum()
    named = len(np.unique(next(iter(last))[0]["user"].numpy()))
    print(f"{name:24s} loss {history.history['loss'][-1]:.4f}, {ms:7.1f} ms per step; "
          f"one more step moved {moved:,} user rows (the batch named {named:,})")
    return ms


def main(argv=None):
    args = parse_args(argv)
    if not keras.__version__.startswith("3."):
        sys.exit("This example needs Keras 3 (TensorFlow 2.16 or later); for Keras 2 see "
                 "examples/tf_keras_legacy.py.")
    features, labels = click_log(args.rows, max(args.rows // 10, 1), args.batch * (args.steps + 3))
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(args.batch)
    print(f"Training on {args.steps} batches of {args.batch:,} clicks: "
          f"a {args.rows:,} x {args.dim} "
          f"user table and a {max(args.rows // 10, 1):,} x {args.dim} item table "
          f"(TensorFlow {tf.__version__}, Keras {keras.__version__}).")
    fused = train("fusedopt.keras.LazyAdam", fusedopt.keras.LazyAdam(args.lr), args, dataset)
    if not args.no_baseline:
        plain = train("keras.optimizers.Adam", keras.optimizers.Adam(args.lr), args, dataset)
        print(f"fusedopt.keras.LazyAdam's step took {fused / plain:.2f} of Keras Adam's time "
              f"({plain / fused:.1f}x as fast).")


if __name__ == "__main__":
    main()
