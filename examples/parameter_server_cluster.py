"""A parameter-server cluster on this machine, training with `fusedopt.keras.LazyAdam`.

With `tf.distribute.ParameterServerStrategy` the variables and their optimizer slots live on
the parameter servers, and so does their update: every ps and worker task must load
fusedopt's op library, which `python -m fusedopt.server` does before serving. This script
starts 2 parameter servers and 2 workers that way on free ports of 127.0.0.1, then acts as
the chief: builds a Keras 2 model whose embedding table is split over both parameter servers,
trains it through a `ClusterCoordinator`, prints the loss and where each shard and its fused
update ran, and stops every process it started, also when something fails. (TensorFlow's
server listens on every network interface whatever address the cluster names, and it is
unauthenticated: run this where those ports cannot be reached from outside;
docs/guides/distributed.md, "Security".)

    python examples/parameter_server_cluster.py                          # 1M-row table
    python examples/parameter_server_cluster.py --rows 1000 --steps 10   # a quick look

Needs tf_keras on TensorFlow 2.16 or later (Keras 3 does not support this strategy; the
script sets TF_USE_LEGACY_KERAS=1 where tf_keras is installed), or TensorFlow 2.15, and
fusedopt.
"""
import argparse
import importlib.util
import json
import os
import re
import sys
import time

from fusedopt.local_cluster import LocalCluster

if importlib.util.find_spec("tf_keras") is not None:  # TensorFlow 2.16 and later
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # the chief's Keras: tf_keras (Keras 2)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="embedding table rows")
    p.add_argument("--dim", type=int, default=16, help="embedding width")
    p.add_argument("--batch", type=int, default=1024, help="examples per step")
    p.add_argument("--steps", type=int, default=100, help="training steps")
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for the servers")
    return p.parse_args(argv)


def train_as_chief(args, cluster):
    import numpy as np
    import tensorflow as tf

    import fusedopt.keras

    chief = {"cluster": cluster, "task": {"type": "chief", "index": 0}}
    os.environ["TF_CONFIG"] = json.dumps(chief)
    strategy = tf.distribute.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver(),
        variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((4,), dtype="int32"),
            tf.keras.layers.Embedding(args.rows, args.dim, name="table"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(1),
        ])
        optimizer = fusedopt.keras.LazyAdam(0.01)

    def dataset_fn():
        rng = np.random.default_rng()
        ids = ((rng.zipf(1.2, size=(args.batch * 16, 4)) - 1) % args.rows).astype(np.int32)
        target = (ids % 7).sum(axis=1, keepdims=True).astype(np.float32) / 10
        return tf.data.Dataset.from_tensor_slices((ids, target)).batch(args.batch).repeat()

    @tf.function
    def step(iterator):
        def replica_step(x, y):
            weights = model.trainable_variables
            with tf.GradientTape() as tape:
                errors = tf.keras.losses.mean_squared_error(y, model(x, training=True))
                loss = tf.reduce_mean(errors)
            optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))  # on the ps
            return loss
        return strategy.run(replica_step, args=next(iterator))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    start = time.perf_counter()
    losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(args.steps)]
    coordinator.join()
    seconds = time.perf_counter() - start
    shards = [v.device for v in model.get_layer("table").embeddings.variables]
    print(f"Trained {args.steps} steps of {args.batch:,} examples on 2 workers "
          f"(TensorFlow {tf.__version__}): loss {float(losses[0].fetch()):.4f} -> "
          f"{float(losses[-1].fetch()):.4f}, {seconds * 1000 / args.steps:.1f} ms per step.")
    print(f"The {args.rows:,} x {args.dim} table is split in {len(shards)} shards: "
          + ", ".join(shards) + "; the optimizer's slots beside them.")


def main(argv=None):
    args = parse_args(argv)
    if os.environ.get("TF_USE_LEGACY_KERAS") != "1":
        import tensorflow as tf

        if not tf.__version__.startswith("2.15"):
            sys.exit("This example needs tf_keras on TensorFlow 2.16 and later (pip install "
                     "tf-keras): Keras 3 does not support ParameterServerStrategy.")
    cluster = LocalCluster(num_ps=2, num_workers=2, timeout=args.timeout,
                           server_args=["--log_device_placement"])
    print("Starting 2 parameter servers and 2 workers (python -m fusedopt.server) on free "
          "ports of 127.0.0.1.")
    with cluster:  # every server stopped when the block ends, also on an error or Ctrl-C
        print("Serving: " + ", ".join(f"{s.name} at {s.address}" for s in cluster.servers) + ".")
        train_as_chief(args, cluster.cluster)
        placed = set()
        for server in cluster.servers:
            placed.update(re.findall(r"\(FusedOpt>ResourceSparseApplyLazyAdam\) placed on: (\S+)",
                                     server.log()))
    print("The fused sparse update ran on: " + (", ".join(sorted(placed)) or "(not logged)") + ".")
    print(f"Stopped all {len(cluster.servers)} server processes.")
    sys.stdout.flush()
    os._exit(0)  # the coordinator's threads would wait for the stopped servers at exit


if __name__ == "__main__":
    main()
