"""``python -m fusedopt.demo``: a small end-to-end training run on synthetic data.

``DESCRIPTION`` (``--help``) says what it does, for users; ``main`` runs it. The same model
is trained twice from the same initial values on the same batches, with fusedopt's
LazyAdam and with TensorFlow's Adam. Variants: Keras ``model.fit`` (default), ``--api ops``
(a custom loop on fusedopt's raw ops), ``--tf1 resource|ref`` (a ``tf.compat.v1`` graph and
Session), ``--estimator N`` (``fusedopt.estimator.replicate_model_fn`` over N CPU towers,
TF 2.15). Sizes: ``SIZES`` (``--quick`` picks the quick column; flags the user gives win).
"""
import argparse
import math
import sys
import time

import numpy as np

from fusedopt._console import (ArgumentParser, HelpFormatter, Progress, Stages, import_tensorflow,
                               whole_number)

PROG = "python -m fusedopt.demo"

DESCRIPTION = """Trains a small click-through model twice on the same synthetic data, first with fusedopt's
LazyAdam, then with Keras's Adam, and prints each run's loss and time per training step.

The model looks up a bag of ids per example in a large embedding table, averages the rows
and scores them with one linear layer. The ids follow a Zipf law (a few ids are very
common, most are rare), so each step touches only a small part of the table. fusedopt's
LazyAdam updates just those rows; Keras's Adam updates every row of the table at every
step, so its step time grows with the table.

At the default sizes the run takes about 3 minutes on 2 cores, most of it Keras's Adam;
with --quick, under a minute.

Other ways to run the same comparison: --api ops (a custom training loop on fusedopt's
raw ops), --tf1 resource|ref (TensorFlow 1-style graph and Session), --estimator N
(an Estimator over N CPU devices; needs TensorFlow 2.15).
"""

# Sizes the user did not give: (the default, --quick's). --quick: under a minute in all on
# a 2-core machine (25 s on a loaded 2-vCPU VM, Keras 3: 5 ms a step against 194 ms), the
# table large enough that Keras's Adam (every row, every step) is clearly slower than
# fusedopt's LazyAdam (only the looked-up rows). The default: 2.5 minutes there (5.5 ms
# against 500 ms). EXPECTED: what the run's first lines say at either.
SIZES = {"rows": (1_000_000, 300_000), "batch": (2048, 1024), "steps": (200, 60)}
EXPECTED = ("about 3 minutes on 2 cores, most of it Keras's Adam", "under a minute on 2 cores")


def _size_help(text, name):
    full, quick = SIZES[name]
    return f"{text} (default: {full:,}; with --quick: {quick:,})"


def _positive_float(text):
    """argparse type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {text}")
    return value


def parser():
    p = ArgumentParser(prog=PROG, description=DESCRIPTION, formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smaller sizes that still show the difference (under a minute in all "
                        "on 2 cores); sizes you give yourself are kept")
    p.add_argument("--rows", type=whole_number, help=_size_help("rows of the embedding table", "rows"))
    p.add_argument("--dim", type=whole_number, default=32, help="width of each embedding row")
    p.add_argument("--batch", type=whole_number, help=_size_help("examples per training step", "batch"))
    p.add_argument("--bag", type=whole_number, default=8, help="ids per example")
    p.add_argument("--steps", type=whole_number,
                   help=_size_help("training steps per optimizer", "steps"))
    p.add_argument("--lr", type=_positive_float, default=0.01, help="learning rate")
    p.add_argument("--zipf", type=float, default=1.15,
                   help="Zipf exponent of the ids, above 1: the larger, the fewer distinct ids")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and initial values")
    p.add_argument("--no-baseline", action="store_true",
                   help="train with fusedopt's LazyAdam only (skip Keras's Adam)")
    p.add_argument("--api", choices=["keras", "ops"], default="keras",
                   help="keras: model.fit with fusedopt.keras.LazyAdam against "
                        "keras.optimizers.Adam; ops: a custom training loop on fusedopt's raw "
                        "ops against tf.keras.optimizers.Adam")
    p.add_argument("--keras-embedding", action="store_true",
                   help="with --api keras: use keras.layers.Embedding as it is. By default the "
                        "model looks rows up with tf.gather on the table variable, because "
                        "Keras 3's Embedding layer reads the whole table at every step, and "
                        "once the table has had a sparse update TensorFlow copies it whole on "
                        "each such read: with this flag you see that cost")
    p.add_argument("--tf1", choices=["resource", "ref"],
                   help="TensorFlow 1-style graph mode (tf.compat.v1 Session) with resource or "
                        "ref variables: fusedopt.compat.v1.LazyAdamOptimizer against "
                        "tf.compat.v1.train.AdamOptimizer")
    p.add_argument("--estimator", type=whole_number, metavar="DEVICES",
                   help="Estimator variant (TensorFlow 2.15 only): the model replicated over "
                        "DEVICES CPU devices with fusedopt.estimator.replicate_model_fn")
    return p


def resolve_sizes(args):
    """Fills in the sizes the user did not give: the default, or --quick's. A size given on
    the command line is never changed."""
    column = 1 if args.quick else 0
    for name, values in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, values[column])
    return args


def parse_args(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.tf1 and args.estimator:
        p.error("--tf1 and --estimator are different variants: pick one")
    if args.zipf <= 1:
        p.error(f"argument --zipf: must be above 1, not {args.zipf}")
    if args.keras_embedding and (args.api != "keras" or args.tf1 or args.estimator):
        p.error("--keras-embedding goes with the Keras variant (--api keras, the default)")
    return resolve_sizes(args)


class SyntheticClicks:
    """Batches of (ids [batch, bag], labels [batch]) with a learnable hidden signal."""

    def __init__(self, rows, batch, bag, zipf, seed):
        self.rng = np.random.default_rng(seed)
        self.rows, self.batch, self.bag, self.zipf = rows, batch, bag, zipf
        self.hidden_score = self.rng.normal(0.0, 1.0, rows).astype(np.float32)
        # A random permutation so that popular ids are spread over the table.
        self.permutation = self.rng.permutation(rows)

    def next(self):
        ranks = (self.rng.zipf(self.zipf, (self.batch, self.bag)) - 1) % self.rows
        ids = self.permutation[ranks].astype(np.int64)
        logits = 3.0 * self.hidden_score[ids].mean(axis=1)
        labels = (self.rng.random(self.batch) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        return ids, labels


def clicks(args):
    """A fresh data stream: every optimizer trains on the same batches."""
    return SyntheticClicks(args.rows, args.batch, args.bag, args.zipf, args.seed)


class TrainingLog:
    """One optimizer's training run: the loss and time of every step, shown as they come
    (a progress line on stderr)."""

    def __init__(self, name, steps):
        self.name, self.steps = name, steps
        self.window = max(1, steps // 10)
        self.losses, self.seconds = [], []
        self.progress = Progress(steps, "steps")
        self.progress.update(0, "building the training step")

    def step_done(self, loss, seconds):
        """Records one step: its loss and how long it took."""
        if self.losses:  # the first step traces the function (or warms up the graph)
            self.seconds.append(seconds)
        self.losses.append(loss)
        recent = self.seconds[-self.window:]
        self.progress.update(len(self.losses), f"loss {loss:.4f}" + (
            f", {1e3 * np.median(recent):.1f} ms/step" if recent else ""))
        if len(self.losses) == self.steps:
            self.progress.close()

    def final_loss(self):
        """The mean loss of the last tenth of the steps."""
        return float(np.mean(self.losses[-self.window:]))

    def step_seconds(self):
        return float(np.median(self.seconds or [float("nan")]))


MODEL_VARIABLES = ("table", "dense", "bias")


def initial_values(rows, dim, seed):
    init = np.random.default_rng(seed + 1)
    return [init.normal(0, 0.05, (rows, dim)).astype(np.float32),
            init.normal(0, 0.05, (dim, 1)).astype(np.float32),
            np.zeros([1], np.float32)]


def build_model(tf, rows, dim, seed):
    return [tf.Variable(value, name=name)
            for value, name in zip(initial_values(rows, dim, seed), MODEL_VARIABLES)]


def loss_fn(tf, variables, ids, labels):
    table, dense, bias = variables
    pooled = tf.reduce_mean(tf.gather(table, ids), axis=1)  # sparse gradient for the table
    logits = tf.squeeze(tf.matmul(pooled, dense), 1) + bias
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def eager_step(tf, variables, apply_gradients):
    """A tf.function training step: the loss's gradients go to apply_gradients(grads)."""
    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(tf, variables, ids, labels)
        apply_gradients(tape.gradient(loss, variables))
        return loss

    return step


def fusedopt_lazy_adam_step(tf, variables, lr, beta1=0.9, beta2=0.999, epsilon=1e-7):
    """Training with fusedopt's raw ops: sparse rows for the table, dense for the rest."""
    from fusedopt import ops

    slots = [(tf.Variable(tf.zeros_like(v), trainable=False),
              tf.Variable(tf.zeros_like(v), trainable=False)) for v in variables]
    iterations = tf.Variable(0, dtype=tf.int64, trainable=False)

    def apply_gradients(grads):
        t = tf.cast(iterations.assign_add(1), tf.float32)
        hyper = dict(beta1_power=beta1 ** t, beta2_power=beta2 ** t, lr=lr, beta1=beta1,
                     beta2=beta2, epsilon=epsilon)
        for var, (m, v), grad in zip(variables, slots, grads):
            if isinstance(grad, tf.IndexedSlices):
                ops.resource_sparse_apply_lazy_adam(var, m, v, grad=grad.values,
                                                    indices=grad.indices, **hyper)
            else:
                ops.resource_apply_lazy_adam(var, m, v, grad=grad, **hyper)

    return eager_step(tf, variables, apply_gradients)


def keras_adam_step(tf, variables, lr):
    optimizer = tf.keras.optimizers.Adam(learning_rate=lr)
    return eager_step(tf, variables,
                      lambda grads: optimizer.apply_gradients(zip(grads, variables)))


class GraphModel:
    """The TF1-style variant: the model in a tf.compat.v1 graph, trained by session.run.

    `make_optimizer(lr)` returns a tf.compat.v1.train.Optimizer; `use_resource` picks
    resource or ref variables. `loss(ids, labels)` evaluates, `step(ids, labels)` trains
    one step and returns the loss before the update (as the eager steps do).
    """

    def __init__(self, tf, values, make_optimizer, lr, use_resource):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.ids = tf.compat.v1.placeholder(tf.int64, [None, None], name="ids")
            self.labels = tf.compat.v1.placeholder(tf.float32, [None], name="labels")
            # Initial values are fed, not embedded in the graph (the table can be large).
            inits = [tf.compat.v1.placeholder(tf.float32, v.shape) for v in values]
            variables = [tf.compat.v1.Variable(init, name=name, use_resource=use_resource)
                         for init, name in zip(inits, MODEL_VARIABLES)]
            self.loss_t = loss_fn(tf, variables, self.ids, self.labels)
            self.train_op = make_optimizer(lr).minimize(self.loss_t)
            self.sess = tf.compat.v1.Session(graph=self.graph)
            self.sess.run(tf.compat.v1.global_variables_initializer(), dict(zip(inits, values)))

    def loss(self, ids, labels):
        return self.sess.run(self.loss_t, {self.ids: ids, self.labels: labels})

    def step(self, ids, labels):
        return self.sess.run([self.loss_t, self.train_op],
                             {self.ids: ids, self.labels: labels})[0]


def graph_contenders(tf):
    from fusedopt.compat import v1

    return [("fusedopt v1 LazyAdam", lambda lr: v1.LazyAdamOptimizer(lr, epsilon=1e-7)),
            ("tf.compat.v1 Adam", lambda lr: tf.compat.v1.train.AdamOptimizer(lr, epsilon=1e-7))]


class EstimatorModel:
    """The Estimator variant: replicate_model_fn over `towers` CPU devices.

    `step(ids, labels)` trains one step through Estimator.train, fed by a generator; the
    loss is read by a hook, so the numbers come from the real Estimator training loop.
    """

    def __init__(self, tf, args, make_optimizer, model_dir):
        from fusedopt import estimator as fe

        self.tf, self.queue, self.args = tf, [], args
        towers = args.estimator

        def model_fn(features, labels, mode, params):
            init = tf.compat.v1.random_normal_initializer(0.0, 0.05, seed=args.seed)
            variables = [
                tf.compat.v1.get_variable("table", [args.rows, args.dim], initializer=init),
                tf.compat.v1.get_variable("dense", [args.dim, 1], initializer=init),
                tf.compat.v1.get_variable("bias", [1], initializer=tf.zeros_initializer())]
            loss = loss_fn(tf, variables, features["ids"], labels)
            tf.compat.v1.add_to_collection("demo_tower_losses", loss)
            optimizer = fe.TowerOptimizer(make_optimizer(args.lr))
            train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
            return fe.EstimatorSpec(mode, loss=loss, train_op=train_op)

        config = tf.compat.v1.estimator.RunConfig(
            model_dir=model_dir, save_checkpoints_steps=10**9, log_step_count_steps=10**9,
            session_config=tf.compat.v1.ConfigProto(device_count={"CPU": towers}))
        self.estimator = tf.compat.v1.estimator.Estimator(
            fe.replicate_model_fn(model_fn, devices=[f"/cpu:{i}" for i in range(towers)]),
            config=config)

    def _input_fn(self):
        tf, args = self.tf, self.args

        def batches():
            while self.queue:
                ids, labels = self.queue.pop(0)
                yield {"ids": ids}, labels
        return tf.data.Dataset.from_generator(
            batches, output_signature=({"ids": tf.TensorSpec([args.batch, args.bag], tf.int64)},
                                       tf.TensorSpec([args.batch], tf.float32)))

    def train_all(self, name, data, steps):
        """Runs `steps` steps in one Estimator.train call; returns (first, final, step s)."""
        tf = self.tf
        self.queue = [data.next() for _ in range(steps)]
        log = TrainingLog(name, steps)

        class Progress(tf.compat.v1.train.SessionRunHook):
            def begin(self):
                tower_losses = tf.compat.v1.get_collection("demo_tower_losses")
                self.loss = tf.add_n(tower_losses) / len(tower_losses)  # equal-size slices

            def before_run(self, run_context):
                self.start = time.perf_counter()
                return tf.compat.v1.train.SessionRunArgs(self.loss)

            def after_run(self, run_context, run_values):
                log.step_done(float(run_values.results), time.perf_counter() - self.start)

        self.estimator.train(self._input_fn, steps=steps, hooks=[Progress()])
        return log.losses[0], log.final_loss(), log.step_seconds()


def estimator_contenders(tf):
    if not hasattr(tf.compat.v1, "estimator") or not hasattr(tf.compat.v1.estimator, "Estimator"):
        raise SystemExit(f"--estimator needs tf.compat.v1.estimator (TF <= 2.15 with "
                         f"tensorflow-estimator); this is TF {tf.__version__}")
    return graph_contenders(tf)


def row_lookup_layer(keras, tf):
    """keras.layers.Embedding that reads only the rows it looks up (tf.gather on the table
    variable). Keras 3's own layer reads the whole table at every step; once a sparse update
    has written the table (fusedopt's ops, as TensorFlow's own sparse updates), TensorFlow
    copies the whole table on each such read, which costs more than the update itself."""

    class RowLookup(keras.layers.Embedding):
        def call(self, inputs):
            table = self.embeddings
            if not isinstance(table, tf.Variable):  # Keras 3: the tf.Variable inside
                table = table.value
            return tf.gather(table, tf.cast(inputs, tf.int64))

    return RowLookup


def keras_fit(tf, args, name, make_optimizer):
    """Keras variant: the model as Keras layers, trained by model.fit (one epoch of
    `args.steps` steps). Returns (first loss, mean loss of the last tenth, median step
    seconds)."""
    keras = tf.keras
    init = keras.initializers.RandomNormal(0.0, 0.05, seed=args.seed)
    ids = keras.Input((args.bag,), dtype="int64")
    embedding = keras.layers.Embedding if args.keras_embedding else row_lookup_layer(keras, tf)
    pooled = keras.layers.GlobalAveragePooling1D()(
        embedding(args.rows, args.dim, embeddings_initializer=init)(ids))
    logits = keras.layers.Dense(1, kernel_initializer=init)(pooled)
    model = keras.Model(ids, keras.layers.Reshape(())(logits))
    model.compile(optimizer=make_optimizer(args.lr),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    data = clicks(args)
    batches = [data.next() for _ in range(args.steps)]
    first_loss = float(model.evaluate(*batches[0], batch_size=args.batch, verbose=0))
    log = TrainingLog(name, args.steps)

    class Progress(keras.callbacks.Callback):
        """Each step's time and loss: Keras reports the mean loss of the epoch so far, so
        step k's own loss is k * mean_k - (k - 1) * mean_(k-1)."""
        mean = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            seconds = time.perf_counter() - self.start
            mean = float(logs["loss"])
            log.step_done((batch + 1) * mean - batch * self.mean, seconds)
            self.mean = mean

    def stream():
        for ids_batch, labels in batches:
            yield ids_batch, labels
    dataset = tf.data.Dataset.from_generator(stream, output_signature=(
        tf.TensorSpec([args.batch, args.bag], tf.int64), tf.TensorSpec([args.batch], tf.float32)))
    model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0, shuffle=False,
              callbacks=[Progress()])
    return first_loss, log.final_loss(), log.step_seconds()


def keras_contenders(tf):
    import fusedopt.keras as fk

    return [("fusedopt.keras LazyAdam", lambda lr: fk.LazyAdam(lr)),
            ("keras Adam", lambda lr: tf.keras.optimizers.Adam(lr))]


def eager_contenders(tf):
    return [("fusedopt LazyAdam", fusedopt_lazy_adam_step), ("tf.keras Adam", keras_adam_step)]


def train(name, step, data, steps):
    """Runs `steps` steps; returns (mean loss of the last 10%, median step seconds)."""
    log = TrainingLog(name, steps)
    for _ in range(steps):
        ids, labels = data.next()
        start = time.perf_counter()
        loss = float(step(ids, labels))
        log.step_done(loss, time.perf_counter() - start)
    return log.final_loss(), log.step_seconds()


def run_eager(tf, args, name, make_step):
    """The ``--api ops`` variant: a custom training loop."""
    variables = build_model(tf, args.rows, args.dim, args.seed)
    first_loss = float(loss_fn(tf, variables, *clicks(args).next()))
    step = make_step(tf, variables, args.lr)
    return (first_loss, *train(name, step, clicks(args), args.steps))


def run_graph(tf, args, name, make_optimizer):
    """The ``--tf1`` variant: session.run in a tf.compat.v1 graph."""
    model = GraphModel(tf, initial_values(args.rows, args.dim, args.seed), make_optimizer,
                       args.lr, use_resource=(args.tf1 == "resource"))
    first_loss = float(model.loss(*clicks(args).next()))
    return (first_loss, *train(name, model.step, clicks(args), args.steps))


def run_estimator(tf, args, name, make_optimizer):
    """The ``--estimator`` variant: Estimator.train of a replicated model_fn."""
    import tempfile

    with tempfile.TemporaryDirectory() as model_dir:
        model = EstimatorModel(tf, args, make_optimizer, model_dir)
        return model.train_all(name, clicks(args), args.steps)


def variant(tf, args):
    """The variant the flags pick: ([(name, make)], run(tf, args, name, make)), where run
    returns (first loss, final loss, step seconds); ours first, then the baseline."""
    if args.estimator:
        tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)  # Estimator chatter
        return estimator_contenders(tf), run_estimator
    if args.tf1:
        return graph_contenders(tf), run_graph
    if args.api == "keras":
        return keras_contenders(tf), keras_fit
    return eager_contenders(tf), run_eager


def describe(args):
    """What this run trains, in two lines."""
    variant = ("TensorFlow 1-style graph and Session, %s variables" % args.tf1 if args.tf1 else
               "an Estimator over %d CPU devices" % args.estimator if args.estimator else
               "a custom training loop on fusedopt's ops" if args.api == "ops" else
               "Keras model.fit")
    table_mb = args.rows * args.dim * 4 / 1e6
    sizes = "--quick sizes" if args.quick else "default sizes"
    trained = ("a click-through model trained with fusedopt's LazyAdam" if args.no_baseline else
               "the same click-through model trained with fusedopt's LazyAdam and with Adam")
    column = 1 if args.quick else 0
    preset = (all(getattr(args, name) == values[column] for name, values in SIZES.items())
              and (args.dim, args.bag) == (32, 8) and not args.estimator
              and not args.no_baseline)
    return (f"fusedopt demo: {trained} ({variant})\n"
            f"  embedding table {args.rows:,} x {args.dim} ("
            + (f"{table_mb:,.0f}" if table_mb >= 10 else f"{table_mb:.2g}") + " MB), "
            f"{args.batch:,} examples of {args.bag} ids per step, {args.steps:,} steps per "
            f"optimizer ({sizes} where not given; {PROG} --help lists the options)"
            + (f"\n  expected time: {EXPECTED[column]}" if preset else ""))


def main(argv=None):
    args = parse_args(argv)
    print(describe(args), flush=True)
    runs = 1 if args.no_baseline else 2
    stages = Stages(1 + runs)
    stages.begin("Starting TensorFlow")
    tf = import_tensorflow()
    contenders, run = variant(tf, args)
    stages.end(f"TensorFlow {tf.__version__}")
    results = []
    for index, (name, make) in enumerate(contenders[:runs]):
        role = "fusedopt" if index == 0 else "the baseline"
        stages.begin(f"Training with {name} ({role}): {args.steps:,} steps")
        first_loss, final_loss, step_seconds = run(tf, args, name, make)
        stages.end(f"{1e3 * step_seconds:.2f} ms per step, loss {first_loss:.4f} -> "
                   f"{final_loss:.4f}")
        results.append((name, first_loss, final_loss, step_seconds))
    return report(results, args)


def report(results, args=None):
    """Prints the side-by-side table and what it shows; `results` holds (name, first loss,
    final loss, step seconds), fusedopt's first."""
    print(f"\nResults (the same batches and initial values for both; a constant guess scores "
          f"{math.log(2):.4f}):")
    print(f"{'optimizer':24s} {'first loss':>10s} {'final loss':>10s} {'step ms':>9s}")
    for name, first_loss, final_loss, step_seconds in results:
        print(f"{name:24s} {first_loss:10.4f} {final_loss:10.4f} {1e3 * step_seconds:9.2f}")
    print("(first loss: before training; final loss: the mean over the last tenth of the steps; "
          "step ms: the median time of one training step, forward and backward included)")
    if len(results) == 2:
        (ours, *_, our_seconds), (base, *_, base_seconds) = results
        speedup = base_seconds / our_seconds
        print(f"Step time: {ours} is {speedup:.1f}x as fast as {base}.")
        if speedup < 2 and args is not None:
            print(f"  The gap is small because the table is small ({args.rows:,} rows): "
                  "updating every row costs Adam little. It grows with the table: try "
                  "--rows 1000000.")
        print(f"Loss: both fall; they differ a little because {ours} is lazy Adam: it updates "
              f"only the rows each batch looks up, while {base} also moves every other row by "
              "its momentum at every step.")
    return results


if __name__ == "__main__":
    main()
