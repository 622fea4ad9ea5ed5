"""A ``tf.distribute`` cluster on this machine, for trying out or measuring parameter servers.

Starts each ``ps`` and ``worker`` task as a ``python -m fusedopt.server`` process on a free
port of 127.0.0.1, waits until all of them serve, and stops every one of them when the
``with`` block ends, however it ends: normally, by an exception, by Ctrl-C, or by SIGTERM or
SIGHUP sent to this process (turned into ``SystemExit`` while the block runs, where it runs
in the main thread). The calling process is meant to be the chief: the cluster has a
``chief`` task at an address of its own, for ``TF_CONFIG``::

    from fusedopt.local_cluster import LocalCluster

    with LocalCluster(num_ps=2, num_workers=2) as cluster:
        os.environ["TF_CONFIG"] = cluster.tf_config("chief")
        strategy = tf.distribute.ParameterServerStrategy(
            tf.distribute.cluster_resolver.TFConfigClusterResolver())
        ...

The servers stay in this process's process group, so a Ctrl-C typed in the terminal or a
signal sent to the group reaches them too. Only a SIGKILL of this process alone leaves them
running: nothing can run then to stop them.

TensorFlow's server listens on every network interface of the machine, whatever address the
cluster names, and it is unauthenticated: start a cluster only where its ports cannot be
reached from other machines (docs/guides/distributed.md, "Security").
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["LocalCluster", "ServerNotServing", "free_ports", "process_memory",
           "reset_peak_memory"]

# Signals that end a process by default without running its cleanup; while a cluster runs
# they raise SystemExit instead, so that the servers are stopped first.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def free_ports(n, host="127.0.0.1"):
    """n distinct free TCP ports of `host` (held open together, so that they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def process_memory(pid):
    """The resident memory of a process of this machine, in bytes, from Linux's
    /proc/PID/status: {"rss_bytes": VmRSS, "anon_bytes": RssAnon (the part that is the
    process's own data, not its mapped libraries), "peak_rss_bytes": VmHWM}; None where
    they cannot be read."""
    fields = {"VmRSS": "rss_bytes", "RssAnon": "anon_bytes", "VmHWM": "peak_rss_bytes"}
    found = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in fields:
                    found[fields[name]] = int(value.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return found if len(found) == len(fields) else None


def reset_peak_memory(pid):
    """Makes a process's peak resident memory (VmHWM) its current one, so that the next
    reading is the peak from now on (Linux 4.0 and later: /proc/PID/clear_refs). False
    where that is not allowed or not possible."""
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class ServerNotServing(RuntimeError):
    """A server of a LocalCluster exited, or did not serve in time. ``summary``: one line
    saying which and why; ``log``: the end of what it wrote (also in the message)."""

    def __init__(self, summary, log):
        super().__init__(summary + "\nits log:\n" + log)
        self.summary, self.log = summary, log


class _Server:
    """One started task: its process, log file and address."""

    def __init__(self, job, index, address, process, log_path, ready_path):
        self.job, self.index, self.address = job, index, address
        self.process, self.log_path, self.ready_path = process, log_path, ready_path

    @property
    def name(self):
        return "%s%d" % (self.job, self.index)

    def log(self, tail=None):
        """What the server wrote (stdout and stderr), or its last `tail` characters."""
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        return text[-tail:] if tail else text

    def reason(self):
        """fusedopt.server's last line of its own ("fusedopt.server: ..."), which says why
        it stopped, or else the last line it wrote."""
        lines = [line.strip() for line in self.log(tail=3000).splitlines() if line.strip()]
        own = [line for line in lines if line.startswith("fusedopt.server: ")]
        return (own or lines or ["(it wrote nothing)"])[-1]


class LocalCluster:
    """``num_ps`` parameter servers and ``num_workers`` workers on 127.0.0.1, each a
    ``python -m fusedopt.server`` process, plus a ``chief`` address for the caller.

    Use it as a context manager (or call ``start()`` and ``stop()``). ``start`` raises
    ``ServerNotServing`` (a RuntimeError), after stopping every process it started, when a
    server exits or does not serve within ``timeout`` seconds.

    Args:
      num_ps, num_workers: how many tasks of each job.
      workdir: folder for each server's log (``ps0.log``, ...) and ready file; by default a
        temporary folder, removed when the cluster stops.
      timeout: seconds to wait for all servers to serve.
      server_args: extra flags for every ``fusedopt.server`` (e.g.
        ``["--log_device_placement"]``).
      env: the servers' environment (default: this process's), with the folder this
        fusedopt is imported from first on its PYTHONPATH: the servers load the same
        package and op library as this process.

    Attributes (once started): ``cluster``, the cluster spec ({"ps": ["127.0.0.1:PORT",
    ...], "worker": [...], "chief": [...]}); ``servers``, each with ``name`` ("ps0"),
    ``address``, ``process`` (its ``subprocess.Popen``) and ``log()``, what it wrote.
    """

    def __init__(self, num_ps=2, num_workers=2, workdir=None, timeout=120, server_args=(),
                 env=None):
        if num_ps < 1 or num_workers < 1:
            raise ValueError("a cluster needs at least one ps and one worker task, got "
                             "num_ps=%d, num_workers=%d" % (num_ps, num_workers))
        self.num_ps, self.num_workers = num_ps, num_workers
        self.timeout, self.server_args = timeout, list(server_args)
        self.env = _with_this_fusedopt(dict(os.environ if env is None else env))
        self._workdir, self._own_workdir = workdir, None
        self.cluster = None
        self.servers = []
        self._previous_handlers = {}

    # -- the cluster --------------------------------------------------------------------

    @property
    def workdir(self):
        return self._workdir or (self._own_workdir.name if self._own_workdir else None)

    def tf_config(self, job="chief", index=0):
        """The ``TF_CONFIG`` (a JSON string) of task `index` of `job` in this cluster."""
        return json.dumps({"cluster": self.cluster, "task": {"type": job, "index": index}})

    def pids(self):
        """{"ps0": pid, ...} of every server process started."""
        return {s.name: s.process.pid for s in self.servers}

    # -- starting and stopping ----------------------------------------------------------

    def start(self):
        if self.servers:
            raise RuntimeError("this cluster is already started")
        if self._workdir is None:
            self._own_workdir = tempfile.TemporaryDirectory(prefix="fusedopt-cluster-")
        addresses = ["127.0.0.1:%d" % p for p in free_ports(self.num_ps + self.num_workers + 1)]
        self.cluster = {"ps": addresses[:self.num_ps],
                        "worker": addresses[self.num_ps:-1], "chief": addresses[-1:]}
        try:
            for job in ("ps", "worker"):
                for index, address in enumerate(self.cluster[job]):
                    self.servers.append(self._launch(job, index, address))
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, job, index, address):
        name = "%s%d" % (job, index)
        log_path = os.path.join(self.workdir, name + ".log")
        ready_path = os.path.join(self.workdir, name + ".ready")
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "fusedopt.server", "--cluster_spec",
                 json.dumps(self.cluster), "--job_name", job, "--task_index", str(index),
                 "--ready_file", ready_path] + self.server_args,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        return _Server(job, index, address, process, log_path, ready_path)

    def _wait_until_serving(self):
        deadline = time.monotonic() + self.timeout
        for server in self.servers:
            while not os.path.exists(server.ready_path):
                if server.process.poll() is not None:
                    raise ServerNotServing(
                        "%s (python -m fusedopt.server) exited with status %d before serving: "
                        "%s" % (server.name, server.process.returncode, server.reason()),
                        server.log(tail=3000))
                if time.monotonic() > deadline:
                    raise ServerNotServing("%s was not serving after %g s: %s"
                                           % (server.name, self.timeout, server.reason()),
                                           server.log(tail=3000))
                time.sleep(0.1)

    def stop(self, grace=10):
        """Stops every server (SIGTERM, then SIGKILL after `grace` seconds) and waits for
        it to end. Safe to call more than once; a second Ctrl-C (or a stop signal) while it
        runs is ignored, so that it does not leave servers behind."""
        with _signals_ignored((signal.SIGINT,) + _STOP_SIGNALS):
            self._stop(grace)

    def _stop(self, grace):
        for server in self.servers:
            if server.process.poll() is None:
                server.process.terminate()
        deadline = time.monotonic() + grace
        for server in self.servers:
            try:
                server.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()
        if self._own_workdir is not None:
            self._own_workdir.cleanup()
            self._own_workdir = None

    def __enter__(self):
        self._raise_on_stop_signals()
        try:
            return self.start()
        except BaseException:
            self._restore_signal_handlers()
            raise

    def __exit__(self, *exc_info):
        try:
            self.stop()
        finally:
            self._restore_signal_handlers()
        return False

    def _raise_on_stop_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; the caller's own then apply

        def stop_here(signum, frame):
            raise SystemExit(128 + signum)

        for signum in _STOP_SIGNALS:
            if signal.getsignal(signum) == signal.SIG_DFL:  # the caller's own handler wins
                self._previous_handlers[signum] = signal.signal(signum, stop_here)

    def _restore_signal_handlers(self):
        while self._previous_handlers:
            signum, handler = self._previous_handlers.popitem()
            signal.signal(signum, handler)


@contextlib.contextmanager
def _signals_ignored(signals):
    """Ignores `signals` in the block (main thread only: elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _with_this_fusedopt(env):
    """`env` with the folder this fusedopt is imported from first on PYTHONPATH, so that
    the servers load the same package (and op library) as the chief. An installed fusedopt
    (in site-packages) is found by the servers' Python as it is: nothing added."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.basename(package_parent) in ("site-packages", "dist-packages"):
        return env  # on PYTHONPATH it would come before the standard library
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_parent not in paths:
        env["PYTHONPATH"] = os.pathsep.join([package_parent] + paths)
    return env
