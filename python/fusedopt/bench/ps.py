"""``python -m fusedopt.bench --ps``: training with parameter servers, on this machine.

Starts a ``tf.distribute`` cluster on 127.0.0.1 (``fusedopt.local_cluster``): ``num_ps``
parameter servers and 2 workers, each a ``python -m fusedopt.server`` process, with this
process as the chief. A Keras 2 model (an embedding table of ``rows x dim`` float32, split in
one shard per parameter server, the mean of a bag of ids per example, a dense output) is
trained through a ``ClusterCoordinator`` with each optimizer of ``CONTENDERS`` in turn, on
the same cluster: fusedopt's row-wise Adagrad with bfloat16 slots, fusedopt's LazyAdam, and
Keras's own Adam, the class LazyAdam replaces. For each it reports:

- examples per second: ``warmup`` steps first (tracing, slot creation), then steps until
  both ``min_steps`` steps and ``seconds`` seconds have passed, on all workers at once;
- the bytes of the table and of the optimizer's state on each parameter server, from the
  variables placed there (each shard's shape times its dtype's size);
- each parameter server's resident memory (Linux /proc) before the model is built and after
  the timed steps, and its peak in between.

The optimizers share the cluster: each one's model and optimizer are deleted before the
next is built, which frees their variables on the parameter servers (the memory figures
say how much came back). Every server process is stopped at the end, also on an error or
Ctrl-C. This is one machine: gRPC over the loopback interface, all processes sharing its
cores and memory bandwidth, so the figures say what the update costs the parameter servers
and how the optimizers compare, not what a network of machines would give.

``--use-tf-config`` runs the same on a cluster whose ps and worker tasks already serve
(``python -m fusedopt.server`` on each host), this process the chief ``TF_CONFIG`` names:
nothing is started or stopped then, and the servers' memory is not read (other machines).

Needs Keras 2: tf_keras on TensorFlow 2.16 and later (``TF_USE_LEGACY_KERAS=1`` is set here
where tf_keras is installed; Keras 3 does not support ``ParameterServerStrategy``), or
TensorFlow 2.15.
"""
import gc
import importlib.util
import json
import logging
import os
import sys
import time
from collections import deque

from fusedopt import _console
from fusedopt.bench.config import LR
from fusedopt.bench.largest_table import mem_available
from fusedopt.bench.machine import machine_words
from fusedopt.bench.report import megabytes
from fusedopt.bench.state import Contender
from fusedopt.local_cluster import LocalCluster, process_memory, reset_peak_memory

__all__ = ["CONTENDERS", "ClusterOfTFConfig", "QUICK_SIZES", "SIZES", "USER_SIZES",
           "cluster_of_tf_config", "memory_needed", "report", "run", "sizes",
           "traffic_per_step"]

SIZES = dict(rows=10_000_000, dim=32, batch=1024, bag=8, num_ps=2, workers=2, warmup=5,
             min_steps=10, seconds=30.0)
QUICK_SIZES = dict(SIZES, rows=10_000, dim=8, batch=64, bag=4, warmup=2, min_steps=4,
                   seconds=0.0)
USER_SIZES = ("rows", "dim", "batch", "num_ps", "seconds")  # what the command line may set
BATCHES_IN_DATA = 32  # distinct batches each worker cycles through

BF16 = {"slot_dtype": "bfloat16"}
CONTENDERS = (
    Contender("fusedopt.keras.RowWiseAdagrad, bfloat16 slots", "fusedopt.keras",
              "RowWiseAdagrad", BF16),
    Contender("fusedopt.keras.LazyAdam", "fusedopt.keras", "LazyAdam"),
    Contender("Keras Adam", "keras", "Adam"),  # the class LazyAdam replaces (label: run())
)
TABLE = "table"  # the embedding layer's name


def sizes(args):
    """The run's sizes: the defaults (or --quick's), then what the user gave; with a cluster
    of TF_CONFIG (args.cluster), its own numbers of ps and worker tasks."""
    cfg = dict(QUICK_SIZES if args.quick else SIZES)
    cfg.update({name: getattr(args, name) for name in USER_SIZES
                if getattr(args, name, None) is not None})
    cluster = getattr(args, "cluster", None)
    if cluster:
        cfg.update(cluster=cluster, num_ps=len(cluster["ps"]), workers=len(cluster["worker"]))
    return cfg


def cluster_of_tf_config(environ=None):
    """The cluster of ``TF_CONFIG`` when it names this process the chief of a cluster with ps
    and worker tasks; ValueError (one line) otherwise."""
    from fusedopt import server

    environ = os.environ if environ is None else environ
    if not environ.get("TF_CONFIG"):
        raise ValueError("TF_CONFIG is not set")
    cluster, job, index = server.resolve(server.parse_args([]), environ)
    if job != "chief":
        raise ValueError(f"TF_CONFIG names this task {job} {index}; the benchmark runs as the "
                         "chief (task type chief, index 0)")
    missing = [j for j in ("ps", "worker") if not cluster.get(j)]
    if missing:
        raise ValueError(f"TF_CONFIG's cluster has no {' and no '.join(missing)} tasks")
    return cluster


class ClusterOfTFConfig:
    """The cluster ``TF_CONFIG`` describes, its servers started by someone else (on other
    machines, as a real cluster's are): nothing to start or stop; their memory is not read
    from here. The same interface as ``LocalCluster`` for what ``run`` uses."""

    servers = ()

    def __init__(self, cluster):
        self.cluster = cluster

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def tf_config(self, job="chief", index=0):
        return json.dumps({"cluster": self.cluster, "task": {"type": job, "index": index}})

    def pids(self):
        return {}


# Each server process holds TensorFlow's runtime and fusedopt's library (measured: 0.55-0.6
# GB resident before any variable).
PROCESS_BYTES = 700e6


def memory_needed(cfg):
    """Bytes the whole cluster holds at its peak, about: Keras Adam's step, whose update
    rewrites every row of the table and of its two slots through whole-shard temporaries
    (measured: each parameter server peaked at 8.3 times its shard of the table above its
    runtime, 10M x 32 on 2 parameter servers), plus each process's runtime."""
    table = 4 * cfg["rows"] * cfg["dim"]
    return 9 * table + PROCESS_BYTES * (cfg["num_ps"] + cfg["workers"] + 1)


def use_keras_2():
    """Makes ``tf.keras`` Keras 2 (before TensorFlow is imported), or says why it cannot:
    None where it can."""
    if importlib.util.find_spec("tf_keras") is not None:  # TensorFlow 2.16 and later
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        return None
    import tensorflow as tf

    if tuple(int(x) for x in tf.__version__.split(".")[:2]) >= (2, 16):
        return ("needs tf_keras on TensorFlow 2.16 and later (pip install tf-keras): Keras 3 "
                "does not support ParameterServerStrategy")
    return None  # TensorFlow 2.15: tf.keras is Keras 2


def task_of(device):
    """"/job:ps/replica:0/task:1/device:CPU:0" -> "ps1"."""
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    return parts.get("job", "?") + parts.get("task", "")


def one_line(error):
    text = getattr(error, "message", None) or str(error) or type(error).__name__
    return type(error).__name__ + ": " + " ".join(text.split())[:400]


# -- the model and its data -----------------------------------------------------------------

def make_data(np, cfg, seed):
    """BATCHES_IN_DATA batches of (ids [batch, bag], target [batch, 1]). Ids are Zipf(1.1)
    ranks, as embedding lookups are, spread over the table by a multiplicative hash: the
    shards hold contiguous row ranges, so unhashed the hot ids would all be on the first
    parameter server."""
    rng = np.random.default_rng(seed)
    n = BATCHES_IN_DATA * cfg["batch"]
    ranks = rng.zipf(1.1, size=(n, cfg["bag"])).astype(np.int64) - 1
    ids = (ranks * 2654435761 % cfg["rows"]).astype(np.int32)  # Knuth's multiplier, a prime
    target = (ranks % 5 == 0).mean(axis=1, keepdims=True).astype(np.float32)
    return ids, target


def distinct_ids_per_step(np, ids, cfg):
    batches = ids.reshape(BATCHES_IN_DATA, -1)
    return float(np.mean([len(np.unique(b)) for b in batches]))


def make_model(tf, cfg):
    return tf.keras.Sequential([
        tf.keras.Input((cfg["bag"],), dtype="int32"),
        tf.keras.layers.Embedding(cfg["rows"], cfg["dim"], name=TABLE),
        tf.keras.layers.GlobalAveragePooling1D(),
        tf.keras.layers.Dense(1, name="out"),
    ])


def shards_of(variable):
    return list(getattr(variable, "variables", [variable]))


def placement(tf, model, optimizer):
    """Every variable shard of the model and the optimizer: name, task, shape, dtype, bytes,
    and what it is ("table", "model": the rest of the model, "optimizer")."""
    table = {id(s) for s in shards_of(model.get_layer(TABLE).embeddings)}
    found = []
    for kind, variables in (("model", model.variables), ("optimizer", optimizer.variables)):
        for variable in variables:
            for shard in shards_of(variable):
                dtype = tf.as_dtype(shard.dtype)
                shape = [int(d) for d in shard.shape]
                count = 1
                for d in shape:
                    count *= d
                found.append({"name": shard.name, "task": task_of(shard.device),
                              "shape": shape, "dtype": dtype.name,
                              "bytes": count * dtype.size,
                              "kind": "table" if id(shard) in table else kind})
    return found


def bytes_per_task(variables):
    """{task: {"table_bytes", "optimizer_bytes", "model_bytes"}} from placement()."""
    out = {}
    for v in variables:
        task = out.setdefault(v["task"], {"table_bytes": 0, "optimizer_bytes": 0,
                                          "model_bytes": 0})
        task[v["kind"] + "_bytes"] += v["bytes"]
    return dict(sorted(out.items()))


# -- one optimizer --------------------------------------------------------------------------

def train(tf, strategy, coordinator, cfg, model, optimizer, data):
    """Warm-up steps, then timed steps on every worker: the timing and losses."""

    def dataset_fn():
        return tf.data.Dataset.from_tensor_slices(data).batch(cfg["batch"]).repeat()

    @tf.function
    def step(iterator):
        def replica_step(ids, target):
            weights = model.trainable_variables
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(ids, training=True) - target))
            optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))  # on the ps
            return loss
        return strategy.run(replica_step, args=next(iterator))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    started = time.perf_counter()
    first = [coordinator.schedule(step, args=(iterator,)) for _ in range(cfg["warmup"])]
    coordinator.join()
    warmup_s = time.perf_counter() - started
    # Timed: keep a few steps queued per worker (waiting on the oldest) rather than joining
    # every few steps, so that no worker idles while the queue drains.
    in_flight, steps, last = deque(), 0, None
    started = time.perf_counter()
    while steps < cfg["min_steps"] or time.perf_counter() - started < cfg["seconds"]:
        last = coordinator.schedule(step, args=(iterator,))
        in_flight.append(last)
        steps += 1
        if len(in_flight) > 4 * cfg["workers"]:
            in_flight.popleft().fetch()
    coordinator.join()
    seconds = time.perf_counter() - started
    return {"warmup_steps": cfg["warmup"], "warmup_s": warmup_s, "steps": steps,
            "seconds": seconds, "examples_per_s": steps * cfg["batch"] / seconds,
            "ms_per_step": 1e3 * seconds / steps,
            "loss_first": float(first[0].fetch()) if first else None,
            "loss_last": float(last.fetch())}


def ps_memory(cluster):
    return {name: process_memory(pid) for name, pid in cluster.pids().items()
            if name.startswith("ps")}


def run_one(tf, strategy, coordinator, cluster, cfg, contender, label, data, progress):
    """One optimizer's run: its figures, or {"error": why it did not run, one line}."""
    result = {"class": f"{contender.module}.{contender.name}", "kwargs": contender.kwargs}
    peaks_reset = all([reset_peak_memory(pid) for name, pid in cluster.pids().items()
                       if name.startswith("ps")])
    before = ps_memory(cluster)
    try:
        with strategy.scope():
            model = make_model(tf, cfg)
            optimizer = contender.make(learning_rate=LR)
        result.update(train(tf, strategy, coordinator, cfg, model, optimizer, data))
        result["variables"] = placement(tf, model, optimizer)
    except Exception as e:  # noqa: BLE001 - whatever stops this optimizer, said in one line
        progress(f"{label}: did not run: {one_line(e)}")
        return dict(result, error=one_line(e))
    after = ps_memory(cluster)
    per_ps = bytes_per_task(result["variables"])
    for name in sorted(before):
        row = per_ps.setdefault(name, {"table_bytes": 0, "optimizer_bytes": 0,
                                       "model_bytes": 0})
        if before[name] and after.get(name):
            row.update(rss_before_bytes=before[name]["rss_bytes"],
                       rss_after_bytes=after[name]["rss_bytes"],
                       anon_before_bytes=before[name]["anon_bytes"],
                       anon_after_bytes=after[name]["anon_bytes"],
                       peak_rss_bytes=after[name]["peak_rss_bytes"],
                       peak_is_since_start=not peaks_reset)
    result["per_ps"] = per_ps
    progress(f"{label}: {result['examples_per_s']:,.0f} examples/s "
             f"({result['steps']} steps in {result['seconds']:.1f} s, after "
             f"{result['warmup_steps']} warm-up steps)")
    return result


# -- the run --------------------------------------------------------------------------------

def environment(tf, cfg):
    import numpy as np

    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine_words(),
            "memory_available_bytes": mem_available(),
            "tensorflow": tf.__version__, "keras": keras_name(tf),
            "numpy": np.__version__, "python": sys.version.split()[0],
            "load_average_at_start": os.getloadavg(), "config": cfg}


def keras_name(tf):
    """"tf_keras 2.21.0" or "keras 2.15.0": the Keras 2 running as tf.keras."""
    root = tf.keras.optimizers.Adam.__module__.split(".")[0]
    return f"{root} {getattr(tf.keras, '__version__', '') or __import__(root).__version__}"


def train_every_contender(cluster, cfg, stages, progress, results):
    """This process as the cluster's chief: each contender's run, into `results`."""
    import numpy as np

    stages.begin("Starting TensorFlow and connecting to the cluster as its chief")
    if results["cluster"]["started_here"]:
        os.environ["TF_CONFIG"] = cluster.tf_config("chief")
    tf = _console.import_tensorflow()
    import fusedopt.keras  # noqa: F401 (the optimizers; loads the op library here too)

    results["environment"] = environment(tf, cfg)
    num_ps = cfg["num_ps"]

    def one_shard_per_ps_for_the_table(shape, dtype):
        """The table (its rows) split in one shard per parameter server; the small
        variables whole, each on one parameter server."""
        big = shape[0] >= cfg["rows"]
        return [num_ps if big else 1] + [1] * (len(shape) - 1)

    strategy = tf.distribute.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver(),
        variable_partitioner=one_shard_per_ps_for_the_table)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    data = make_data(np, cfg, seed=1)
    results["data"] = {"ids_per_step": cfg["batch"] * cfg["bag"],
                       "distinct_ids_per_step": distinct_ids_per_step(np, data[0], cfg),
                       "zipf_a": 1.1}
    stages.end(f"TensorFlow {tf.__version__}, {keras_name(tf)}")
    for contender in CONTENDERS:
        label = contender.label
        if contender.module == "keras":
            label = f"Keras Adam ({keras_name(tf).split()[0]}.optimizers.Adam)"
        stages.begin(f"Training with {label}")
        results["runs"][label] = run_one(tf, strategy, coordinator, cluster, cfg,
                                         contender, label, data, progress)
        gc.collect()  # its model and optimizer: their variables on the ps are freed
        time.sleep(1)  # (asynchronously, by the parameter servers)
        stages.end()
    results["environment"]["load_average_at_end"] = os.getloadavg()


def run(cfg, stages, progress):
    """Starts the cluster, trains with every contender, stops the cluster: the results.
    Raises what stops the run (the cluster not starting, Ctrl-C) after stopping it."""
    started_here = not cfg.get("cluster")
    if started_here:
        stages.begin(f"Starting {cfg['num_ps']} parameter servers and {cfg['workers']} "
                     "workers (python -m fusedopt.server) on 127.0.0.1")
        cluster = LocalCluster(num_ps=cfg["num_ps"], num_workers=cfg["workers"])
    else:
        stages.begin(f"Using the cluster of TF_CONFIG: {cfg['num_ps']} parameter servers, "
                     f"{cfg['workers']} workers, this process its chief")
        cluster = ClusterOfTFConfig(cfg["cluster"])
    results = {"cluster": {}, "runs": {}}
    with cluster:
        results["cluster"] = {"spec": cluster.cluster, "pids": cluster.pids(),
                              "chief_pid": os.getpid(), "started_here": started_here}
        stages.end(", ".join(f"{s.name} {s.address} (pid {s.process.pid})"
                             for s in cluster.servers) or ", ".join(
            f"{job}{i} {address}" for job in ("ps", "worker")
            for i, address in enumerate(cluster.cluster[job])))
        try:
            train_every_contender(cluster, cfg, stages, progress, results)
        finally:  # the coordinator's threads would log each call to the stopped servers
            logging.getLogger("tensorflow").setLevel(logging.CRITICAL)
    if started_here:
        results["cluster"]["stopped"] = all(s.process.poll() is not None
                                            for s in cluster.servers)
    return results


# -- the report -----------------------------------------------------------------------------

def _mb(n):
    return "-" if n is None else megabytes(n)


def traffic_per_step(cfg):
    """Bytes one step moves between a worker and the parameter servers, all of them
    together: TensorFlow's lookup in a split table gathers a row for every id, repeats
    included, and the gradient goes back as one row and its (int32) id per id."""
    ids = cfg["batch"] * cfg["bag"]
    return {"ids": ids, "lookup_bytes": ids * cfg["dim"] * 4,
            "gradient_bytes": ids * (cfg["dim"] * 4 + 4)}


def report(results, command):
    """The markdown report: the setting, the throughput table, the per-ps memory table."""
    env, cfg = results["environment"], results["environment"]["config"]
    table_bytes = 4 * cfg["rows"] * cfg["dim"]
    traffic = traffic_per_step(cfg)
    load = ", ".join(f"{x:.1f}" for x in env["load_average_at_start"])
    lines = [
        f"Command: `{command}`",
        "",
        f"One machine: {env['machine']}; TensorFlow {env['tensorflow']}, {env['keras']}; "
        f"load average {load} at the start. {cfg['num_ps']} parameter servers, "
        f"{cfg['workers']} workers and the chief are processes of this machine talking gRPC "
        "over its loopback interface: no network is measured.",
        "",
        f"Model: a {cfg['rows']:,} x {cfg['dim']} float32 table ({megabytes(table_bytes)} MB) "
        f"split in {cfg['num_ps']} shards, one per parameter server, the mean of {cfg['bag']} "
        f"ids per example, a dense output. {cfg['batch']:,} examples per step: "
        f"{traffic['ids']:,} ids (Zipf(1.1), {results['data']['distinct_ids_per_step']:,.0f} "
        f"distinct on average), {megabytes(traffic['lookup_bytes'])} MB of rows looked up "
        f"and {megabytes(traffic['gradient_bytes'])} MB of gradient rows sent back. "
        f"{cfg['warmup']} warm-up steps, then at least {cfg['min_steps']} steps and "
        f"{cfg['seconds']:g} s timed, steps running on all workers at once.",
        "",
        "| optimizer | examples/s | ms per step | table per ps (MB) | optimizer state per ps "
        "(MB) | state / table |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    failed = []
    for label, r in results["runs"].items():
        if "error" in r:
            failed.append(f"{label} did not run: {r['error']}")
            lines.append(f"| {label} | did not run | | | | |")
            continue
        ps = [p for name, p in r["per_ps"].items() if name.startswith("ps")]
        state = sum(p["optimizer_bytes"] for p in ps)
        table = sum(p["table_bytes"] for p in ps)
        lines.append(f"| {label} | {r['examples_per_s']:,.0f} | {r['ms_per_step']:,.1f} | "
                     + " / ".join(_mb(p["table_bytes"]) for p in ps) + " | "
                     + " / ".join(_mb(p["optimizer_bytes"]) for p in ps) + " | "
                     + f"{state / table:.3g} |")
    lines += ["", "ms per step: the timed seconds over the steps (all workers together). "
              "Bytes per parameter server: the shapes and dtypes of the variables placed "
              "there (the optimizer's state includes its step counter and the dense layer's "
              "slots).", ""]
    memory = []
    for label, r in results["runs"].items():
        for name, p in r.get("per_ps", {}).items():
            if "rss_before_bytes" not in p:
                continue
            placed = p["table_bytes"] + p["optimizer_bytes"] + p["model_bytes"]
            growth = p["anon_after_bytes"] - p["anon_before_bytes"]
            peak = _mb(p["peak_rss_bytes"]) + (" (since start)" if p["peak_is_since_start"]
                                               else "")
            memory.append(
                f"| {label} | {name} | {_mb(p['rss_before_bytes'])} "
                f"({_mb(p['anon_before_bytes'])}) | {_mb(p['rss_after_bytes'])} "
                f"({_mb(p['anon_after_bytes'])}) | {growth / 1e6:+,.0f} | {peak} | "
                f"{_mb(placed)} |")
    if memory:
        lines += ["Each parameter server's resident memory in MB (its own data, without the "
                  "mapped libraries, in brackets): before the model was built, after the "
                  "timed steps, and its peak in between (the table's initialization "
                  "included):", "",
                  "| optimizer | ps | before | after | growth | peak | variables placed there |",
                  "|---|---|---:|---:|---:|---:|---:|", *memory, "",
                  "growth: of the figure in brackets. The optimizers ran one after the other "
                  "on the same servers, each after the previous one's variables were deleted."]
    elif results["cluster"]["started_here"]:
        lines.append("The parameter servers' resident memory: not readable here (it is read "
                     "from Linux's /proc).")
    else:
        lines.append("The parameter servers' resident memory: not measured (they are "
                     "processes this run did not start; read it on their machines).")
    lines += [""] + failed
    pids = results["cluster"]["pids"]
    if not results["cluster"]["started_here"]:
        lines.append("The cluster's servers (TF_CONFIG's) were started elsewhere: left "
                     "running.")
    elif results["cluster"]["stopped"]:
        lines.append(f"All {len(pids)} server processes stopped.")
    else:
        lines.append("Some server processes may still run: " + ", ".join(
            f"{n} (pid {p})" for n, p in pids.items()))
    return "\n".join(lines)


def save(results, out):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "ps.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    return path
