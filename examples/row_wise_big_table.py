"""A 10M-row embedding table trained with row-wise Adagrad and bfloat16 optimizer state.

`fusedopt.keras.RowWiseAdagrad` keeps one accumulator per row of the table (FBGEMM's
`EXACT_ROWWISE_ADAGRAD`), not one per element as Adagrad does: for rows of 64 values, 1/64
of Adagrad's state. `slot_dtype="bfloat16"` halves it again. This script builds a 10M x 64
table, trains it with Keras 3 `model.fit` on Zipf-distributed ids, and prints the table's
size, the optimizer state's, and the process's peak memory, beside what Adam's and Adagrad's
state would take.

    python examples/row_wise_big_table.py                          # 10M x 64: about 4 GB of memory
    python examples/row_wise_big_table.py --rows 100000 --steps 20 # a quick look

Needs TensorFlow 2.16 or later (Keras 3) and fusedopt.
"""
import argparse
import os
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusedopt.keras  # noqa: E402

GB = 1e9


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000, help="embedding table rows")
    p.add_argument("--dim", type=int, default=64, help="embedding width")
    p.add_argument("--batch", type=int, default=16384, help="ids per step")
    p.add_argument("--steps", type=int, default=100, help="training steps")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not keras.__version__.startswith("3."):
        sys.exit("This example needs Keras 3 (TensorFlow 2.16 or later); Keras 2 has the same "
                 "class in fusedopt.keras.legacy.")
    ids = keras.Input((), dtype="int32")
    # Keras's Embedding, looking rows up without copying the table every step (Keras 3's
    # own layer reads it whole, and TF copies it for that once sparse updates write it).
    table = fusedopt.keras.Embedding(args.rows, args.dim, embeddings_initializer="zeros",
                                     name="table")
    score = keras.layers.Dense(1, activation="sigmoid")(table(ids))
    model = keras.Model(ids, score)
    optimizer = fusedopt.keras.RowWiseAdagrad(args.lr, slot_dtype="bfloat16")
    model.compile(optimizer=optimizer, loss="binary_crossentropy")

    rng = np.random.default_rng(0)
    popular = rng.random(args.rows) < 0.2  # the hidden label of each id
    x = ((rng.zipf(1.1, args.batch * (args.steps + 1)) - 1) % args.rows).astype(np.int32)
    y = popular[x].astype(np.float32)
    first = slice(0, args.batch)  # one step first: builds the optimizer, compiles the step
    model.fit(x[first], y[first], batch_size=args.batch, verbose=0)
    start = time.perf_counter()
    history = model.fit(x[args.batch:], y[args.batch:], batch_size=args.batch, epochs=1,
                        shuffle=False, verbose=0)
    seconds = time.perf_counter() - start

    table_bytes = args.rows * args.dim * 4
    state = [v for v in optimizer.variables if len(v.shape) > 0]  # not the step counter
    state_bytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in state)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"Trained a {args.rows:,} x {args.dim} float32 table ({table_bytes / GB:.2f} GB) for "
          f"{args.steps} steps of {args.batch:,} ids with fusedopt.keras.RowWiseAdagrad("
          f"slot_dtype='bfloat16'): loss {history.history['loss'][0]:.4f}, "
          f"{seconds * 1000 / args.steps:.1f} ms per step (TensorFlow {tf.__version__}).")
    slots = ", ".join(f"{v.path} {list(v.shape)} {tf.as_dtype(v.dtype).name}" for v in state)
    print(f"Optimizer state: {slots}: {state_bytes / 1e6:.2f} MB in all. For the table, "
          f"Adam would keep {2 * table_bytes / 1e6:,.0f} MB, Adagrad {table_bytes / 1e6:,.0f} MB.")
    print(f"Peak memory of this process: {peak / GB:.2f} GB (TensorFlow and the table included).")


if __name__ == "__main__":
    main()
