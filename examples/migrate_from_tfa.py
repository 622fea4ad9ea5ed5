"""Moving a model from tensorflow-addons' `tfa.optimizers.LazyAdam` to fusedopt.

Step 1 (this process): a Keras 2 model with an embedding table is trained with
`tfa.optimizers.LazyAdam`, saved to an .h5 file (optimizer state included), then trained a
few more steps with tfa, to know where tfa would have gone. Step 2 (a fresh process, as a
migrated program runs: without tensorflow-addons imported): the file is loaded with tfa's
class name mapped to `fusedopt.keras.legacy.LazyAdam`, and trained on the same batches. The
script prints how far fusedopt's weights end up from tfa's.

    python examples/migrate_from_tfa.py                           # 100K-row table
    python examples/migrate_from_tfa.py --rows 1000 --steps 10    # a quick look

Needs TensorFlow 2.15 with tensorflow-addons 0.23 (its last release) for step 1, and
fusedopt. (On Keras 3, `fusedopt.keras.migrate` moves such an .h5 file's optimizer state:
docs/MIGRATING.md.)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

HYPER = dict(learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000, help="embedding table rows")
    p.add_argument("--dim", type=int, default=16, help="embedding width")
    p.add_argument("--batch", type=int, default=1024, help="examples per step")
    p.add_argument("--steps", type=int, default=50, help="steps with tfa before saving")
    p.add_argument("--more", type=int, default=10, help="steps after loading")
    p.add_argument("--continue-from", help=argparse.SUPPRESS)  # step 2: the saved directory
    return p.parse_args(argv)


def batches(args, seed, steps):
    rng = np.random.default_rng(seed)
    ids = ((rng.zipf(1.3, size=(steps * args.batch, 3)) - 1) % args.rows).astype(np.int32)
    clicks = (rng.random((steps * args.batch, 1)) < 0.3).astype(np.float32)
    return ids, clicks


def train(model, x, y, batch):
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)


def with_tfa(args, directory):
    """Step 1: train with tfa, save, train on; returns the path of the saved model."""
    import tensorflow as tf
    with warnings.catch_warnings():  # tfa says it is winding down
        warnings.simplefilter("ignore")
        import tensorflow_addons as tfa

    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([
        tf.keras.Input((3,), dtype="int32"),
        tf.keras.layers.Embedding(args.rows, args.dim),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(optimizer=tfa.optimizers.LazyAdam(**HYPER), loss="binary_crossentropy")
    train(model, *batches(args, 1, args.steps), args.batch)
    path = os.path.join(directory, "model.h5")
    model.save(path)
    train(model, *batches(args, 2, args.more), args.batch)
    np.savez(os.path.join(directory, "tfa_weights.npz"), *model.get_weights())
    print(f"Step 1, tensorflow-addons {tfa.__version__} on TensorFlow {tf.__version__}: trained "
          f"{args.steps} steps with tfa.optimizers.LazyAdam on a {args.rows:,} x {args.dim} table, "
          f"saved model.h5, trained {args.more} more steps.")
    return path


def with_fusedopt(args, directory):
    """Step 2, in a process that never imported tfa: load the file as fusedopt's, train on."""
    import tensorflow as tf

    from fusedopt.keras import legacy

    model = tf.keras.models.load_model(os.path.join(directory, "model.h5"),
                                       custom_objects={"Addons>LazyAdam": legacy.LazyAdam})
    step = int(model.optimizer.iterations.numpy())
    train(model, *batches(args, 2, args.more), args.batch)
    with np.load(os.path.join(directory, "tfa_weights.npz")) as f:
        tfa_weights = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), tfa_weights))
    cls = type(model.optimizer)
    print(json.dumps({"class": cls.__module__ + "." + cls.__name__,
                      "step": step, "gap": gap}))


def main(argv=None):
    args = parse_args(argv)
    if args.continue_from:
        return with_fusedopt(args, args.continue_from)
    with tempfile.TemporaryDirectory() as directory:
        try:
            with_tfa(args, directory)
        except ImportError as e:
            sys.exit(f"Step 1 needs tensorflow-addons (TensorFlow 2.15 with tensorflow-addons "
                     f"0.23): {e}")
        child = subprocess.run(
            [sys.executable, __file__, "--continue-from", directory, "--rows", str(args.rows),
             "--dim", str(args.dim), "--batch", str(args.batch), "--more", str(args.more)],
            capture_output=True, text=True)
        if child.returncode != 0:
            sys.exit("Step 2 failed:\n" + child.stderr[-3000:])
    result = json.loads(child.stdout.strip().splitlines()[-1])
    print(f"Step 2, a new process without tfa: loaded model.h5 with its optimizer as "
          f"{result['class']} at step {result['step']}, trained the same {args.more} steps.")
    print(f"fusedopt's weights differ from tfa's by at most {result['gap']:.1e} "
          "(float32 rounding: the same LazyAdam update).")


if __name__ == "__main__":
    main()
