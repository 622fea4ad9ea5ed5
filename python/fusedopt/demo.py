"""``python -m fusedopt.demo``: a small end-to-end training run on synthetic data.

A click-through-style model on a Zipf-distributed id feature: each example is a bag of
ids looked up in a large embedding table (default 1M rows), averaged, and scored by a
linear layer. Labels come from a hidden per-id score, so the loss can fall well below
ln 2. The same model is trained twice from the same initial values: with fusedopt's
fused LazyAdam (sparse update of the looked-up rows, dense update of the small layer)
and with plain TensorFlow's Adam, and the loss and the step time are printed side by side.

Variants: the default is Keras ``model.fit`` with ``fusedopt.keras.LazyAdam`` vs
``keras.optimizers.Adam``; ``--api ops`` is a custom training loop on fusedopt's raw ops
vs ``tf.keras.optimizers.Adam``; ``--estimator N`` trains an Estimator replicated over N
CPU towers (TF 2.15).

``--tf1 resource`` / ``--tf1 ref`` runs the TF1-style variant instead: the model in a
``tf.compat.v1`` graph with resource or ref variables, trained with ``session.run`` by
``fusedopt.compat.v1.LazyAdamOptimizer`` and by ``tf.compat.v1.train.AdamOptimizer``.
"""
import argparse
import math
import time

import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="embedding table rows")
    p.add_argument("--dim", type=int, default=32, help="embedding width")
    p.add_argument("--batch", type=int, default=2048, help="examples per step")
    p.add_argument("--bag", type=int, default=8, help="ids per example")
    p.add_argument("--steps", type=int, default=200, help="training steps per optimizer")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--zipf", type=float, default=1.15, help="Zipf exponent of the ids")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-baseline", action="store_true", help="skip plain TF's Adam")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("--api", choices=["keras", "ops"], default="keras",
                   help="keras (default): model.fit with fusedopt.keras.LazyAdam vs "
                        "keras.optimizers.Adam; ops: a custom loop on fusedopt's raw ops vs "
                        "tf.keras Adam")
    p.add_argument("--tf1", choices=["resource", "ref"],
                   help="TF1-style graph mode (tf.compat.v1 Session) with resource or ref "
                        "variables: fusedopt.compat.v1.LazyAdamOptimizer vs "
                        "tf.compat.v1.train.AdamOptimizer")
    p.add_argument("--estimator", type=int, metavar="TOWERS",
                   help="Estimator variant (TF <= 2.15): the model_fn replicated over TOWERS "
                        "CPU devices with fusedopt.estimator.replicate_model_fn, trained by "
                        "TowerOptimizer(LazyAdamOptimizer) vs TowerOptimizer(AdamOptimizer)")
    args = p.parse_args(argv)
    if args.tf1 and args.estimator:
        p.error("--tf1 and --estimator are different variants: pick one")
    if args.quick:
        args.rows, args.batch, args.steps = 10_000, 256, 30
    return args


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
    """One optimizer's training run: losses and step times, a progress line every tenth."""

    def __init__(self, name, steps):
        self.name, self.steps = name, steps
        self.report_every = max(1, steps // 10)
        self.losses, self.seconds = [], []

    def print_progress(self, step, loss, step_seconds):
        print(f"  [{self.name}] step {step:5d}/{self.steps}  loss {loss:.4f}  "
              f"step {1e3 * step_seconds:.1f} ms", flush=True)

    def step_done(self, loss, seconds):
        """Records one step: its loss and how long it took."""
        if self.losses:  # the first step traces the function (or warms up the graph)
            self.seconds.append(seconds)
        self.losses.append(loss)
        step = len(self.losses)
        if step % self.report_every == 0 or step == 1:
            self.print_progress(step, loss, np.mean(self.seconds[-self.report_every:] or [0]))

    def final_loss(self):
        """The mean loss of the last tenth of the steps."""
        return float(np.mean(self.losses[-self.report_every:]))

    def step_seconds(self):
        return float(np.median(self.seconds))


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


def keras_fit(tf, args, name, make_optimizer):
    """Keras variant: the model as Keras layers, trained by model.fit.

    Returns (first loss, mean loss of the last tenth, median step seconds). Each "epoch" is a
    tenth of the steps, so its reported loss is the mean over that window.
    """
    keras = tf.keras
    init = keras.initializers.RandomNormal(0.0, 0.05, seed=args.seed)
    ids = keras.Input((args.bag,), dtype="int64")
    pooled = keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(args.rows, args.dim, embeddings_initializer=init)(ids))
    logits = keras.layers.Dense(1, kernel_initializer=init)(pooled)
    model = keras.Model(ids, keras.layers.Reshape(())(logits))
    model.compile(optimizer=make_optimizer(args.lr),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    data = clicks(args)
    batches = [data.next() for _ in range(args.steps)]
    first_loss = float(model.evaluate(*batches[0], batch_size=args.batch, verbose=0))
    log = TrainingLog(name, args.steps)
    window = log.report_every
    seconds, losses = [], []

    class Progress(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            seconds.append(time.perf_counter() - self.start)

        def on_epoch_end(self, epoch, logs=None):
            losses.append(logs["loss"])
            log.print_progress((epoch + 1) * window, logs["loss"], np.median(seconds[-window:]))

    def stream():
        for ids_batch, labels in batches:
            yield ids_batch, labels
    dataset = tf.data.Dataset.from_generator(stream, output_signature=(
        tf.TensorSpec([args.batch, args.bag], tf.int64), tf.TensorSpec([args.batch], tf.float32)))
    model.fit(dataset, epochs=args.steps // window, steps_per_epoch=window, verbose=0, shuffle=False,
              callbacks=[Progress()])
    return first_loss, float(losses[-1]), float(np.median(seconds[1:]))


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


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    print(f"fusedopt demo: {args.rows:,} x {args.dim} embedding table, batch {args.batch} x "
          f"{args.bag} Zipf({args.zipf}) ids, {args.steps} steps, TF {tf.__version__}"
          + (f", TF1-style graph mode with {args.tf1} variables" if args.tf1 else "")
          + (f", Estimator over {args.estimator} CPU towers" if args.estimator else ""))
    print(f"  loss of a constant guess: {math.log(2):.4f}")
    contenders, run = variant(tf, args)
    if args.no_baseline:
        contenders = contenders[:1]
    return report([(name, *run(tf, args, name, make)) for name, make in contenders])


def report(results):
    """Prints the side-by-side table; `results` holds (name, first, final, step seconds)."""
    print(f"\n{'optimizer':24s} {'first loss':>10s} {'final loss':>10s} {'step ms':>9s}")
    for name, first_loss, final_loss, step_seconds in results:
        print(f"{name:24s} {first_loss:10.4f} {final_loss:10.4f} {1e3 * step_seconds:9.2f}")
    if len(results) == 2:
        print(f"fusedopt step time: {results[1][3] / results[0][3]:.1f}x faster than "
              f"{results[1][0]}")
    return results


if __name__ == "__main__":
    main()
