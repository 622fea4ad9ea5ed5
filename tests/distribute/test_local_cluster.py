"""fusedopt.local_cluster: the servers it starts are stopped whatever ends the cluster: a
server that fails to start (the others are stopped, the error names it), a signal that
would end the process without cleanup (SIGTERM, SIGHUP: SystemExit while it runs)."""
import os
import signal
import socket
import time

import pytest

from fusedopt import local_cluster
from fusedopt.local_cluster import LocalCluster


def test_free_ports_differ():
    ports = local_cluster.free_ports(8)
    assert len(set(ports)) == 8 and all(0 < p < 65536 for p in ports)


def test_process_memory_of_this_process():
    memory = local_cluster.process_memory(os.getpid())
    if memory is None:
        pytest.skip("no /proc here")
    assert 0 < memory["anon_bytes"] <= memory["rss_bytes"] <= memory["peak_rss_bytes"]
    assert local_cluster.process_memory(2**22 + 1) is None  # above Linux's largest pid


def test_a_cluster_needs_a_ps_and_a_worker():
    with pytest.raises(ValueError, match="at least one ps and one worker"):
        LocalCluster(num_ps=0)


def test_stop_signals_raise_system_exit_only_while_the_cluster_runs(monkeypatch):
    cluster = LocalCluster(1, 1)
    monkeypatch.setattr(cluster, "start", lambda: cluster)  # no processes: the handlers only
    stop_signals = (signal.SIGTERM, signal.SIGHUP)
    callers = {s: signal.signal(s, signal.SIG_DFL) for s in stop_signals}  # (nohup: ignored)
    try:
        for signum in stop_signals:
            with pytest.raises(SystemExit) as stopped:
                with cluster:
                    os.kill(os.getpid(), signum)
                    time.sleep(5)  # the handler runs at once, raising here
            assert stopped.value.code == 128 + signum
            assert [signal.getsignal(s) for s in stop_signals] == [signal.SIG_DFL] * 2
        # A handler of the caller's own is left alone.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with cluster:
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        for signum, handler in callers.items():
            signal.signal(signum, handler)


@pytest.mark.slow
def test_a_server_that_cannot_start_stops_the_others(monkeypatch):
    """ps0's port is taken: it exits (status 3) and the cluster does not start; the worker,
    which did start, is stopped too, and the error says which server failed and why."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = [taken.getsockname()[1]] + local_cluster.free_ports(2)
    monkeypatch.setattr(local_cluster, "free_ports", lambda n: ports[:n])
    cluster = LocalCluster(num_ps=1, num_workers=1, timeout=240)
    try:
        with pytest.raises(local_cluster.ServerNotServing) as failed:
            with cluster:
                pytest.fail("the cluster started on a port in use")
        summary = failed.value.summary  # which server, and its own reason
        assert summary.startswith("ps0 (python -m fusedopt.server) exited with status 3 "
                                  "before serving: fusedopt.server: cannot serve "
                                  "/job:ps/task:0"), summary
        assert summary.endswith("is the port in use?") and "\n" not in summary, summary
        assert failed.value.log in str(failed.value)
        assert [s.process.poll() is not None for s in cluster.servers] == [True, True]
    finally:
        taken.close()
        for server in cluster.servers:
            if server.process.poll() is None:
                server.process.kill()
