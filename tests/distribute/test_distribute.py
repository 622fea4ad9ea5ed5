"""fusedopt under tf.distribute: MirroredStrategy, MultiWorkerMirroredStrategy and
ParameterServerStrategy (real local clusters of ``python -m fusedopt.server`` processes on
127.0.0.1), plus the fusedopt.server command line.

Every strategy runs in its own subprocesses (a process can set up its devices, collectives
or cluster connection only once), each with a hard timeout and killed in teardown.
Numbers are compared with a single-device run on the same global batches.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distribute_worker.py")
CHIEF = os.path.join(HERE, "ps_chief.py")
KERAS3 = tf.__version__ >= "2.16" and not os.environ.get("TF_USE_LEGACY_KERAS")
# Keras 3's fit supports neither MultiWorkerMirroredStrategy (its train step fails on the
# PerReplica batches, with Keras's own optimizers too) nor ParameterServerStrategy: on
# TF >= 2.16 those tests run tf_keras (TF_USE_LEGACY_KERAS=1, where fusedopt.keras
# subclasses tf_keras's optimizers); on TF 2.15 Keras 2.15 itself.
LEGACY_KERAS = {"TF_USE_LEGACY_KERAS": "1"} if KERAS3 else {}


def _env(**extra):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # The package the tests import (editable install or PYTHONPATH), for the subprocesses.
    import fusedopt

    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(fusedopt.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p])
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Processes:
    """Subprocesses started by one test; all killed (process group) in teardown."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.procs = []

    def start(self, name, args, env):
        out = open(self.tmp_path / ("%s.log" % name), "w")
        proc = subprocess.Popen([sys.executable] + args, env=env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=str(self.tmp_path),
                                start_new_session=True)
        proc.log_path = self.tmp_path / ("%s.log" % name)
        proc.name = name
        self.procs.append(proc)
        return proc

    def log(self, proc, tail=4000):
        return proc.log_path.read_text(errors="replace")[-tail:]

    def wait(self, proc, timeout):
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            pytest.fail("%s timed out after %ss:\n%s" % (proc.name, timeout, self.log(proc)))
        assert rc == 0, "%s exited %s:\n%s" % (proc.name, rc, self.log(proc))

    def kill_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def procs(tmp_path):
    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.kill_all()


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


# distribute_worker.OPTIMIZERS and their rules.
RULES = {"LazyAdam": "lazy_adam", "Adamax": "adamax", "Adagrad": "adagrad",
         "RowWiseAdagrad": "row_wise_adagrad", "PartialRowWiseAdam": "partial_row_wise_adam",
         "LazyAdam:lazy_weight_decay": "lazy_adam", "LazyAdam:compact_slots": "lazy_adam"}
# What each strategy trains ({model: optimizers}, distribute_worker.plan()). The embedding
# model (an Embedding and a Dense layer: sparse and dense kernels) trains every optimizer
# under MirroredStrategy. Left out where they would repeat a code path: the dense-only model
# adds no kernel (one optimizer shows a model without IndexedSlices trains), and under
# MultiWorkerMirrored (cross-process all-reduce, the same update code) the rules whose
# slots are like another's: Adamax and Adagrad (full slots: LazyAdam), RowWiseAdagrad (a
# per-row slot: PartialRowWiseAdam has one beside a full one).
MIRRORED = {"embedding": sorted(RULES), "dense": ["LazyAdam"]}
MULTI_WORKER = {"embedding": ["LazyAdam", "PartialRowWiseAdam", "LazyAdam:lazy_weight_decay",
                              "LazyAdam:compact_slots"]}


def worker_args(plan):
    """distribute_worker.py's MODELS argument for {model: [optimizer names]}."""
    return [",".join("%s=%s" % (kind, "+".join(opts)) for kind, opts in plan.items())]


def check_equal_to_single_device(result, plan):
    assert set(result["runs"]) == {"%s/%s" % (k, o) for k, opts in plan.items() for o in opts}
    for key, run in result["runs"].items():
        kind, opt = key.split("/")
        rule = RULES[opt]
        # The fused kernels ran (sparse one for the embedding: IndexedSlices arrived).
        expected = ["%s/dense" % rule] + (["%s/sparse" % rule] if kind == "embedding" else [])
        assert run["kernels"] == expected, key
        if opt.endswith(":compact_slots"):  # the ops got 16-bit slots
            want = "float16" if "bfloat16_refused" in result else "bfloat16"
            assert run["slot_dtypes"] == [want], (key, run["slot_dtypes"])
        dist, local = run["distributed"], run["local"]
        assert len(dist) == len(local)
        assert max_diff(dist, local) < 2e-5, (key, max_diff(dist, local))
        np.testing.assert_allclose(run["distributed_loss"], run["local_loss"], rtol=1e-5)
        # and it trained: weights moved from the initial ones (same seed in both runs)
        if kind == "embedding":
            table = np.asarray(dist[0])
            # ids are clipped to VOCAB // 2: the rows above were never looked up; a lazy
            # sparse update leaves them exactly as initialised (a densified gradient
            # would move them through the moments under Adam/Adamax).
            init = np.random.default_rng(11).normal(scale=0.5, size=table.shape)
            np.testing.assert_array_equal(table[21:], init[21:].astype(np.float32))
            assert np.max(np.abs(table[:21] - init[:21].astype(np.float32))) > 1e-3


@pytest.mark.slow
def test_mirrored_strategy_fit_equals_single_device(procs, tmp_path):
    out = tmp_path / "mirrored.json"
    p = procs.start("mirrored", [WORKER, "mirrored", str(out)] + worker_args(MIRRORED), _env())
    procs.wait(p, timeout=240)
    result = json.loads(out.read_text())
    assert result["replicas"] == 2
    check_equal_to_single_device(result, MIRRORED)


@pytest.mark.parametrize("mode", [
    "multiworker",  # Keras fit (tf_keras on TF >= 2.16)
    pytest.param("multiworker_loop", marks=pytest.mark.skipif(
        not KERAS3, reason="custom-loop variant for Keras 3 (its fit lacks MWMS)"))])
@pytest.mark.slow
def test_multi_worker_mirrored_equals_single_process(procs, tmp_path, mode):
    ports = free_ports(2)
    cluster = {"worker": ["127.0.0.1:%d" % p for p in ports]}
    env = LEGACY_KERAS if mode == "multiworker" else {}
    workers = []
    for i in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        out = tmp_path / ("mw%d.json" % i)
        # embedding model only (it has a Dense layer too: dense and sparse kernels)
        workers.append((procs.start("worker%d" % i, [WORKER, mode, str(out)] +
                                    worker_args(MULTI_WORKER), _env(TF_CONFIG=tf_config, **env)),
                        out))
    for proc, _ in workers:
        procs.wait(proc, timeout=240)
    results = [json.loads(out.read_text()) for _, out in workers]
    for result in results:
        assert result["replicas"] == 2
        # bfloat16 slots refused clearly (TF's broadcast of new variables has no bfloat16
        # kernel): the compact run has float16 slots
        assert "use slot_dtype='float16' there" in result["bfloat16_refused"]
        check_equal_to_single_device(result, MULTI_WORKER)
    # both workers hold the same (mirrored) weights
    for key in results[0]["runs"]:
        assert max_diff(results[0]["runs"][key]["distributed"],
                        results[1]["runs"][key]["distributed"]) == 0.0


# --- ParameterServerStrategy: real cluster of fusedopt.server processes -------------------

PLAIN_SERVER = """if 1:
    import json, os, sys
    import tensorflow as tf
    cluster, job, index, ready = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index)
    with open(ready + ".tmp", "w") as f:
        json.dump(dict(job=job, task=index, target=server.target, pid=os.getpid()), f)
    os.replace(ready + ".tmp", ready)
    server.join()
"""


def start_cluster(procs, tmp_path, num_ps=2, num_workers=2, server_args=(), plain_ps=False):
    """ps and worker tasks as `python -m fusedopt.server` processes; waits until serving.
    plain_ps: the ps tasks are plain tf.distribute.Server processes (no op library)."""
    ports = free_ports(num_ps + num_workers + 1)
    addr = ["127.0.0.1:%d" % p for p in ports]
    cluster = {"ps": addr[:num_ps], "worker": addr[num_ps:num_ps + num_workers],
               "chief": addr[-1:]}
    servers = {}
    for job, n in (("ps", num_ps), ("worker", num_workers)):
        for i in range(n):
            ready = tmp_path / ("%s%d.ready" % (job, i))
            if plain_ps and job == "ps":
                args = ["-c", PLAIN_SERVER, json.dumps(cluster), job, str(i), str(ready)]
            else:
                args = ["-m", "fusedopt.server", "--cluster_spec", json.dumps(cluster),
                        "--job_name", job, "--task_index", str(i), "--ready_file",
                        str(ready)] + list(server_args)
            servers[(job, i)] = (procs.start("%s%d" % (job, i), args, _env()), ready)
    deadline = time.time() + 150
    for (job, i), (proc, ready) in servers.items():
        while not ready.exists():
            assert proc.poll() is None, "%s%d died:\n%s" % (job, i, procs.log(proc))
            assert time.time() < deadline, "%s%d not serving:\n%s" % (job, i, procs.log(proc))
            time.sleep(0.2)
        info = json.loads(ready.read_text())
        assert info["job"] == job and info["task"] == i and info["pid"] == proc.pid
        assert info["target"] == "grpc://" + cluster[job][i]
    return cluster, {k: p for k, (p, _) in servers.items()}


# The classes trained on the partitioned table: (the optimizer's variable scope, the
# table's slot names); a per-row rule's slots are split along the table's rows too.
# ":bf16": bfloat16 slots (compact slots, split the same way).
PS_OPTIMIZERS = {"LazyAdam": ("Adam", "mv"),
                 "RowWiseAdagrad:bf16": ("row_wise_adagrad", ["accumulator"])}


@pytest.mark.parametrize("optimizer", sorted(PS_OPTIMIZERS))
@pytest.mark.slow
def test_parameter_server_strategy_on_partitioned_embedding(procs, tmp_path, optimizer):
    cluster, servers = start_cluster(procs, tmp_path, server_args=["--log_device_placement"])
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    out = tmp_path / "chief.json"
    victim = servers[("worker", 1)]
    chief = procs.start("chief", [CHIEF, str(out), "--kill_pid", str(victim.pid),
                                  "--ckpt", str(tmp_path / "ckpt"), "--optimizer", optimizer],
                        _env(TF_CONFIG=tf_config, **LEGACY_KERAS))
    procs.wait(chief, timeout=300)
    r = json.loads(out.read_text())
    scope, slots = PS_OPTIMIZERS[optimizer]
    class_name, _, variant = optimizer.partition(":")
    sparse_op = "FusedOpt>ResourceSparseApply" + class_name
    ps_devices = ["/job:ps/replica:0/task:%d/device:CPU:0" % i for i in range(2)]

    # The embedding table is split across both parameter servers, and so are its slots.
    assert r["embedding_type"] == "ShardedVariable"
    assert r["embedding_devices"] == ps_devices
    emb_slots = {tuple(s) for s in r["slot_devices"] if "/emb/" in s[0]}
    assert emb_slots == {("%s/%s/emb/embeddings/part_%d:0" % (scope, slot, i), ps_devices[i])
                         for slot in slots for i in range(2)}, r["slot_devices"]
    per_row = class_name != "LazyAdam"  # the row-wise rules' slot: one value per row
    for name, _ in emb_slots:  # each shard's slot covers that shard's 20 rows
        assert r["slot_shapes"][name] == ([20] if per_row else [20, 4]), r["slot_shapes"]
        assert r["slot_dtypes"][name] == ("bfloat16" if variant == "bf16" else "float32")

    # Sync phase (one step at a time) equals the same training without any strategy.
    assert r["sync_iterations"] == 6
    np.testing.assert_allclose(r["sync_loss"], r["local_loss"], rtol=1e-5)
    assert max_diff(r["sync_weights"], r["local_weights"]) < 2e-5
    table = np.asarray(r["sync_weights"][0])
    init = np.random.default_rng(11).normal(scale=0.5, size=table.shape).astype(np.float32)
    np.testing.assert_array_equal(table[21:], init[21:])  # lazy: unused rows untouched
    assert np.max(np.abs(table[:21] - init[:21])) > 1e-3

    # The fused sparse update of each shard was placed on that shard's parameter server.
    placed = {tuple(p) for p in r["fused_op_devices"]}
    for dev in ps_devices:
        assert (sparse_op, dev) in placed, placed
    assert all(d.startswith("/job:ps/") for _, d in placed), placed
    # ... and in the cluster's own placement logs (fusedopt.server --log_device_placement):
    # the worker that ran the coordinator's steps placed it on both parameter servers, and
    # each parameter server placed (and so ran) the update of its own shard.
    logged = re.compile(r"\((FusedOpt>\w+)\) placed on: (\S+)")
    worker_log = set(logged.findall(servers[("worker", 0)].log_path.read_text()))
    for dev in ps_devices:
        assert (sparse_op, dev) in worker_log, worker_log
    assert all(d.startswith("/job:ps/") for _, d in worker_log), worker_log
    for i, dev in enumerate(ps_devices):
        ps_log = set(logged.findall(servers[("ps", i)].log_path.read_text()))
        assert (sparse_op, dev) in ps_log, ps_log
        assert {d for _, d in ps_log} == {dev}, ps_log

    # A worker killed mid-training: the remaining worker ran every scheduled step.
    assert r["killed"] == victim.pid
    assert victim.wait(timeout=10) == -signal.SIGKILL
    assert 24 <= r["async_steps_run"] <= 25, r["async_steps_run"]
    # The parameter servers' state is intact: checkpoint restores exactly and trains on.
    assert r["saved_finite"] and r["restored_equal"]
    assert r["restored_iterations"] >= 30
    assert r["continued_iterations"] == r["restored_iterations"] + 4
    assert r["continued_finite"] and all(np.isfinite(r["continued_loss"]))
    for key in (("ps", 0), ("ps", 1), ("worker", 0)):
        assert servers[key].poll() is None, "%s%d died" % key


@pytest.mark.slow
def test_parameter_servers_without_the_op_library_fail_clearly(procs, tmp_path):
    """Negative control: the update ops really run on the ps tasks, so plain TF servers
    there (no fusedopt.server) make the first step fail, naming the missing op."""
    cluster, servers = start_cluster(procs, tmp_path, num_ps=1, num_workers=1, plain_ps=True)
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    out = tmp_path / "chief.json"
    chief = procs.start("chief", [CHIEF, str(out), "--expect_failure", "--ckpt",
                                  str(tmp_path / "ckpt")],
                        _env(TF_CONFIG=tf_config, **LEGACY_KERAS))
    procs.wait(chief, timeout=180)
    error = json.loads(out.read_text())["error"]
    assert error is not None
    assert "FusedOpt>" in error and "not registered" in error, error
    assert "/job:ps/replica:0/task:0" in error, error  # where it was missing


# --- Estimator (TF 2.15): RunConfig(train_distribute=MirroredStrategy) over 2 CPUs -------

def test_estimator_run_config_mirrored_equals_single_device(procs, tmp_path):
    pytest.importorskip("tensorflow_estimator")
    if not hasattr(tf, "estimator") or tf.__version__ >= "2.16":
        pytest.skip("tf.estimator exists up to TF 2.15")
    out = tmp_path / "estimator.json"
    p = procs.start("estimator", [WORKER, "estimator", str(out), str(tmp_path)], _env())
    procs.wait(p, timeout=240)
    r = json.loads(out.read_text())
    assert r["distributed"]["global_step"] == r["local"]["global_step"] == 12
    # the fused ops updated both mirrored copies of each variable (sparse op: IndexedSlices)
    assert r["kernels"] == ["resource_apply_adagrad"] * 2 + ["resource_sparse_apply_lazy_adam"] * 2
    # without a strategy the step's dense updates go to one group op (here: w alone)
    assert r["local_kernels"] == ["resource_group_apply_adagrad",
                                  "resource_sparse_apply_lazy_adam"]
    for name in ("emb", "w"):
        assert max_diff([r["distributed"][name]], [r["local"][name]]) < 2e-5, name
    table = np.asarray(r["distributed"]["emb"])
    init = np.random.default_rng(11).normal(scale=0.5, size=table.shape).astype(np.float32)
    np.testing.assert_array_equal(table[21:], init[21:])
    assert np.max(np.abs(table[:21] - init[:21])) > 1e-3


# --- python -m fusedopt.server: flags ------------------------------------------------------

def test_server_flags_and_tf_config_fallback():
    from fusedopt import server

    cluster = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    args = server.parse_args(["--cluster_spec", json.dumps(cluster), "--job_name", "worker",
                              "--task_index", "1"])
    assert server.resolve(args, environ={}) == (cluster, "worker", 1)
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}})
    assert server.resolve(server.parse_args([]), {"TF_CONFIG": tf_config}) == (cluster, "ps", 0)
    # flags win over TF_CONFIG
    args = server.parse_args(["--job_name", "worker", "--task_index", "0"])
    assert server.resolve(args, {"TF_CONFIG": tf_config}) == (cluster, "worker", 0)
    env = {"TF_CPP_VMODULE": "eager=2", "TF_CPP_MIN_LOG_LEVEL": "2"}
    server.enable_placement_log(env)
    assert env == {"TF_CPP_VMODULE": "eager=2,placer=1", "TF_CPP_MIN_LOG_LEVEL": "0"}
    for argv, env, message in [
            ([], {}, "no cluster"),
            (["--cluster_spec", "{bad"], {}, "not valid JSON"),
            (["--cluster_spec", json.dumps(cluster)], {}, "--job_name"),
            (["--cluster_spec", json.dumps(cluster), "--job_name", "chief", "--task_index", "0"],
             {}, "not in the cluster"),
            (["--cluster_spec", json.dumps(cluster), "--job_name", "ps", "--task_index", "1"],
             {}, "out of range"),
            ([], {"TF_CONFIG": "{"}, "TF_CONFIG is not valid JSON")]:
        with pytest.raises(ValueError, match=message):
            server.resolve(server.parse_args(argv), env)


def test_server_command_line_rejects_bad_flags():
    proc = subprocess.run([sys.executable, "-m", "fusedopt.server", "--job_name", "ps",
                           "--task_index", "0"], env=_env(TF_CONFIG=""),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "fusedopt.server: no cluster" in proc.stderr


_CLUSTER = {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]}

# Each bad configuration of issue 16: exit status 2 and one line, no traceback.
BAD_CONFIGS = [  # (id, TF_CONFIG, extra argv, message)
    ("tf_config_list", [1, 2], [], "TF_CONFIG must be a JSON object, got list"),
    ("task_string", {"cluster": _CLUSTER, "task": "ps"}, [],
     'TF_CONFIG["task"] must be an object'),
    ("job_string", {"cluster": {"ps": "127.0.0.1:2222"}, "task": {"type": "ps", "index": 0}},
     [], "job 'ps' must be a list of \"host:port\""),
    ("host_without_port", {"cluster": {"ps": ["127.0.0.1"]}, "task": {"type": "ps", "index": 0}},
     [], "must be \"host:port\" with a port in 1..65535, got '127.0.0.1'"),
    ("port_above_65535", {"cluster": {"ps": ["127.0.0.1:70000"]},
                          "task": {"type": "ps", "index": 0}},
     [], "got '127.0.0.1:70000'"),
    ("port_zero", {"cluster": {"ps": ["127.0.0.1:0"]}, "task": {"type": "ps", "index": 0}},
     [], "got '127.0.0.1:0'"),
    ("non_integer_index", {"cluster": _CLUSTER, "task": {"type": "worker", "index": 1.5}}, [],
     'TF_CONFIG["task"]["index"] must be an integer, got 1.5'),
    ("bool_index", {"cluster": _CLUSTER, "task": {"type": "worker", "index": True}}, [],
     "must be an integer, got True"),
    ("cluster_list", {"cluster": ["127.0.0.1:2222"], "task": {"type": "ps", "index": 0}}, [],
     'TF_CONFIG["cluster"] must be a non-empty object'),
    ("job_not_string", {"cluster": _CLUSTER, "task": {"type": 7, "index": 0}}, [],
     "the job name must be a string, got 7"),
    ("cluster_spec_flag_list", None, ["--cluster_spec", "[1]", "--job_name", "ps",
                                      "--task_index", "0"],
     "--cluster_spec must be a JSON object, got list"),
    ("negative_index_flag", None, ["--cluster_spec", json.dumps(_CLUSTER), "--job_name", "ps",
                                   "--task_index", "-1"], "task_index -1 out of range"),
    ("ready_file_dir_missing", None, ["--cluster_spec", json.dumps(_CLUSTER), "--job_name",
                                      "ps", "--task_index", "0", "--ready_file",
                                      "/nonexistent/dir/ready.json"], "no such directory"),
]
# Job names TensorFlow cannot hold (its rule: a letter, then letters, digits or underscores)
# end in its check failure (SIGABRT) once the server starts: refused first, as bad flags.
BAD_JOB_NAMES = ["ps/evil", "w:1", "a b", "", "ps-1", "ps.0", "1ps", "_ps", "ps\n",
                 "p\u00e9", "ps!", "job/replica:0"]
BAD_CONFIGS += [("job_name_%d_tf_config" % i, {"cluster": {name: ["127.0.0.1:2222"]},
                                                "task": {"type": name, "index": 0}}, [],
                 'TF_CONFIG["cluster"]: job %r is not a job name TensorFlow accepts' % name)
                for i, name in enumerate(BAD_JOB_NAMES)]
BAD_CONFIGS += [
    ("job_name_flags", None, ["--cluster_spec", json.dumps({"w:1": ["127.0.0.1:2222"]}),
                              "--job_name", "w:1", "--task_index", "0"],
     "--cluster_spec: job 'w:1' is not a job name TensorFlow accepts"),
    ("job_name_other_job", {"cluster": {"ps": ["127.0.0.1:2222"], "ps/evil": ["127.0.0.1:2223"]},
                            "task": {"type": "ps", "index": 0}}, [],
     "job 'ps/evil' is not a job name TensorFlow accepts"),
    ("job_name_flag_only", {"cluster": _CLUSTER}, ["--job_name", "ps/evil", "--task_index", "0"],
     "--job_name 'ps/evil' is not a job name TensorFlow accepts"),
    ("job_name_task_type_only", {"cluster": _CLUSTER, "task": {"type": "a b", "index": 0}}, [],
     'TF_CONFIG["task"]["type"] \'a b\' is not a job name TensorFlow accepts'),
]


@pytest.mark.parametrize("tf_config,argv,message", [c[1:] for c in BAD_CONFIGS],
                         ids=[c[0] for c in BAD_CONFIGS])
def test_server_bad_configuration_exits_2_with_one_line(tf_config, argv, message):
    env = _env(TF_CONFIG=json.dumps(tf_config) if tf_config is not None else "")
    proc = subprocess.run([sys.executable, "-m", "fusedopt.server", *argv], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fusedopt.server: "), proc.stderr[-3000:]
    assert message in lines[0]


def _one_server_line(proc):
    """The one line a refused fusedopt.server wrote (stderr), checked to be alone."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fusedopt.server: "), proc.stderr[-3000:]
    return lines[0]


def _ps_flags(port, *extra):
    return ["--cluster_spec", json.dumps({"ps": ["127.0.0.1:%d" % port]}), "--job_name", "ps",
            "--task_index", "0", *extra]


@pytest.mark.parametrize("kind", ["directory", "parent_is_a_file", "in_proc"])
def test_server_unwritable_ready_file_exits_2_before_serving(tmp_path, kind):
    """A --ready_file that cannot be written (even by root) is refused before the server
    starts: one line, exit 2, nothing left running or written."""
    ready = {"directory": tmp_path / "ready", "parent_is_a_file": tmp_path / "file" / "ready",
             "in_proc": "/proc/fusedopt-ready-%d.json" % os.getpid()}[kind]
    problem = {"directory": "is a directory",
               "parent_is_a_file": "%s is not a directory" % (tmp_path / "file"),
               "in_proc": "cannot write in /proc ("}[kind]
    if kind == "directory":
        ready.mkdir()
    elif kind == "parent_is_a_file":
        (tmp_path / "file").write_text("")
    proc = subprocess.run([sys.executable, "-m", "fusedopt.server",
                           *_ps_flags(free_ports(1)[0], "--ready_file", str(ready))],
                          env=_env(TF_CONFIG=""), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _one_server_line(proc)
    assert line.startswith("fusedopt.server: --ready_file %s: %s" % (ready, problem)), line
    assert sorted(os.listdir(tmp_path)) == {"directory": ["ready"], "parent_is_a_file": ["file"],
                                            "in_proc": []}[kind]  # nothing written


SERVER_LOSING_ITS_READY_DIRECTORY = """if 1:
    import os, sys
    from fusedopt import server
    start, ready_dir = server.start, sys.argv[1]

    def start_then_lose_the_directory(*args):
        started = start(*args)
        os.rmdir(ready_dir)  # checked writable, then gone once serving: a file in its place
        open(ready_dir, "w").close()
        return started

    server.start = start_then_lose_the_directory
    sys.exit(server.main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_server_ready_file_failing_once_serving_stops_the_server(tmp_path):
    """The --ready_file directory was writable when checked and is gone once the server
    serves: one line, exit 2, the process ends and its port is free again."""
    ready_dir = tmp_path / "ready_dir"
    ready_dir.mkdir()
    port = free_ports(1)[0]
    proc = subprocess.run([sys.executable, "-c", SERVER_LOSING_ITS_READY_DIRECTORY,
                           str(ready_dir), *_ps_flags(port, "--ready_file",
                                                      str(ready_dir / "ready.json"))],
                          env=_env(TF_CONFIG=""), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _one_server_line(proc)
    assert line.startswith("fusedopt.server: --ready_file %s: cannot write it ("
                           % (ready_dir / "ready.json")), line
    assert line.endswith("; stopping"), line
    assert "serving" not in proc.stdout, proc.stdout
    with socket.socket() as free:  # nothing listens on the port any more (a [::] socket
        free.bind(("0.0.0.0", port))  # taking IPv4 too would refuse this bind)
        free.listen()


def _listening_on(port):
    """The local addresses (hex, as /proc/net/tcp{,6} print them) of every socket listening
    on ``port`` in this network namespace."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            with open(table) as f:
                for row in f.read().splitlines()[1:]:
                    local, state = row.split()[1], row.split()[3]
                    if state == "0A" and local.endswith(":%04X" % port):
                        found.append(local.rsplit(":", 1)[0])
    return found


def _other_local_ipv4_addresses():
    """This machine's own IPv4 addresses outside 127/8 (Linux's /proc/net/fib_trie)."""
    if not os.path.exists("/proc/net/fib_trie"):
        return []
    with open("/proc/net/fib_trie") as f:
        rows = f.read().splitlines()
    return sorted({rows[i - 1].split()[-1] for i, row in enumerate(rows)
                   if row.split() == ["/32", "host", "LOCAL"]
                   and not rows[i - 1].split()[-1].startswith("127.")})


@pytest.mark.slow
def test_server_says_so_when_it_listens_on_every_interface(procs, tmp_path):
    """The cluster spec names 127.0.0.1; TensorFlow's server binds its port on every
    interface (0.0.0.0 / [::], hard-coded in TF). The one-line note on stderr must be there
    exactly when that is true of the listening socket (read here from /proc/net)."""
    port = free_ports(1)[0]
    out, err = open(tmp_path / "out", "w"), open(tmp_path / "err", "w")
    proc = subprocess.Popen([sys.executable, "-m", "fusedopt.server", *_ps_flags(port)],
                            env=_env(TF_CONFIG=""), stdout=out, stderr=err,
                            start_new_session=True)
    procs.procs.append(proc)  # killed in teardown
    deadline = time.time() + 150
    while "fusedopt.server: serving" not in (tmp_path / "out").read_text():
        assert proc.poll() is None, (tmp_path / "err").read_text()[-3000:]
        assert time.time() < deadline, "not serving:\n" + (tmp_path / "err").read_text()[-3000:]
        time.sleep(0.2)
    listening = _listening_on(port)
    assert listening, "no socket listens on port %d" % port
    everywhere = any(set(address) == {"0"} for address in listening)  # 0.0.0.0 or [::]
    if everywhere:  # reachable through this machine's other IPv4 addresses too
        for address in _other_local_ipv4_addresses():
            socket.create_connection((address, port), timeout=10).close()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    lines = [line for line in (tmp_path / "err").read_text().splitlines()
             if line.startswith("fusedopt.server")]
    if not everywhere:
        assert lines == [], lines
        return
    assert len(lines) == 1, lines
    assert lines[0].startswith("fusedopt.server: note: TensorFlow's gRPC server listens on "
                               "every network interface of this machine (address "), lines
    assert "port %d), not only on 127.0.0.1 as the cluster spec says" % port in lines[0]
    assert "unauthenticated" in lines[0] and "keep the port private" in lines[0]


def test_server_reads_its_listening_addresses_and_notes_only_wildcards():
    from fusedopt import server

    for family, host in [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0"),
                         (socket.AF_INET6, "::1"), (socket.AF_INET6, "::")]:
        with socket.socket(family) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
            assert server.listening_addresses(port) is None  # bound, not listening
            s.listen()
            assert server.listening_addresses(port) == [host]
            note = server.exposure_note("127.0.0.1", port, [host])
            if host in ("127.0.0.1", "::1"):
                assert note is None
            else:
                assert "(address %s, port %d), not only on 127.0.0.1" % (
                    "[::]" if host == "::" else host, port) in note
    assert "address 0.0.0.0 / [::], port 7)" in server.exposure_note("h", 7, ["0.0.0.0", "::"])
    # where /proc cannot tell: TensorFlow's own address is assumed
    assert "address 0.0.0.0, port 7), not only on h " in server.exposure_note("h", 7, None)
    assert "not only" not in server.exposure_note("0.0.0.0", 7, ["::"])


def test_server_port_in_use_exits_3_with_one_line():
    with socket.socket() as taken:  # bound and listening: gRPC cannot bind it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = "127.0.0.1:%d" % taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "fusedopt.server", "--cluster_spec",
             json.dumps({"ps": [address]}), "--job_name", "ps", "--task_index", "0"],
            env=_env(TF_CONFIG="", TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True, text=True,
            timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fusedopt.server")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("fusedopt.server: cannot serve /job:ps/task:0 at " + address)
    assert "port in use" in lines[0]
