"""Helper process for tests/distribute/test_distribute.py (one strategy per process: TF's devices,
collectives and cluster connections can only be set up once per process).

    python distribute_worker.py mirrored OUT.json [MODELS [OPTIMIZERS]]  # MirroredStrategy, 2 virtual CPUs
    python distribute_worker.py multiworker OUT.json [...]     # MultiWorkerMirroredStrategy (TF_CONFIG)
    python distribute_worker.py multiworker_loop OUT.json [...]  # same, custom loop (strategy.run)
    python distribute_worker.py estimator OUT.json DIR   # TF 2.15 Estimator, RunConfig with
                                                         # train_distribute over 2 CPU devices

Each mode trains fusedopt.keras optimizers (default: every one) on a dense and an embedding
model (MODELS and OPTIMIZERS choose: plan()) with Keras ``fit`` under the strategy, then the
same model from the same initial weights with no strategy and the same global batch, and
writes both final weight sets (and which fused kernels were traced) as JSON.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

GLOBAL_BATCH = 16
STEPS = 6
EPOCHS = 2
VOCAB, WIDTH, IDS = 40, 4, 3
# Per-row rules too: their slots (one value per row) live beside each replica's variable.
# "Class:variant": the class with more arguments (lazy weight decay: per replica, with the
# update, touched rows only).
OPTIMIZERS = {"LazyAdam": dict(learning_rate=0.05), "Adamax": dict(learning_rate=0.05),
              "Adagrad": dict(learning_rate=0.3), "RowWiseAdagrad": dict(learning_rate=0.3),
              "PartialRowWiseAdam": dict(learning_rate=0.05),
              "LazyAdam:lazy_weight_decay": dict(learning_rate=0.05, weight_decay=0.1,
                                                 lazy_weight_decay=True),
              # compact slots, made beside each replica's variable (bfloat16; float16
              # under MultiWorkerMirrored: main() sets it, and checks bfloat16's refusal)
              "LazyAdam:compact_slots": dict(learning_rate=0.05, slot_dtype="bfloat16")}


def make_optimizer(opt_name):
    import fusedopt.keras

    return getattr(fusedopt.keras, opt_name.split(":")[0])(**OPTIMIZERS[opt_name])


def data(kind):
    rng = np.random.default_rng(7)
    n = GLOBAL_BATCH * STEPS
    if kind == "dense":
        x = rng.normal(size=(n, 5)).astype(np.float32)
    else:  # Zipf-like ids: duplicates inside and across replicas' batches, unused rows
        x = np.minimum(rng.zipf(1.5, size=(n, IDS)) - 1, VOCAB // 2).astype(np.int32)
    y = rng.normal(size=(n, 1)).astype(np.float32)
    return x, y


def build(kind):
    keras = tf.keras
    if kind == "dense":
        inputs = keras.Input((5,))
        h = keras.layers.Dense(WIDTH, activation="tanh")(inputs)
    else:
        inputs = keras.Input((IDS,), dtype="int32")
        h = keras.layers.Embedding(VOCAB, WIDTH)(inputs)
        h = keras.layers.Flatten()(h)
    outputs = keras.layers.Dense(1)(h)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(11)
    model.set_weights([rng.normal(scale=0.5, size=w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


def train(kind, opt_name, strategy=None):
    x, y = data(kind)
    scope = strategy.scope() if strategy is not None else _null()
    with scope:
        model = build(kind)
        opt = make_optimizer(opt_name)
        model.compile(optimizer=opt, loss="mse")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    if strategy is not None and strategy.extended._in_multi_worker_mode():
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        ds = ds.with_options(options)
    hist = model.fit(ds, epochs=EPOCHS, shuffle=False, verbose=0)
    return [w.tolist() for w in model.get_weights()], hist.history["loss"]


def train_loop(kind, opt_name, strategy=None):
    """Custom loop: strategy.run + optimizer.apply_gradients; under MultiWorkerMirrored
    each worker feeds its half of every global batch. Works with Keras 3 (whose fit does
    not support MultiWorkerMirroredStrategy)."""
    x, y = data(kind)
    scope = strategy.scope() if strategy is not None else _null()
    with scope:
        model = build(kind)
        opt = make_optimizer(opt_name)

    def replica_fn(xb, yb):
        with tf.GradientTape() as tape:  # this replica's share of the global mean
            loss = tf.reduce_sum(tf.square(model(xb) - yb)) / GLOBAL_BATCH
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step = tf.function(replica_fn if strategy is None else
                       lambda xb, yb: strategy.run(replica_fn, args=(xb, yb)))
    parts = 1 if strategy is None else strategy.num_replicas_in_sync
    task = 0 if strategy is None else strategy.cluster_resolver.task_id
    size = GLOBAL_BATCH // parts
    for _ in range(EPOCHS):
        for i in range(STEPS):
            lo = i * GLOBAL_BATCH + task * size
            step(tf.constant(x[lo:lo + size]), tf.constant(y[lo:lo + size]))
    return [w.tolist() for w in model.get_weights()], []


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# The slots' dtypes the fused single-variable ops were called with (record_kernels).
SLOT_DTYPES = set()


def record_kernels():
    """Which fused kernels (rule, sparse) the optimizers traced (and, in SLOT_DTYPES, with
    slots of which dtypes)."""
    from fusedopt import _dispatch

    seen = set()
    original = _dispatch._op

    def op(rule, sparse):
        seen.add("%s/%s" % (rule, "sparse" if sparse else "dense"))
        fn = original(rule, sparse)

        def call(variable, *slots, **kwargs):
            SLOT_DTYPES.update(tf.as_dtype(s.dtype).base_dtype.name for s in slots)
            return fn(variable, *slots, **kwargs)

        return call

    _dispatch._op = op
    return seen


def estimator_run(model_dir, distributed):
    """Estimator + fusedopt.compat.v1 optimizers (LazyAdam on the embedding, Adagrad on the
    dense weights), RunConfig(train_distribute=MirroredStrategy over 2 CPUs) or plain."""
    import fusedopt.compat.v1 as fv1

    est = tf.compat.v1.estimator
    x, y = data("embedding")
    dense_x = data("dense")[0]
    rng = np.random.default_rng(11)
    emb0 = rng.normal(scale=0.5, size=(VOCAB, WIDTH)).astype(np.float32)
    w0 = rng.normal(scale=0.5, size=(5, 1)).astype(np.float32)

    # Estimator's input_fn makes each replica's batch (consecutive batches go to the
    # replicas): a global step sees the same 16 examples as the single-device step.
    batch = GLOBAL_BATCH // 2 if distributed else GLOBAL_BATCH

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(
            ({"ids": x, "x": dense_x}, y)).batch(batch).repeat(EPOCHS)

    def model_fn(features, labels, mode):
        emb = tf.compat.v1.get_variable("emb", initializer=emb0)
        w = tf.compat.v1.get_variable("w", initializer=w0)
        pred = tf.reduce_sum(tf.nn.embedding_lookup(emb, features["ids"]), axis=[1, 2])[:, None]
        pred += tf.matmul(features["x"], w)
        loss = tf.compat.v1.losses.mean_squared_error(labels, pred)
        step = tf.compat.v1.train.get_global_step()
        lazy = fv1.LazyAdamOptimizer(0.05).minimize(loss, var_list=[emb])
        with tf.control_dependencies([lazy]):
            train_op = fv1.AdagradOptimizer(0.3).minimize(loss, var_list=[w], global_step=step)
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)

    kwargs = {}
    if distributed:
        kwargs["train_distribute"] = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    config = est.RunConfig(model_dir=model_dir, save_summary_steps=None,
                           log_step_count_steps=1000,
                           session_config=tf.compat.v1.ConfigProto(device_count={"CPU": 2}),
                           **kwargs)
    estimator = est.Estimator(model_fn, config=config)
    estimator.train(input_fn, steps=STEPS * EPOCHS)
    return {name: estimator.get_variable_value(name).tolist()
            for name in ("emb", "w", "global_step")}


def record_kernels_v1():
    """Which fusedopt.ops wrappers the compat.v1 optimizers called (graph construction)."""
    from fusedopt import ops

    seen = []
    for name in dir(ops):
        if name.startswith("resource_") and "apply_" in name:
            fn = getattr(ops, name)

            def wrapper(*a, _fn=fn, _name=name, **k):
                seen.append(_name)
                return _fn(*a, **k)
            setattr(ops, name, wrapper)
    return seen


def plan(models="dense,embedding", optimizers=None):
    """[(model kind, [optimizer names])]: MODELS is a comma list of kinds, each trained with
    the comma list OPTIMIZERS (default: every one in OPTIMIZERS), or "kind=Opt+Opt" for that
    kind with those only."""
    default = optimizers.split(",") if optimizers else list(OPTIMIZERS)
    runs = []
    for item in models.split(","):
        kind, _, only = item.partition("=")
        runs.append((kind, only.split("+") if only else default))
    return runs


def main():
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "estimator":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        seen = record_kernels_v1()
        result = {"distributed": estimator_run(os.path.join(sys.argv[3], "mirrored"), True)}
        result["kernels"] = sorted(seen)  # one call per variable per mirrored copy
        del seen[:]
        result["local"] = estimator_run(os.path.join(sys.argv[3], "local"), False)
        result["local_kernels"] = sorted(seen)
        with open(out, "w") as f:
            json.dump(result, f)
        return
    if mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    elif mode in ("multiworker", "multiworker_loop"):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        raise SystemExit("unknown mode %r" % mode)
    seen = record_kernels()
    result = {"replicas": strategy.num_replicas_in_sync, "runs": {}}
    if mode != "mirrored":  # TF broadcasts new variables' values: no bfloat16 kernel there
        OPTIMIZERS["LazyAdam:compact_slots"]["slot_dtype"] = "float16"
        try:
            with strategy.scope():
                import fusedopt.keras

                var = tf.Variable(tf.zeros([2, 2]))
                fusedopt.keras.LazyAdam(slot_dtype="bfloat16").build([var])
        except ValueError as e:
            result["bfloat16_refused"] = str(e)
    for kind, opts in plan(*sys.argv[3:5]):
        for name in opts:
            seen.clear()
            SLOT_DTYPES.clear()
            run = train_loop if mode == "multiworker_loop" else train
            dist_w, dist_loss = run(kind, name, strategy)
            dist_kernels, slot_dtypes = sorted(seen), sorted(SLOT_DTYPES)
            local_w, local_loss = run(kind, name)
            result["runs"]["%s/%s" % (kind, name)] = dict(
                distributed=dist_w, local=local_w, distributed_loss=dist_loss,
                local_loss=local_loss, kernels=dist_kernels, slot_dtypes=slot_dtypes)
            print("done", kind, name, flush=True)
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
