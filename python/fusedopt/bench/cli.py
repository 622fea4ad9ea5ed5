"""``python -m fusedopt.bench [flags]``: runs the selected scenarios, saves and reports.

Runs: the full run (every scenario, or those ``--scenarios`` names), reported for users;
``--aims`` adds the project's own performance targets (``aims.py``) to results.json and the
report (for fusedopt's developers and CI); ``--headline`` (``headline.py``): the few
numbers a user asks first, at the user's sizes (``--rows --dim --batch --optimizer``);
``--largest-table ROWS...`` (``largest_table.py``): the largest table each optimizer trains
here, one child process per optimizer and table size; ``--ps`` (``ps.py``): training with
parameter servers, a cluster of processes on this machine.
``--quick``: tiny sizes, every run (the tests' and CI's smoke runs).
"""
import argparse
import gc
import json
import os
import sys
import time
import warnings

from fusedopt import _console
from fusedopt.bench import dense, fbgemm, fbgemm_scenario, headline, libraries, memory, sparse
from fusedopt.bench import convergence, largest_table, ps, state
from fusedopt.bench.aims import aims
from fusedopt.bench.config import THREADS, sizes
from fusedopt.bench.contenders import RULES
from fusedopt.bench.machine import describe as describe_cpu, machine_words
from fusedopt.bench.report import CONTENDER_TABLES, markdown, plot

PROG = "python -m fusedopt.bench"

SCENARIOS = ("sparse", "sparse_xla", "dense", "dense_sizes", "scaling", "bandwidth",
             "many_small", "sparse_fbgemm")

# Embedding-scale state: sizes of their own (config.embedding_sizes).
EMBEDDING_SCALE = {"state_memory": state.scenario_state_memory,
                   "convergence": convergence.scenario_convergence}
SCENARIOS += tuple(EMBEDDING_SCALE)

# What each scenario measures, as its stage line says it.
TITLES = {"sparse": "the sparse embedding step, every optimizer",
          "sparse_xla": "the sparse step compiled by XLA (jit_compile), at two table sizes",
          "dense": "the dense step, every optimizer",
          "dense_sizes": "dense Adam at two sizes, against TensorFlow's kernel and PyTorch",
          "scaling": "step time as the touched rows and the table grow",
          "bandwidth": "this machine's memory bandwidth and fusedopt's share of it",
          "many_small": "one step over many small variables",
          "sparse_fbgemm": "beside FBGEMM's CPU embedding update",
          "state_memory": "optimizer state and peak memory on a large table, one process "
                          "per optimizer",
          "convergence": "held-out loss of the compact-state optimizers"}

FULL_RUN_COST = "about 45 minutes on a 2-core machine and up to 15 GB of memory"
FBGEMM_PEER = "FBGEMM (it runs in an environment of its own: BENCHMARKS.md says how)"

DESCRIPTION = f"""\
Measures fusedopt's optimizer updates against what you would use otherwise (Keras,
TensorFlow's own optimizers and kernels, PyTorch where it is installed), on this machine.
Every other implementation is first checked to give fusedopt's numbers, then all are
timed in turn, in one process, several rounds each.

  {PROG} --headline
      the main numbers in 2-3 minutes: the sparse embedding step, a dense step and the
      memory each optimizer keeps (1,000,000 x 64 table, 16,384 ids per step)
  {PROG} --headline --rows 5000000 --dim 32 --batch 4096 --optimizer adagrad
      the same at your sizes (--rows, --dim, --batch or --optimizer alone imply --headline)
  {PROG} --largest-table 10M 30M 100M --dim 32
      the largest table each optimizer trains on this machine: every optimizer at every
      size in a process of its own, capped at the memory available (minutes per size)
  {PROG}
      every scenario at full size: {FULL_RUN_COST}
  {PROG} --ps
      training with parameter servers: a cluster of processes on this machine (2
      parameter servers, 2 workers), a 10,000,000 x 32 table split over the parameter
      servers, fusedopt's row-wise Adagrad and LazyAdam against Keras's Adam: examples per
      second and the memory each parameter server holds (about 5 minutes, 15 GB)

Results go to --out (results.json, headline.json with --headline, largest_table.json with
--largest-table, ps.json with --ps) with a plot where matplotlib is installed (pip install
matplotlib, or fusedopt's [plot] extra).
"""


def run_scenario(name, tf, cfg, progress, args):
    quick = args.quick
    if name == "sparse_fbgemm" and not args.aims and fbgemm.find_python()[0] is None:
        return {"_skipped": fbgemm.find_python()[1]}  # named in the "not compared" line
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


def _optimizer(text):
    """argparse type: one of fusedopt's rules."""
    if text not in RULES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of fusedopt's optimizers: "
                                         f"{', '.join(RULES)}")
    return text


def _num_ps(text):
    """argparse type: 1 to 8 parameter servers (each a process of this machine)."""
    value = _console.whole_number(text)
    if value > 8:
        raise argparse.ArgumentTypeError(f"at most 8 parameter servers here, not {value:,}")
    return value


def _seconds(text):
    """argparse type: seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def parser():
    p = _console.ArgumentParser(prog=PROG, description=DESCRIPTION,
                                formatter_class=_console.HelpFormatter)
    p.add_argument("--headline", action="store_true",
                   help="the main numbers only, in 2-3 minutes, with a summary table")
    sizes_group = p.add_argument_group(
        "your own sizes (for --headline: any of them alone implies it; --dim and --batch "
        "also size --largest-table)")
    defaults = headline.SIZES
    sizes_group.add_argument("--rows", type=_console.whole_number,
                             help=f"rows of the embedding table (default: {defaults['rows']:,})")
    sizes_group.add_argument("--dim", type=_console.whole_number,
                             help=f"width of each row (default: {defaults['dim']})")
    sizes_group.add_argument("--batch", type=_console.whole_number,
                             help="ids looked up per step, repeats included (default: "
                                  f"{defaults['batch']:,})")
    sizes_group.add_argument("--optimizer", type=_optimizer, metavar="NAME",
                             help=f"{' | '.join(RULES)} (default: {defaults['optimizer']})")
    sweep = p.add_argument_group("the largest table each optimizer trains")
    sweep.add_argument("--largest-table", nargs="*", type=largest_table.table_rows,
                       metavar="ROWS",
                       help="train a table of each size with each optimizer, every one in a "
                            "process of its own that may use only the memory available, and "
                            "report the largest that trained (rows as 30000000, 30M or 500K; "
                            "default: " + " ".join(f"{n // 10**6}M" for n in
                                                   largest_table.DEFAULT_ROWS)
                            + "; --dim 32 and --batch 16,384 unless given)")
    sweep.add_argument("--contenders", metavar="LIST",
                       help="comma-separated optimizers for --largest-table, from: "
                            + ", ".join(largest_table.CONTENDERS) + " (default: all)")
    sweep.add_argument("--memory-limit", type=float, metavar="GB",
                       help="for --largest-table: memory each run may allocate beyond "
                            "TensorFlow's start-up (default: what the machine has available "
                            f"then, less {largest_table.KEEP_FREE / 1e9:g} GB)")
    ps_group = p.add_argument_group(
        "training with parameter servers (--ps; --rows, --dim, --batch size it too)")
    ps_group.add_argument("--ps", action="store_true",
                          help="train on a parameter-server cluster started on this machine "
                               f"(default sizes: {ps.SIZES['rows']:,} x {ps.SIZES['dim']} "
                               f"table; --batch: examples per step, {ps.SIZES['bag']} ids "
                               f"each, default {ps.SIZES['batch']:,})")
    ps_group.add_argument("--num-ps", type=_num_ps, metavar="N",
                          help=f"parameter servers, 1 to 8 (default: {ps.SIZES['num_ps']})")
    ps_group.add_argument("--use-tf-config", action="store_true",
                          help="run on the cluster TF_CONFIG describes, as its chief (its ps "
                               "and worker tasks serving already: python -m fusedopt.server "
                               "on each host), instead of starting one on this machine")
    ps_group.add_argument("--seconds", type=_seconds, metavar="S",
                          help="timed seconds per optimizer, after the warm-up steps "
                               f"(default: {ps.SIZES['seconds']:g}; at least "
                               f"{ps.SIZES['min_steps']} steps are timed)")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, to check that everything runs (what the tests use): "
                        "seconds with --headline, under a minute with --ps, a few minutes "
                        "without; the numbers mean nothing")
    p.add_argument("--out", default="bench_results",
                   help="folder for results.json (headline.json, largest_table.json, "
                        "ps.json) and the plot")
    p.add_argument("--markdown", metavar="FILE", help="also write the report to FILE")
    p.add_argument("--scenarios", metavar="LIST",
                   help="comma-separated part of the full run, from: " + ", ".join(SCENARIOS)
                        + " (default: all); the other scenarios' results are kept from "
                        "<out>/results.json when it exists")
    p.add_argument("--aims", action="store_true",
                   help="for fusedopt's developers and CI: also check the project's own "
                        "performance targets, in results.json and the report")
    p.add_argument("--table-scaling-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(state.CHILD_FLAG, type=int, metavar="INDEX", help=argparse.SUPPRESS)
    p.add_argument("--fbgemm-child", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    p.add_argument(largest_table.CHILD_FLAG, metavar="SPEC", help=argparse.SUPPRESS)
    return p


def check_ps_memory(p, cfg):
    """Refuses (one line) sizes whose parameter-server run would not fit in this machine's
    available memory."""
    need, available = ps.memory_needed(cfg), available_memory()
    if available is not None and need > available:
        p.error(f"training a {cfg['rows']:,} x {cfg['dim']} table on {cfg['num_ps']} parameter "
                f"servers needs about {need / 1e9:,.1f} GB here (the table, Adam's state, "
                f"Keras Adam's whole-table temporaries, {cfg['num_ps'] + cfg['workers'] + 1} "
                f"TensorFlow processes); {available / 1e9:,.1f} GB is available: try fewer "
                "--rows or a smaller --dim")


def check_memory(p, cfg):
    """Refuses (one line) sizes whose headline run would not fit in this machine's
    available memory."""
    need = headline.memory_needed(cfg)
    available = available_memory()
    if available is not None and need > available:
        p.error(f"a {cfg['rows']:,} x {cfg['dim']} table needs about {need / 1e9:,.1f} GB "
                f"here (each optimizer keeps its own copy and state while all are timed); "
                f"{available / 1e9:,.1f} GB is available: try fewer --rows or a smaller --dim")


def available_memory():
    """MemAvailable in bytes (Linux), or None."""
    return largest_table.mem_available()


def check_largest_table(p, args):
    """The --largest-table run's own checks (one line each): what it takes, what not."""
    if args.headline or args.scenarios or args.aims:
        p.error("--largest-table is a run of its own: not with --headline, --scenarios or "
                "--aims")
    for name in ("rows", "optimizer"):
        if getattr(args, name) is not None:
            p.error(f"--{name} sizes the headline run; --largest-table takes its table sizes "
                    "itself (--largest-table 10M 30M 100M) and --contenders its optimizers")
    try:
        args.contenders = largest_table.check_names(args.contenders)
    except ValueError as e:
        p.error(f"--contenders: {e}")
    if args.memory_limit is not None and not args.memory_limit > 0:
        p.error(f"--memory-limit must be above 0 GB, not {args.memory_limit:g}")
    args.largest_table = sorted(set(args.largest_table or largest_table.default_rows(args.quick)))
    return args


def parse_args(argv):
    p = parser()
    args = p.parse_args(argv)
    if args.largest_table is not None:
        if args.ps:
            p.error("--largest-table and --ps are runs of their own: one at a time")
        return check_largest_table(p, args)
    if args.contenders or args.memory_limit is not None:
        p.error("--contenders and --memory-limit go with --largest-table")
    ps_only = [flag for flag, value in (("--num-ps", args.num_ps), ("--seconds", args.seconds),
                                        ("--use-tf-config", args.use_tf_config or None))
               if value is not None]
    if args.ps:
        others = [flag for flag, given in (("--headline", args.headline),
                                           ("--scenarios", args.scenarios),
                                           ("--aims", args.aims),
                                           ("--optimizer", args.optimizer)) if given]
        if others:
            p.error(f"--ps is a run of its own; {', '.join(others)} "
                    f"{'goes' if len(others) == 1 else 'go'} with the other runs")
        args.cluster = None
        if args.use_tf_config:
            if args.num_ps is not None:
                p.error("--num-ps: with --use-tf-config the cluster of TF_CONFIG says how "
                        "many parameter servers there are")
            try:
                args.cluster = ps.cluster_of_tf_config()
            except ValueError as e:
                p.error(f"--use-tf-config: {e}")
        else:  # the whole cluster on this machine
            check_ps_memory(p, ps.sizes(args))
        return args
    if ps_only:
        p.error(f"{', '.join(ps_only)} {'goes' if len(ps_only) == 1 else 'go'} with the "
                "parameter-server run: add --ps")
    sized = [f"--{name}" for name in headline.USER_SIZES if getattr(args, name) is not None]
    if sized and not args.headline:
        if args.scenarios or args.aims:
            p.error(f"{', '.join(sized)} size the headline run (--headline); the full run "
                    "(--scenarios, --aims) has sizes of its own")
        args.headline = True
    if args.headline and args.scenarios:
        p.error("--scenarios picks parts of the full run; --headline is a run of its own")
    if args.headline and args.aims:
        p.error("--aims goes with the full run, not --headline")
    args.scenarios = set(args.scenarios.split(",")) if args.scenarios else set(SCENARIOS)
    unknown = args.scenarios - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios {', '.join(sorted(unknown))}; choose from "
                f"{', '.join(SCENARIOS)}")
    if args.headline:
        check_memory(p, headline.sizes(args))
    return args


def import_tensorflow(threads=THREADS):
    tf = _console.import_tensorflow()
    tf.get_logger().setLevel("ERROR")  # each contender has its own tf.function: no retrace noise
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def keras_version(tf):
    return getattr(tf.keras, "__version__", None) or __import__("keras").__version__


def environment(tf, args, cfg):
    torch = libraries.torch()
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine_words(), "cpu": describe_cpu(),
            "tensorflow": tf.__version__, "keras": keras_version(tf),
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


def save(results, out, path=None):
    with open(path or os.path.join(out, "results.json"), "w") as f:
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


def command_line(argv):
    return (PROG + " " + " ".join(argv if argv is not None else sys.argv[1:])).strip()


def write_report(results, args, argv):
    report = markdown(results, command_line(argv), developer=args.aims)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    print(report)


def installed_as():
    """The name fusedopt is installed under (a wheel's is e.g. fusedopt-tf2.21-cpu), or
    "fusedopt" (a source tree, Python 3.9)."""
    try:
        from importlib.metadata import packages_distributions
        return (packages_distributions().get("fusedopt") or ["fusedopt"])[0]
    except ImportError:
        return "fusedopt"


def plot_line(drawn, path):
    """The last line about the plot: where it is, or how to get one."""
    if drawn:
        return f"Plot: {path}"
    return (f"Plot: not drawn (matplotlib is not installed): pip install matplotlib (or "
            f"pip install '{installed_as()}[plot]') for the plot")


def not_compared_line(tf, full_run):
    """One line naming the peers this run leaves out and how to get them, or None."""
    missing = libraries.missing_peers(tf.__version__)
    if full_run and fbgemm.find_python()[0] is None:
        missing.append(FBGEMM_PEER)
    return ("Not compared (not installed here): " + "; ".join(missing) + "."
            if missing else None)


def quiet_peers():
    """Silences warnings the peers print on every run that say nothing about the results."""
    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


def start(args, stages, what):
    """The run's first lines: what it does, TensorFlow started, the peers left out."""
    print(f"fusedopt benchmark: {what}", flush=True)
    stages.begin("Starting TensorFlow")
    tf = import_tensorflow()
    stages.end(f"TensorFlow {tf.__version__}, Keras {keras_version(tf)}, {THREADS} threads")
    quiet_peers()
    line = not_compared_line(tf, full_run=not args.headline)
    if line:
        print(line, flush=True)
    return tf


def run_headline(args, argv):
    cfg = headline.sizes(args)
    stages = headline.stages()
    tf = start(args, stages, f"the headline numbers ({cfg['optimizer']}; about 2-3 minutes at "
                             "the default sizes)")
    os.makedirs(args.out, exist_ok=True)
    results = {"environment": environment(tf, args, cfg), "headline": headline.run(tf, cfg, stages)}
    json_path, plot_path = headline.output_paths(args.out)
    save(results, args.out, json_path)
    lines = headline.summary(results["headline"])
    print("\nSummary\n" + "\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"Command: `{command_line(argv)}`\n\n```\n" + "\n".join(lines) + "\n```\n")
    print(f"\nResults: {json_path}")
    print(plot_line(headline.plot(results["headline"], plot_path), plot_path))
    wrong = headline.mismatches(results["headline"])
    if wrong:
        print("implementations whose numbers differ from fusedopt's:", wrong, file=sys.stderr)
        return 1
    return 0


def run_largest_table(args, argv):
    """The --largest-table run: no TensorFlow in this process (each point's child starts its
    own), so this process holds none of the memory being measured."""
    cfg = largest_table.sizes(args.quick, args.dim, args.batch)
    rows, names = args.largest_table, args.contenders
    points = len(rows) * len(names)
    available = largest_table.mem_available()
    print(f"fusedopt benchmark: the largest table each optimizer trains: {len(names)} "
          f"optimizer{'s' * (len(names) > 1)} x {len(rows)} table size"
          f"{'s' * (len(rows) > 1)}, each in a process of its own"
          + (" (--quick: tiny sizes, the numbers mean nothing)" if args.quick else ""),
          flush=True)
    print("Memory available now: " + ("unknown" if available is None else
                                      f"{available / 1e9:,.1f} GB")
          + "; each run may allocate " + (f"{args.memory_limit:g} GB" if args.memory_limit
                                          else f"what is available when it starts (less "
                                               f"{largest_table.KEEP_FREE / 1e9:g} GB)")
          + " beyond TensorFlow's start-up", flush=True)
    os.makedirs(args.out, exist_ok=True)
    memory_limit = None if args.memory_limit is None else int(args.memory_limit * 1e9)
    start_environment = {"load_average_at_start": os.getloadavg(),
                         "mem_available_at_start_GB": (available or 0) / 1e9,
                         "quick": args.quick}
    sweep = largest_table.run(cfg, rows, names, memory_limit, _console.Stages(points))
    results = {"environment": {**largest_table.environment(cfg, sweep), **start_environment},
               "largest_table": sweep}
    path = os.path.join(args.out, "largest_table.json")
    save(results, args.out, path)
    report = largest_table.markdown(sweep, results["environment"], command_line(argv))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    print("\n" + report)
    print(f"Results: {path}")
    failed = [(label, p["rows"]) for label, e in sweep.items() if not label.startswith("_")
              for p in e["points"] if p["outcome"] == largest_table.FAILED]
    if failed:
        print("runs that failed for a reason other than memory:", failed, file=sys.stderr)
        return 1
    return 0


def run_ps(args, argv):
    """The --ps run. Ends the process itself (os._exit) once the cluster is stopped: the
    coordinator's threads would otherwise wait for the stopped servers at exit."""
    cfg = ps.sizes(args)

    def finish(status):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    why = ps.use_keras_2()
    if why:
        print(f"{PROG}: --ps {why}", file=sys.stderr)
        return 1
    print(f"fusedopt benchmark: training with parameter servers, a cluster on this machine "
          f"({cfg['rows']:,} x {cfg['dim']} table; "
          + ("tiny sizes: the numbers mean nothing" if args.quick else
             "a few minutes at the default sizes") + ")", flush=True)
    stages = _console.Stages(2 + len(ps.CONTENDERS))
    started = time.time()

    def progress(msg):
        print(f"      [{time.time() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    try:
        results = ps.run(cfg, stages, progress)
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted; every server process it started is stopped",
              file=sys.stderr)
        finish(130)
    except SystemExit as e:  # SIGTERM or SIGHUP (fusedopt.local_cluster)
        print(f"{PROG}: stopped by a signal; every server process it started is stopped",
              file=sys.stderr)
        finish(e.code if isinstance(e.code, int) else 1)
    except Exception as e:  # noqa: BLE001 - the cluster did not start, ...: one line
        why = getattr(e, "summary", None) or ps.one_line(e)  # ServerNotServing's: which, why
        print(f"{PROG}: the parameter-server run failed (every server process it started "
              f"is stopped): {why}", file=sys.stderr)
        finish(1)
    try:
        path = ps.save(results, args.out)
        text = ps.report(results, command_line(argv))
        print("\n" + text)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(text + "\n")
    except OSError as e:  # --out or --markdown not writable
        print(f"{PROG}: cannot write the results: {e}", file=sys.stderr)
        finish(1)
    print(f"\nResults: {path}")
    ours_failed = [label for label, r in results["runs"].items()
                   if "error" in r and label.startswith("fusedopt")]
    left_running = results["cluster"]["started_here"] and not results["cluster"]["stopped"]
    finish(1 if ours_failed or left_running else 0)


def main(argv=None):
    args = parse_args(argv)
    if args.largest_table_child is not None:  # run by largest_table.run_point, one point
        return largest_table.child(args.largest_table_child, import_tensorflow)
    if args.largest_table is not None:
        return run_largest_table(args, argv)
    if args.ps:
        return run_ps(args, argv)
    child = args.table_scaling_child or args.state_memory_child is not None or args.fbgemm_child
    if child:
        tf = import_tensorflow(args.fbgemm_child or THREADS)
        cfg = sizes(args.quick)
        if args.table_scaling_child:  # run by scenario_scaling with huge pages off
            return memory.table_scaling_child(tf, cfg)
        if args.state_memory_child is not None:  # run by scenario_state_memory, one contender
            return state.child(tf, args.state_memory_child, args.quick)
        return fbgemm_scenario.child(tf, cfg)  # run by scenario_sparse_fbgemm, other threads
    if args.headline:
        return run_headline(args, argv)
    try:  # before TensorFlow is imported: a damaged file costs no benchmark
        previous = previous_results(args)
    except ValueError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    selected = [name for name in SCENARIOS if name in args.scenarios]
    stages = _console.Stages(1 + len(selected))
    what = ("every scenario" + (" at tiny sizes (--quick: a check that all runs, the numbers "
                                "mean nothing)" if args.quick else f": {FULL_RUN_COST}")
            if len(selected) == len(SCENARIOS) else ", ".join(selected))
    tf = start(args, stages, what)
    cfg = sizes(args.quick)
    os.makedirs(args.out, exist_ok=True)
    started = time.time()

    def progress(msg):
        print(f"      [{time.time() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    results = start_results(tf, args, cfg, previous)
    for name in selected:
        stages.begin(f"{name}: {TITLES[name]}")
        results[name] = run_scenario(name, tf, cfg, progress, args)
        gc.collect()  # the previous scenario's variables (GBs at full size)
        save(results, args.out)  # after every scenario: a late failure keeps the rest
        stages.end("not run: " + FBGEMM_PEER if "_skipped" in results[name] and not args.aims
                   else "")
    if args.aims:
        results["aims"] = aims(results)
    else:  # an earlier run's would not describe these results
        results.pop("aims", None)
    save(results, args.out)
    plot_path = os.path.join(args.out, "benchmarks.png")
    drawn = plot(results, plot_path)
    print()
    write_report(results, args, argv)
    print(f"Results: {os.path.join(args.out, 'results.json')}")
    print(plot_line(drawn, plot_path))
    if mismatches(results):
        print("implementations whose numbers differ from fusedopt's:", mismatches(results),
              file=sys.stderr)
        return 1
    return 0
