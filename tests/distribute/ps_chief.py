"""Chief (coordinator) of the ParameterServerStrategy test (tests/distribute/test_distribute.py).

    TF_CONFIG=... python ps_chief.py OUT.json --ckpt DIR [--kill_pid PID] [--expect_failure]
        [--optimizer LazyAdam|RowWiseAdagrad|PartialRowWiseAdam|...]

The ps and worker tasks are ``python -m fusedopt.server`` processes (started by the test,
or by hand: docs/guides/distributed.md, "Parameter servers").
Keras model (tf_keras / Keras 2: Keras 3 has no ParameterServerStrategy support) whose
embedding is split across both parameter servers by ``variable_partitioner``, trained with
``fusedopt.keras.LazyAdam`` (or ``--optimizer``: a per-row rule's slots are split with the
table's rows) through a ``ClusterCoordinator``:

1. ``sync``: steps scheduled one at a time (join after each) on fixed batches, then the
   same model trained without any strategy: both weight sets go to OUT.
2. Placement: variables' and slots' devices, and the devices the fused sparse update ops
   were placed on (partition graphs from RunMetadata of one step run from the chief).
3. ``async``: steps from per-worker datasets on both workers; after a few, worker 1 is
   killed (``--kill_pid``); the remaining steps still run. Then a checkpoint is written,
   restored into fresh variables on the parameter servers, compared, and trained on.
"""
import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

VOCAB, WIDTH, IDS, BATCH = 40, 4, 3, 8
SYNC_STEPS, ASYNC_STEPS, KILL_AFTER, MORE_STEPS = 6, 24, 6, 4
LR = 0.05


def log(*args):
    print("[chief %.1fs]" % (time.time() - T0), *args, flush=True)


T0 = time.time()


def batches(n, seed):
    rng = np.random.default_rng(seed)
    x = np.minimum(rng.zipf(1.5, size=(n, BATCH, IDS)) - 1, VOCAB // 2).astype(np.int32)
    y = rng.normal(size=(n, BATCH, 1)).astype(np.float32)
    return x, y


def build():
    keras = tf.keras
    inputs = keras.Input((IDS,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, WIDTH, name="emb")(inputs)
    h = keras.layers.Flatten()(h)
    outputs = keras.layers.Dense(1, name="out")(h)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(11)
    for var in model_variables(model):  # full-shape values, split like the variable
        shards = getattr(var, "variables", [var])
        rows = sum(int(s.shape[0]) for s in shards)
        full = rng.normal(scale=0.5, size=[rows] + list(shards[0].shape[1:]))
        parts = np.split(full.astype(np.float32),
                         np.cumsum([int(s.shape[0]) for s in shards])[:-1])
        for shard, part in zip(shards, parts):
            shard.assign(part)
    return model


def model_variables(model):
    """Embedding table, output kernel and bias (ShardedVariable where partitioned)."""
    emb, out = model.get_layer("emb"), model.get_layer("out")
    return [emb.embeddings, out.kernel, out.bias]


def make_step(model, opt):
    def replica_fn(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return replica_fn


def weights(model):
    """Full values (shards concatenated) of model_variables()."""
    return [np.concatenate([s.numpy() for s in getattr(v, "variables", [v])]).tolist()
            for v in model_variables(model)]


def shard_devices(variable):
    return [v.device for v in getattr(variable, "variables", [variable])]


def main():
    import fusedopt.keras

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill_pid", type=int)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--optimizer", default="LazyAdam",
                        help="the fusedopt.keras class trained (constructed with LR); "
                             "Class:bf16 with bfloat16 slots")
    parser.add_argument("--expect_failure", action="store_true",
                        help="one step only; write the error it raises (ps tasks started "
                             "without the op library)")
    args = parser.parse_args()
    result = {}

    def make_optimizer():
        name, _, variant = args.optimizer.partition(":")
        compact = {"bf16": {"slot_dtype": "bfloat16"}, "": {}}[variant]
        return getattr(fusedopt.keras, name)(LR, **compact)

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(num_shards=2)
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    log("connected to", resolver.cluster_spec().as_dict())
    with strategy.scope():
        model = build()
        opt = make_optimizer()
    emb = model.get_layer("emb").embeddings
    result["embedding_type"] = type(emb).__name__
    result["embedding_devices"] = shard_devices(emb)

    # 1. sync: one step at a time, explicit batches: deterministic.
    replica_fn = make_step(model, opt)

    @tf.function
    def step(x, y):
        return strategy.run(replica_fn, args=(x, y))

    xs, ys = batches(SYNC_STEPS, 3)
    if args.expect_failure:
        try:
            coordinator.schedule(step, args=(tf.constant(xs[0]), tf.constant(ys[0])))
            coordinator.join()
            result["error"] = None
        except Exception as e:  # noqa: BLE001 - the test checks which
            result["error"] = "%s: %s" % (type(e).__name__, e)
        with open(args.out, "w") as f:
            json.dump(result, f)
        log("expected failure:", result["error"])
        sys.stdout.flush()
        os._exit(0)
    losses = []
    for i in range(SYNC_STEPS):
        r = coordinator.schedule(step, args=(tf.constant(xs[i]), tf.constant(ys[i])))
        coordinator.join()
        losses.append(float(r.fetch()))
    result["sync_loss"] = losses
    result["sync_weights"] = weights(model)
    result["sync_iterations"] = int(opt.iterations.numpy())
    log("sync done", losses[-1])
    result["slot_devices"] = [[s.name, s.device] for v in opt.variables
                              for s in getattr(v, "variables", [v])]
    result["slot_shapes"] = {s.name: s.shape.as_list() for v in opt.variables
                             for s in getattr(v, "variables", [v])}
    result["slot_dtypes"] = {s.name: tf.as_dtype(s.dtype).name for v in opt.variables
                             for s in getattr(v, "variables", [v])}

    local = build()
    local_opt = make_optimizer()
    local_fn = tf.function(make_step(local, local_opt))
    local_losses = [float(local_fn(tf.constant(xs[i]), tf.constant(ys[i])))
                    for i in range(SYNC_STEPS)]
    result["local_loss"] = local_losses
    result["local_weights"] = weights(local)

    # 2. where did the fused sparse update run? Partition graphs of one step, run from
    # the chief (same function; the coordinator runs it the same way on a worker).
    from tensorflow.python.eager import context

    context.enable_run_metadata()
    try:
        step(tf.constant(xs[0]), tf.constant(ys[0]))
        metadata = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    placed = []
    for fg in metadata.function_graphs:
        for pg in fg.partition_graphs:
            for node in pg.node:
                if node.op.startswith("FusedOpt>"):
                    placed.append([node.op, node.device])
    result["fused_op_devices"] = placed
    log("placement", placed)

    # 3. async on both workers, one of them killed mid-way.
    def dataset_fn():
        ax, ay = batches(64, 5)
        return tf.data.Dataset.from_tensor_slices((ax, ay)).repeat()

    per_worker = coordinator.create_per_worker_dataset(dataset_fn)
    iterator = iter(per_worker)

    @tf.function
    def worker_step(it):
        x, y = next(it)
        return strategy.run(replica_fn, args=(x, y))

    start_iter = int(opt.iterations.numpy())
    for i in range(ASYNC_STEPS):
        coordinator.schedule(worker_step, args=(iterator,))
        if i + 1 == KILL_AFTER:
            coordinator.join()
            if args.kill_pid:
                os.kill(args.kill_pid, signal.SIGKILL)
                log("killed worker pid", args.kill_pid)
                result["killed"] = args.kill_pid
    coordinator.join()
    result["async_steps_run"] = int(opt.iterations.numpy()) - start_iter
    log("async done, iterations", int(opt.iterations.numpy()))

    # Checkpoint, restore into fresh variables on the parameter servers, continue.
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    path = ckpt.write(os.path.join(args.ckpt, "ckpt"))
    saved = weights(model)
    saved_opt = [np.asarray(v.numpy()).tolist() for v in opt.variables]
    with strategy.scope():
        model2 = build()
        opt2 = make_optimizer()
        opt2.build(model2.trainable_variables)
    tf.train.Checkpoint(model=model2, optimizer=opt2).read(path).assert_consumed()
    result["restored_equal"] = bool(
        all(np.array_equal(a, b) for a, b in zip(saved, weights(model2))) and
        all(np.array_equal(a, np.asarray(v.numpy())) for a, v in zip(saved_opt, opt2.variables)))
    result["saved_finite"] = bool(all(np.all(np.isfinite(w)) for w in saved + saved_opt))
    result["restored_iterations"] = int(opt2.iterations.numpy())
    step2_fn = make_step(model2, opt2)

    @tf.function
    def step2(x, y):
        return strategy.run(step2_fn, args=(x, y))

    mx, my = batches(MORE_STEPS, 9)
    more = []
    for i in range(MORE_STEPS):
        r = coordinator.schedule(step2, args=(tf.constant(mx[i]), tf.constant(my[i])))
        coordinator.join()
        more.append(float(r.fetch()))
    result["continued_loss"] = more
    result["continued_iterations"] = int(opt2.iterations.numpy())
    result["continued_finite"] = bool(all(np.all(np.isfinite(w)) for w in weights(model2)))
    log("continued", more)
    with open(args.out, "w") as f:
        json.dump(result, f)
    log("wrote", args.out)
    sys.stdout.flush()
    os._exit(0)  # the coordinator's threads would otherwise wait for the killed worker


if __name__ == "__main__":
    main()
