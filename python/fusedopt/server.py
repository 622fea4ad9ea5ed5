"""A ``tf.distribute.Server`` with fusedopt's op library loaded.

Under ``tf.distribute.ParameterServerStrategy`` an optimizer's update ops run where the
variables live: on the parameter servers. A server process can only run (and a worker only
place) an op whose kernel is registered in it, so every ``ps`` and ``worker`` task of a
cluster trained with fusedopt must load the op library first. This module does that, then
starts a standard TensorFlow gRPC server and serves until killed:

    python -m fusedopt.server --cluster_spec '{"ps": ["127.0.0.1:2222", "127.0.0.1:2223"],
        "worker": ["127.0.0.1:2224", "127.0.0.1:2225"], "chief": ["127.0.0.1:2226"]}' \
        --job_name ps --task_index 0
    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 1}}' python -m fusedopt.server

Flags (each falls back to ``TF_CONFIG`` when not given):
  --cluster_spec JSON      job name -> list of "host:port" (TF_CONFIG["cluster"])
  --job_name NAME          this task's job, e.g. ps or worker (TF_CONFIG["task"]["type"])
  --task_index N           this task's index in its job (TF_CONFIG["task"]["index"])
  --protocol grpc          server protocol (default grpc)
  --log_device_placement   log (stderr) the device of every op of each function this task
                           places: a ps task logs the update ops of its variables,
                           a worker the whole step it runs (TF's placer, VLOG 1)
  --ready_file PATH        write this file (JSON: job, task, target, library) once serving

The library is found as ``fusedopt.ops`` finds it (``$FUSEDOPT_OPS_LIBRARY`` or the one in
the package). Exit status, each failure one line on stderr:
  2  bad flags or a bad cluster/TF_CONFIG: wrong JSON shape; a job name TensorFlow cannot
     hold (it must be a letter, then letters, digits or underscores); an address that is
     not host:port with a port in 1..65535; a task index that is not an integer or out of
     range; a --ready_file that cannot be written (tried before the server starts; should
     writing it still fail once serving, the process ends at once, leaving nothing running)
  1  the op library does not load
  3  the server cannot start (e.g. its port is in use)

Security: TensorFlow's gRPC server listens on every network interface of the machine
(address 0.0.0.0 / [::]) whatever host the cluster spec names, and it is unauthenticated:
it runs any graph it is sent. TensorFlow has no option to listen on one address only. Once
serving, the server says so in one line on stderr when its socket is bound to every
interface (read from /proc on Linux; said too where that cannot be read): keep the port
private (a firewall rule, a private network).
"""
import argparse
import json
import os
import re
import socket
import sys

# TensorFlow's rule for a job name (DeviceNameUtils' IsJobName): an ASCII letter, then
# letters, digits or underscores. Any other name ends in TensorFlow's check failure
# (SIGABRT) once the server starts.
JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


__all__ = ["parse_args", "resolve", "enable_placement_log", "start", "ready_file_problem",
           "write_ready_file", "listening_addresses", "exposure_note", "main"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fusedopt.server",
        description="Start a tf.distribute.Server with fusedopt's op library loaded "
                    "(for the ps and worker tasks of a tf.distribute cluster).")
    parser.add_argument("--cluster_spec", help='JSON: {"ps": ["host:port", ...], ...} '
                        '(default: TF_CONFIG["cluster"])')
    parser.add_argument("--job_name", help='this task\'s job (default: TF_CONFIG["task"]["type"])')
    parser.add_argument("--task_index", type=int,
                        help='this task\'s index (default: TF_CONFIG["task"]["index"])')
    parser.add_argument("--protocol", default="grpc")
    parser.add_argument("--log_device_placement", action="store_true",
                        help="log (stderr) the device of every op this task places")
    parser.add_argument("--ready_file", help="write this file once the server is serving")
    return parser.parse_args(argv)


def _json_object(text, what):
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError("%s is not valid JSON: %s" % (what, e)) from e
    if not isinstance(value, dict):
        raise ValueError("%s must be a JSON object, got %s" % (what, type(value).__name__))
    return value


def _check_address(address, where):
    """host:port with a port in 1..65535 (TF would wrap or reject a bad one later)."""
    if not isinstance(address, str):
        raise ValueError('%s must be a "host:port" string, got %r' % (where, address))
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError('%s must be "host:port" with a port in 1..65535, got %r'
                         % (where, address))


def _check_job_name(job, where):
    if not JOB_NAME.fullmatch(job):
        raise ValueError("%s %r is not a job name TensorFlow accepts (a letter, then letters, "
                         "digits or underscores)" % (where, job))


def _check_cluster(cluster, what):
    """cluster: {job: ["host:port", ...]}, as TF_CONFIG has it."""
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError('%s must be a non-empty object {job: ["host:port", ...]}, got %r'
                         % (what, cluster))
    for job, tasks in cluster.items():
        _check_job_name(job, "%s: job" % what)
        if not isinstance(tasks, list):
            raise ValueError('%s: job %r must be a list of "host:port", got %r'
                             % (what, job, tasks))
        for index, address in enumerate(tasks):
            _check_address(address, "%s: job %r task %d" % (what, job, index))


def _task_index(value, where):
    """An integer (or a string of digits, as environment-made JSON has); never truncated."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("%s must be an integer, got %r" % (where, value))
    return value


def resolve(args, environ=None):
    """(cluster dict, job_name, task_index) from the flags, falling back to TF_CONFIG.

    Anything malformed raises ValueError with a one-line message (exit status 2)."""
    environ = os.environ if environ is None else environ
    tf_config = {}
    if environ.get("TF_CONFIG"):
        tf_config = _json_object(environ["TF_CONFIG"], "TF_CONFIG")
    task = tf_config.get("task", {})
    if not isinstance(task, dict):
        raise ValueError('TF_CONFIG["task"] must be an object {"type": ..., "index": ...}, got %r'
                         % (task,))
    if args.cluster_spec:
        cluster, what = _json_object(args.cluster_spec, "--cluster_spec"), "--cluster_spec"
    else:
        cluster, what = tf_config.get("cluster"), 'TF_CONFIG["cluster"]'
    if not cluster:
        raise ValueError("no cluster: pass --cluster_spec JSON or set TF_CONFIG")
    _check_cluster(cluster, what)
    job = args.job_name if args.job_name is not None else task.get("type")
    index = args.task_index if args.task_index is not None else task.get("index")
    if job is None or index is None:
        raise ValueError("pass --job_name and --task_index (or TF_CONFIG's task)")
    if not isinstance(job, str):
        raise ValueError("the job name must be a string, got %r" % (job,))
    _check_job_name(job, "--job_name" if args.job_name is not None
                    else 'TF_CONFIG["task"]["type"]')
    index = _task_index(index, "task_index" if args.task_index is not None
                        else 'TF_CONFIG["task"]["index"]')
    if job not in cluster:
        raise ValueError("job %r is not in the cluster %s" % (job, sorted(cluster)))
    if not 0 <= index < len(cluster[job]):
        raise ValueError("task_index %d out of range for job %r (%d tasks)"
                         % (index, job, len(cluster[job])))
    return cluster, job, index


def enable_placement_log(environ=None):
    """Make TF's placer log every placement (must run before TensorFlow is imported).

    Functions sent by a ``ClusterCoordinator`` run in remote eager contexts, which ignore
    a server's ``ConfigProto.log_device_placement``; the placer's VLOG(1) covers them.
    """
    environ = os.environ if environ is None else environ
    vmodule = [m for m in environ.get("TF_CPP_VMODULE", "").split(",") if m]
    environ["TF_CPP_VMODULE"] = ",".join(vmodule + ["placer=1"])
    environ["TF_CPP_MIN_LOG_LEVEL"] = "0"


def start(cluster, job_name, task_index, protocol="grpc"):
    """Loads the op library, then starts and returns the ``tf.distribute.Server``."""
    from fusedopt._console import TF_LOG_SETTING, log_level, stderr_without_load_noise

    # TF_CPP_MIN_LOG_LEVEL holds for what absl prints while TensorFlow loads, too.
    with stderr_without_load_noise(log_level(os.environ.get(TF_LOG_SETTING))):
        import tensorflow as tf

    from fusedopt import ops

    ops.load_library()
    return tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job_name,
                                task_index=task_index, protocol=protocol, start=True)


def ready_file_problem(path):
    """Why the ready file cannot be written at ``path`` (None when it can), found before the
    server starts: by creating and removing the temporary file it is renamed from."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return "%s is not a directory" % directory if os.path.exists(directory) else \
            "no such directory"
    if os.path.isdir(path):
        return "is a directory"
    try:
        with open(path + ".tmp", "w"):
            pass
        os.unlink(path + ".tmp")
    except OSError as e:
        return "cannot write in %s (%s)" % (directory, e.strerror or e)
    return None


def write_ready_file(path, info):
    """Writes ``info`` (JSON) to ``path`` whole: through a temporary file renamed over it."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, path)
    except OSError:
        if os.path.isfile(tmp):
            os.unlink(tmp)
        raise


def listening_addresses(port):
    """The addresses this process's TCP sockets listen on at ``port`` (Linux's /proc; "::"
    or "0.0.0.0": every interface), or None where /proc cannot tell."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    inodes = set()
    for fd in fds:
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open("/proc/self/net/" + table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:  # e.g. no IPv6
            continue
        for row in rows:  # sl local_address rem_address st ... inode
            fields = row.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] == "0A" and int(hex_port, 16) == port and fields[9] in inodes:
                raw = bytes.fromhex(address)  # 32-bit words in the machine's byte order
                if sys.byteorder == "little":
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.append(socket.inet_ntop(family, raw))
    return found or None


def exposure_note(host, port, addresses):
    """The one line saying that the server listens on every interface, or None when the
    addresses it listens on (listening_addresses) are all specific ones."""
    wildcards = [a for a in addresses or ["0.0.0.0"] if a in ("0.0.0.0", "::")]
    if not wildcards:
        return None
    where = " / ".join("[%s]" % a if ":" in a else a for a in wildcards)
    named = "" if host.strip("[]") in ("0.0.0.0", "::", "") else \
        ", not only on %s as the cluster spec says" % host
    return ("fusedopt.server: note: TensorFlow's gRPC server listens on every network interface "
            "of this machine (address %s, port %d)%s; it is unauthenticated and runs any graph "
            "it is sent: keep the port private (a firewall rule, a private network)"
            % (where, port, named))


def _one_line(error):
    """TF's message without its node/trace decorations, on one line."""
    text = getattr(error, "message", None) or str(error) or type(error).__name__
    return " ".join(text.split())


def main(argv=None):
    args = parse_args(argv)
    try:
        cluster, job, index = resolve(args)
    except ValueError as e:
        print("fusedopt.server: %s" % e, file=sys.stderr)
        return 2
    problem = args.ready_file and ready_file_problem(args.ready_file)
    if problem:
        print("fusedopt.server: --ready_file %s: %s" % (args.ready_file, problem),
              file=sys.stderr)
        return 2
    if args.log_device_placement:
        if "tensorflow" in sys.modules:
            print("fusedopt.server: --log_device_placement must be set before TensorFlow "
                  "is imported", file=sys.stderr)
            return 2
        enable_placement_log()
    try:
        server = start(cluster, job, index, args.protocol)
    except ImportError as e:
        print("fusedopt.server: cannot load the op library: %s" % e, file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - TF's server start errors (port in use, ...)
        hint = "; is the port in use?" if "Could not start gRPC server" in str(e) else ""
        print("fusedopt.server: cannot serve /job:%s/task:%d at %s: %s%s"
              % (job, index, cluster[job][index], _one_line(e), hint), file=sys.stderr)
        return 3
    from fusedopt import _loader

    info = dict(job=job, task=index, target=server.target, library=_loader.library_path(),
                pid=os.getpid())
    if args.ready_file:
        try:
            write_ready_file(args.ready_file, info)
        except OSError as e:  # writable a moment ago (ready_file_problem): removed, full, ...
            print("fusedopt.server: --ready_file %s: cannot write it (%s); stopping"
                  % (args.ready_file, e.strerror or e), file=sys.stderr, flush=True)
            # TensorFlow cannot stop a started server ("clean shutdown is not implemented")
            # and may abort at interpreter exit: end the process now, closing its port.
            os._exit(2)
    host, _, port = cluster[job][index].rpartition(":")
    note = exposure_note(host, int(port), listening_addresses(int(port)))
    if note:
        print(note, file=sys.stderr, flush=True)
    print("fusedopt.server: serving /job:%s/task:%d at %s (ops from %s)"
          % (job, index, server.target, info["library"]), flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
