"""``python -m fusedopt.bench [flags]``: runs the selected scenarios, saves and reports."""
import argparse
import gc
import json
import os
import platform
import sys
import time

from fusedopt.bench import dense, fbgemm_scenario, libraries, memory, sparse
from fusedopt.bench import convergence, state
from fusedopt.bench.aims import aims
from fusedopt.bench.config import THREADS, sizes
from fusedopt.bench.report import CONTENDER_TABLES, markdown, plot

SCENARIOS = ("sparse", "sparse_xla", "dense", "dense_sizes", "scaling", "bandwidth",
             "many_small", "sparse_fbgemm")

# Embedding-scale state (issue 32): sizes of their own (config.embedding_sizes).
EMBEDDING_SCALE = {"state_memory": state.scenario_state_memory,
                   "convergence": convergence.scenario_convergence}
SCENARIOS += tuple(EMBEDDING_SCALE)


def run_scenario(name, tf, cfg, progress, quick):
    if name in EMBEDDING_SCALE:
        return EMBEDDING_SCALE[name](tf, progress, quick)
    if name == "scaling":  # its child process must use the same sizes
        return memory.scenario_scaling(tf, cfg, progress, quick)
    if name == "sparse_fbgemm":  # so must its children (one per thread count)
        return fbgemm_scenario.scenario_sparse_fbgemm(tf, cfg, progress, quick)
    scenario = {"sparse": sparse.scenario_sparse, "sparse_xla": sparse.scenario_sparse_xla,
                "dense": dense.scenario_dense, "dense_sizes": dense.scenario_dense_sizes,
                "bandwidth": memory.scenario_bandwidth,
                "many_small": dense.scenario_many_small}[name]
    return scenario(tf, cfg, progress)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m fusedopt.bench",
        description="fusedopt against what users would otherwise pick (package docstring "
                    "of fusedopt.bench: how it measures).")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run for CI")
    p.add_argument("--out", default="bench_results", help="directory for results.json and the plot")
    p.add_argument("--markdown", help="also write the markdown report to this file")
    p.add_argument("--table-scaling-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(state.CHILD_FLAG, type=int, metavar="INDEX", help=argparse.SUPPRESS)
    p.add_argument("--fbgemm-child", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated subset to (re)run; the others are kept from "
                        "<out>/results.json when it exists")
    args = p.parse_args(argv)
    args.scenarios = set(args.scenarios.split(","))
    unknown = args.scenarios - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    return args


def import_tensorflow(threads=THREADS):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # each contender has its own tf.function: no retrace noise
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def environment(tf, args, cfg):
    torch = libraries.torch()
    keras_version = getattr(tf.keras, "__version__", None) or __import__("keras").__version__
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "tensorflow": tf.__version__, "keras": keras_version,
            "torch": torch.__version__ if torch else None,
            "python": sys.version.split()[0], "quick": args.quick, "config": cfg,
            "load_average_at_start": os.getloadavg()}


JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


def _damage(previous):
    """What is wrong with an earlier run's results (parsed JSON) for this run, or None."""
    if not isinstance(previous, dict):
        return "%s, not an object of results" % JSON_TYPES[type(previous)]
    if not isinstance(previous.get("environment"), dict):
        return 'no "environment" object'
    for name in SCENARIOS:
        if name in previous and not isinstance(previous[name], dict):
            return "the %r results are %s, not an object" % (
                name, JSON_TYPES[type(previous[name])])
    try:  # what the end of this run computes from the results it keeps
        aims(previous)
        mismatches(previous)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        return "results not laid out as this version writes them (%s: %s)" % (
            type(e).__name__, e)
    return None


def previous_results(args):
    """The results of an earlier run in --out, kept when only some scenarios are re-run.

    Read and checked before anything else runs: a file that cannot be read, is not JSON or
    is not laid out as results raises ValueError (one line naming the file and the
    problem)."""
    existing = os.path.join(args.out, "results.json")
    if args.scenarios == set(SCENARIOS) or not os.path.exists(existing):
        return {}
    try:
        with open(existing, encoding="utf-8") as f:
            previous = json.load(f)
    except OSError as e:
        problem = "cannot be read (%s)" % (e.strerror or e)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        problem = "not valid JSON (%s)" % e
    else:
        problem = _damage(previous)
    if problem:
        raise ValueError("%s: %s; it holds the results of the scenarios this run keeps "
                         "(--scenarios re-runs only some): move it away or choose another --out"
                         % (existing, problem))
    return previous


def start_results(tf, args, cfg, previous):
    """The results of an earlier run kept (previous_results) and this run's environment
    (which names the earlier run)."""
    results = dict(previous)
    results["environment"] = environment(tf, args, cfg)
    if previous:
        results["environment"]["rerun_scenarios"] = sorted(args.scenarios)
        results["environment"]["earlier_run"] = previous["environment"]
    return results


def save(results, out):
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)


def mismatches(results):
    """The contenders whose numbers differ from their fusedopt oracle's."""
    found = [(block, table, name) for _, block in CONTENDER_TABLES
             for table, rows in results.get(block, {}).items() for name, r in rows.items()
             if not name.startswith("_") and not r["match"]]
    found += [("sparse_fbgemm", r["table_rows"], r["fbgemm"])
              for r in results.get("sparse_fbgemm", {}).get("rows", []) if not r["match"]]
    return found + [("many_small", name) for name, r in results.get("many_small", {}).items()
                    if not name.startswith("_") and not r["match"]]


def write_report(results, args, argv):
    command = "python -m fusedopt.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    report = markdown(results, command.strip())
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    print(report)


def main(argv=None):
    args = parse_args(argv)
    child = args.table_scaling_child or args.state_memory_child is not None or args.fbgemm_child
    try:  # before TensorFlow is imported: a damaged file costs no benchmark
        previous = {} if child else previous_results(args)
    except ValueError as e:
        print("fusedopt.bench: %s" % e, file=sys.stderr)
        return 2
    tf = import_tensorflow(args.fbgemm_child or THREADS)
    cfg = sizes(args.quick)
    if args.table_scaling_child:  # run by scenario_scaling with huge pages off
        return memory.table_scaling_child(tf, cfg)
    if args.state_memory_child is not None:  # run by scenario_state_memory, one contender
        return state.child(tf, args.state_memory_child, args.quick)
    if args.fbgemm_child:  # run by scenario_sparse_fbgemm, at another thread count
        return fbgemm_scenario.child(tf, cfg)
    os.makedirs(args.out, exist_ok=True)
    started = time.time()

    def progress(msg):
        print(f"[{time.time() - started:6.1f}s] {msg}", flush=True)

    results = start_results(tf, args, cfg, previous)
    for name in SCENARIOS:
        if name in args.scenarios:
            results[name] = run_scenario(name, tf, cfg, progress, args.quick)
            gc.collect()  # the previous scenario's variables (GBs at full size)
            save(results, args.out)  # after every scenario: a late failure keeps the rest
    results["aims"] = aims(results)
    save(results, args.out)
    plotted = plot(results, os.path.join(args.out, "benchmarks.png"))
    write_report(results, args, argv)
    progress(f"done; plot {'written' if plotted else 'skipped (no matplotlib)'}")
    if mismatches(results):
        print("contenders whose numbers differ from fusedopt's:", mismatches(results),
              file=sys.stderr)
        return 1
    return 0
