"""``python -m fusedopt.bench --ps``: a parameter-server cluster on this machine trains with
fusedopt's row-wise Adagrad (bfloat16 slots), LazyAdam and Keras's Adam; the report's
figures come from the variables placed on each parameter server, and every process the run
started is gone at its end, also when it is interrupted (Ctrl-C). Its flags.

The runs are real (a cluster of ``python -m fusedopt.server`` processes) at tiny sizes
(``--quick``: a 10,000-row table, a few steps); they run where Keras 2 does (tf_keras on
TensorFlow 2.16 and later, TensorFlow 2.15).
"""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from command_line import refused_in_one_line

TF_MINOR = tuple(int(x) for x in tf.__version__.split(".")[:2])
needs_keras_2 = pytest.mark.skipif(
    TF_MINOR >= (2, 16) and importlib.util.find_spec("tf_keras") is None,
    reason="needs tf_keras (Keras 3 does not support ParameterServerStrategy)")

FUSED = ("fusedopt.keras.RowWiseAdagrad, bfloat16 slots", "fusedopt.keras.LazyAdam")

# The benchmark harness: one TF stage of CI runs it (tools/test_all.sh); training with
# parameter servers itself is tested under both (test_distribute.py, the example's test).
pytestmark = pytest.mark.once


def _env():
    """This environment, with the fusedopt these tests import first on PYTHONPATH; the bench
    chooses its Keras itself."""
    import fusedopt

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1")
    env.pop("TF_USE_LEGACY_KERAS", None)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fusedopt.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _bench(*args):
    return [sys.executable, "-m", "fusedopt.bench", "--ps", "--quick", *args]


def _gone(pid):
    """True when no process has this pid (or only a zombie nobody will reap: none here,
    as the bench waits for each server it stops)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def _server_pids(stdout):
    """{"ps0": pid, ...} from the first stage's line."""
    return {name: int(pid) for name, pid in
            re.findall(r"(\w+\d+) 127\.0\.0\.1:\d+ \(pid (\d+)\)", stdout)}


@needs_keras_2
@pytest.mark.slow
def test_ps_bench_trains_every_optimizer_and_reports_bytes_per_parameter_server(tmp_path):
    proc = subprocess.run(_bench("--out", str(tmp_path), "--markdown",
                                 str(tmp_path / "report.md")),
                          env=_env(), cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=300, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-5000:]
    results = json.loads((tmp_path / "ps.json").read_text())
    cfg = results["environment"]["config"]
    rows, dim, num_ps = cfg["rows"], cfg["dim"], cfg["num_ps"]
    assert (rows, num_ps, cfg["workers"]) == (10_000, 2, 2)
    ps_tasks = ["ps%d" % i for i in range(num_ps)]

    labels = list(results["runs"])
    assert labels[:2] == list(FUSED) and len(labels) == 3, labels
    assert re.fullmatch(r"Keras Adam \((tf_keras|keras)\.optimizers\.Adam\)", labels[2]), labels
    for label, run in results["runs"].items():
        assert "error" not in run, (label, run.get("error"))  # Keras's Adam ran too
        assert run["steps"] >= cfg["min_steps"] and run["examples_per_s"] > 0, run
        assert np.isfinite(run["loss_last"]), run

        # Every variable's bytes are its shape times its dtype's size, and each parameter
        # server's figures are the sums of the variables placed there.
        sums = {}
        for v in run["variables"]:
            assert v["bytes"] == int(np.prod(v["shape"])) * tf.as_dtype(v["dtype"]).size, v
            assert v["task"] in ps_tasks, v  # every variable on a parameter server
            task = sums.setdefault(v["task"], {"table_bytes": 0, "optimizer_bytes": 0,
                                               "model_bytes": 0})
            task[v["kind"] + "_bytes"] += v["bytes"]
        per_ps = {name: {k: p[k] for k in ("table_bytes", "optimizer_bytes", "model_bytes")}
                  for name, p in run["per_ps"].items()}
        assert per_ps == sums, (label, per_ps, sums)

        # The table: one float32 shard per parameter server, all its rows.
        table = [v for v in run["variables"] if v["kind"] == "table"]
        assert sorted(v["task"] for v in table) == ps_tasks, table
        assert sum(v["shape"][0] for v in table) == rows
        assert {v["dtype"] for v in table} == {"float32"}
        assert all(p["table_bytes"] == rows // num_ps * dim * 4 for p in run["per_ps"].values())

        # The table's optimizer state, shard by shard beside it: one bfloat16 per row
        # (row-wise Adagrad) or two float32 per parameter (Adam's m and v).
        state = [v for v in run["variables"] if v["kind"] == "optimizer" and "table" in v["name"]]
        assert sorted({v["task"] for v in state}) == ps_tasks, state
        if label == FUSED[0]:
            assert {v["dtype"] for v in state} == {"bfloat16"}, state
            assert sum(v["bytes"] for v in state) == rows * 2
        else:
            assert {v["dtype"] for v in state} == {"float32"}, state
            assert sum(v["bytes"] for v in state) == 2 * rows * dim * 4

        # Each parameter server's memory was read (Linux).
        if sys.platform.startswith("linux"):
            for name in ps_tasks:
                p = run["per_ps"][name]
                assert 0 < p["anon_before_bytes"] <= p["rss_before_bytes"] <= p["peak_rss_bytes"]

    # The report names every optimizer and its figures; nothing of the run is left.
    report = (tmp_path / "report.md").read_text()
    for label in labels:
        assert report.count("| %s |" % label) == 1 + num_ps, label
    assert "not a network" in report or "no network is measured" in report
    assert "All 4 server processes stopped." in report
    pids = results["cluster"]["pids"]
    assert sorted(pids) == ps_tasks + ["worker0", "worker1"]
    assert pids == _server_pids(proc.stdout)
    assert results["cluster"]["stopped"] is True
    for name, pid in list(pids.items()) + [("chief", results["cluster"]["chief_pid"])]:
        assert _gone(pid), "%s (pid %d) is still running" % (name, pid)


@needs_keras_2
@pytest.mark.slow
def test_ps_bench_interrupted_stops_every_server(tmp_path):
    """Ctrl-C (SIGINT to the bench) during training: every server process it started ends,
    and so does the bench, with status 130 and one line saying so."""
    out, err = open(tmp_path / "out", "w"), open(tmp_path / "err", "w")
    proc = subprocess.Popen(_bench("--seconds", "600", "--out", str(tmp_path)), env=_env(),
                            cwd=str(tmp_path), stdout=out, stderr=err, start_new_session=True)
    try:
        deadline = time.time() + 240
        # Interrupted once training runs (its first timed steps are under way).
        while "[3/5] Training" not in (tmp_path / "out").read_text():
            assert proc.poll() is None, (tmp_path / "err").read_text()[-5000:]
            assert time.time() < deadline, (tmp_path / "out").read_text()
            time.sleep(0.2)
        time.sleep(3)
        pids = _server_pids((tmp_path / "out").read_text())
        assert len(pids) == 4, (tmp_path / "out").read_text()
        assert not any(_gone(pid) for pid in pids.values())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, (tmp_path / "err").read_text()[-5000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = (tmp_path / "err").read_text()
    assert "interrupted; every server process it started is stopped" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-5000:]
    for name, pid in pids.items():
        assert _gone(pid), "%s (pid %d) is still running" % (name, pid)


@needs_keras_2
@pytest.mark.slow
def test_ps_bench_on_a_cluster_of_tf_config_leaves_it_running(tmp_path):
    """--use-tf-config: the servers are someone else's (here started by the test, as on a
    real cluster's hosts); the bench trains on them as their chief and leaves them be."""
    from fusedopt.local_cluster import LocalCluster

    with LocalCluster(num_ps=2, num_workers=2, env=_env()) as cluster:
        env = dict(_env(), TF_CONFIG=cluster.tf_config("chief"))
        proc = subprocess.run(_bench("--use-tf-config", "--out", str(tmp_path)), env=env,
                              cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
                              start_new_session=True)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        assert all(s.process.poll() is None for s in cluster.servers)  # still serving
    assert "Using the cluster of TF_CONFIG: 2 parameter servers, 2 workers" in proc.stdout
    results = json.loads((tmp_path / "ps.json").read_text())
    assert results["cluster"]["started_here"] is False and results["cluster"]["pids"] == {}
    assert results["cluster"]["spec"] == cluster.cluster
    assert len(results["runs"]) == 3
    for label, run in results["runs"].items():
        assert "error" not in run, (label, run["error"])
        assert sorted(run["per_ps"]) == ["ps0", "ps1"]
        assert all("rss_before_bytes" not in p for p in run["per_ps"].values())
        assert sum(p["table_bytes"] for p in run["per_ps"].values()) == 10_000 * 8 * 4
    assert "not measured (they are processes this run did not start" in proc.stdout
    assert "were started elsewhere: left running." in proc.stdout


@needs_keras_2
@pytest.mark.slow
def test_ps_bench_whose_cluster_cannot_start_says_why_in_one_line(tmp_path):
    """The servers cannot load the op library: the bench stops every server it started and
    says which one failed and why, in one line, exit status 1."""
    env = dict(_env(), FUSEDOPT_OPS_LIBRARY=str(tmp_path / "missing.so"))
    proc = subprocess.run(_bench("--num-ps", "1", "--out", str(tmp_path)), env=env,
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
                          start_new_session=True)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-5000:]
    assert lines[0].startswith("python -m fusedopt.bench: the parameter-server run failed "
                               "(every server process it started is stopped): "
                               "ps0 (python -m fusedopt.server) exited with status 1 before "
                               "serving: fusedopt.server: cannot load the op library"), lines[0]


def test_ps_flags_refused_in_one_line(capsys):
    from fusedopt.bench import cli

    for argv, message in [
            (["--ps", "--headline"], "--ps is a run of its own; --headline goes with the"),
            (["--ps", "--scenarios", "dense"], "--scenarios goes with the other runs"),
            (["--ps", "--optimizer", "adagrad", "--aims"], "--aims, --optimizer go with"),
            (["--num-ps", "2"], "--num-ps goes with the parameter-server run: add --ps"),
            (["--seconds", "5", "--use-tf-config"],
             "--seconds, --use-tf-config go with the parameter-server run: add --ps"),
            (["--ps", "--use-tf-config", "--num-ps", "3"], "--num-ps: with --use-tf-config"),
            (["--ps", "--num-ps", "9"], "at most 8 parameter servers"),
            (["--ps", "--num-ps", "0"], "must be at least 1"),
            (["--ps", "--seconds", "-1"], "must be 0 or more"),
            (["--ps", "--rows", "100000000000"], "needs about")]:
        err = refused_in_one_line(capsys, cli.parse_args, argv)
        assert message in err, (argv, err)


def test_use_tf_config_needs_a_chief_of_a_cluster_with_ps_and_workers(monkeypatch, capsys):
    from fusedopt.bench import cli, ps

    cluster = {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"], "chief": ["10.0.0.3:2222"]}
    for tf_config, message in [
            (None, "TF_CONFIG is not set"),
            ({"cluster": cluster, "task": {"type": "worker", "index": 0}},
             "TF_CONFIG names this task worker 0; the benchmark runs as the chief"),
            ({"cluster": {"chief": cluster["chief"]}, "task": {"type": "chief", "index": 0}},
             "TF_CONFIG's cluster has no ps and no worker tasks"),
            ({"cluster": cluster, "task": {"type": "chief", "index": 1}},
             "task_index 1 out of range for job 'chief'")]:
        if tf_config is None:
            monkeypatch.delenv("TF_CONFIG", raising=False)
        else:
            monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
        err = refused_in_one_line(capsys, cli.parse_args, ["--ps", "--use-tf-config"])
        assert "error: --use-tf-config: " in err and message in err, err
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                "task": {"type": "chief", "index": 0}}))
    args = cli.parse_args(["--ps", "--use-tf-config", "--rows", "10,000,000,000"])
    cfg = ps.sizes(args)  # this machine's memory is not checked: the table is elsewhere
    assert (cfg["cluster"], cfg["num_ps"], cfg["workers"]) == (cluster, 1, 1)


def test_ps_sizes_and_traffic():
    from argparse import Namespace

    from fusedopt.bench import ps

    assert ps.SIZES["rows"] >= 10_000_000
    args = Namespace(quick=False, rows=None, dim=None, batch=None, num_ps=4, seconds=None)
    cfg = ps.sizes(args)
    assert (cfg["rows"], cfg["num_ps"]) == (ps.SIZES["rows"], 4)
    assert ps.sizes(Namespace(quick=True, rows=20_000))["rows"] == 20_000
    traffic = ps.traffic_per_step(dict(batch=10, bag=3, dim=4))
    assert traffic == {"ids": 30, "lookup_bytes": 30 * 16, "gradient_bytes": 30 * (16 + 4)}
    assert ps.task_of("/job:ps/replica:0/task:3/device:CPU:0") == "ps3"


def test_the_recorded_run_is_what_benchmarks_md_shows():
    """BENCHMARKS.md's tables of the parameter-server run are its report, from the raw
    results it names (docs/bench/ps.json)."""
    from fusedopt.bench import ps

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "bench", "ps.json")) as f:
        results = json.load(f)
    assert results["environment"]["config"]["rows"] == ps.SIZES["rows"]  # the default run
    with open(os.path.join(root, "BENCHMARKS.md")) as f:
        benchmarks = f.read()
    text = ps.report(results, "python -m fusedopt.bench --ps")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 3 + 1 + 3 * 2, rows  # the headers, 3 optimizers, 3 x 2 ps
    for line in rows:
        assert line in benchmarks, line
    assert "None" not in text and "nan" not in text

