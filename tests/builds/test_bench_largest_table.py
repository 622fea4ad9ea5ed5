"""``python -m fusedopt.bench --largest-table``: every (optimizer, rows) point in a child
process capped in memory. The sweep runs for real at tiny sizes with a cap small enough that
Keras's Adam does not fit a 1M x 8 table: that outcome must be reported, not crash the run.
How a child's other endings (an abort, the kernel's kill, a bug) are reported is checked on
made-up child output; the flags' checks need no child at all."""
import json
import os
import subprocess
import sys

import pytest

from command_line import refused_in_one_line

# Independent of TensorFlow's version (the benchmark harness): one TF stage of CI runs it.
pytestmark = pytest.mark.once

STAGES = ("making the table", "building the optimizer state", "running a step")
NOT_FOR_USERS = ("None", "Traceback", "issue", "I0000", "cpu_feature_guard")


@pytest.mark.slow
def test_a_tiny_sweep_reports_what_fits_and_what_does_not(tmp_path):
    from fusedopt.bench.largest_table import DOES_NOT_FIT, FITS

    cap_gb = 0.1  # Keras's Adam on 1M x 8: 32 MB table, 64 MB of slots, dense temporaries
    run = subprocess.run(
        [sys.executable, "-m", "fusedopt.bench", "--largest-table", "1000", "1M", "--quick",
         "--contenders", "keras_adam", "--memory-limit", str(cap_gb), "--out", str(tmp_path),
         "--markdown", str(tmp_path / "report.md")],
        capture_output=True, text=True, timeout=240,
        env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "largest_table.json").read_text())
    assert set(results) == {"environment", "largest_table"}
    sweep = results["largest_table"]
    meta = sweep["_meta"]
    assert (meta["rows"], meta["dim"], meta["memory_limit_GB"]) == ([1000, 1_000_000], 8, cap_gb)
    adam = sweep["keras.optimizers.Adam"]
    assert set(sweep) == {"_meta", "keras.optimizers.Adam"}
    small, large = adam["points"]
    assert (small["rows"], small["outcome"]) == (1000, FITS), small
    assert small["steps_timed"] == 2 and small["steps_per_s"] > 0
    assert small["state_bytes"] == 2 * 1000 * 8 * 4 and small["table_bytes"] == 1000 * 8 * 4
    assert small["peak_MB"] >= small["rss_start_MB"] > 0
    assert small["oom_score_adj_1000"]  # the child is the kernel's first choice
    assert (large["rows"], large["outcome"]) == (1_000_000, DOES_NOT_FIT), large
    assert large["stage"] in STAGES[1:] and "OOM" in large["error"]  # the table itself fit
    assert large["memory_limit_GB"] == cap_gb
    # The cap held: resident memory stayed within it (plus libraries paged in meanwhile).
    assert large["peak_MB"] < large["rss_start_MB"] + 1e3 * cap_gb + 100, large
    assert (adam["largest_fit_rows"], adam["smallest_miss_rows"]) == (1000, 1_000_000)
    assert adam["bytes_per_row"] == 8 * 4 * 3  # the table's row and Adam's two slots
    report = (tmp_path / "report.md").read_text()
    assert report in run.stdout
    assert "| keras.optimizers.Adam | 96 (32 + 64) | 1,000 rows (" in report
    assert "| 1,000,000 rows: failed %s (table + state 96 MB) |" % large["stage"] in report
    assert f"does not fit in 100 MB: an allocation failed {large['stage']}" in report
    assert [w for w in NOT_FOR_USERS if w in run.stdout] == [], run.stdout
    if "TF_ENABLE_ONEDNN_OPTS" not in os.environ:  # the children ran with oneDNN off
        assert meta["onednn_opts"] == "0"
        assert "oneDNN optimisations were off in each process (TF_ENABLE_ONEDNN_OPTS=0" in report


def fake_child(monkeypatch, stdout_records, returncode, stderr=""):
    from fusedopt.bench import largest_table

    def run(*args, **kwargs):
        out = "\n".join(json.dumps(r) for r in stdout_records)
        return subprocess.CompletedProcess(args[0], returncode, out, stderr)
    monkeypatch.setattr(largest_table.subprocess, "run", run)


CAPPED = {"stage": "capped", "memory_limit_GB": 20.0, "rss_start_MB": 600.0}
CFG = dict(dim=32, batch=16, warmup=1, steps=2, min_steps=2, budget_s=1.0,
           huge_pages_wait_s=1.0, timeout_s=10.0)


@pytest.mark.parametrize("records,status,stderr,outcome,stage,words", [
    # C++ allocation failure (no one catches std::bad_alloc): the process aborts
    ([CAPPED, {"stage": "table made"}], -6,
     "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  "
     "std::bad_alloc\n", "does not fit", "building the optimizer state", "std::bad_alloc"),
    # the kernel's out-of-memory killer (memory ran out beyond the cap)
    ([CAPPED, {"stage": "table made"}, {"stage": "optimizer built"}], -9, "", "killed",
     "running a step", "out-of-memory killer"),
    # anything else is a failure, with the child's last line
    ([CAPPED], 1, "Traceback (most recent call last):\nValueError: bad shape\n", "failed",
     "making the table", "ValueError: bad shape"),
    # out of memory before the cap was set (TensorFlow's start): not this table's doing
    ([], -6, "std::bad_alloc\n", "failed", "starting TensorFlow", "std::bad_alloc"),
])
def test_a_child_that_ends_without_its_result_is_reported_as_what_ended_it(
        monkeypatch, records, status, stderr, outcome, stage, words):
    from fusedopt.bench import largest_table

    fake_child(monkeypatch, records, status, stderr)
    point = largest_table.run_point("lazy_adam", 1000, CFG, None, 10.0)
    assert (point["outcome"], point["stage"]) == (outcome, stage), point
    assert words in point["error"], point
    if records:
        assert point["memory_limit_GB"] == 20.0


def test_a_childs_own_result_is_taken_as_it_is(monkeypatch):
    from fusedopt.bench import largest_table

    result = {"outcome": "does not fit", "stage": "making the table", "error": "OOM",
              "memory_limit_GB": 1.0, "peak_MB": 900.0}
    fake_child(monkeypatch, [CAPPED, result], 0, "a warning\n")
    assert largest_table.run_point("keras_adam", 10, CFG, None, 10.0) == result


def test_the_summary_takes_the_largest_fit_and_the_smallest_miss():
    from fusedopt.bench import largest_table

    def fit(rows, steps_per_s):
        return {"rows": rows, "outcome": "fits", "table_bytes": rows * 128,
                "state_bytes": rows * 4, "steps_per_s": steps_per_s, "peak_MB": rows * 1e-4}

    points = [fit(10, 5.0), fit(30, 4.0),
              {"rows": 100, "outcome": "does not fit", "stage": "making the table"},
              {"rows": 300, "outcome": "killed"}, {"rows": 50, "outcome": "failed"}]
    summary = largest_table._summary(points, 32)
    assert summary == {"bytes_per_row": 132, "table_bytes_per_row": 128,
                       "state_bytes_per_row": 4, "largest_fit_rows": 30,
                       "steps_per_s_there": 4.0, "peak_GB_there": 30 * 1e-7,
                       "smallest_miss_rows": 100, "smallest_miss_stage": "making the table"}
    nothing = largest_table._summary([{"rows": 5, "outcome": "does not fit"}], 32)
    assert nothing["largest_fit_rows"] is None and nothing["bytes_per_row"] is None


@pytest.mark.parametrize("text,rows", [("100M", 100_000_000), ("1.5M", 1_500_000),
                                       ("500k", 500_000), ("30,000,000", 30_000_000),
                                       ("1.1M", 1_100_000), ("1_000", 1000), ("7", 7)])
def test_row_counts_read_as_people_write_them(text, rows):
    from fusedopt.bench.largest_table import table_rows

    assert table_rows(text) == rows


@pytest.mark.parametrize("argv,message", [
    (["--largest-table", "ten"], "argument --largest-table: 'ten' is not a row count"),
    (["--largest-table", "0.5K5"], "argument --largest-table: '0.5K5' is not a row count"),
    (["--largest-table", "1.0000001K"], "argument --largest-table: '1.0000001K' is not a "
                                        "whole number of rows"),
    (["--largest-table", "--rows", "5"], "--rows sizes the headline run; --largest-table "
                                         "takes its table sizes itself"),
    (["--largest-table", "--contenders", "sgd"], "--contenders: unknown optimizers sgd; "
                                                 "choose from row_wise_adagrad, "),
    (["--largest-table", "--headline"], "--largest-table is a run of its own"),
    (["--largest-table", "--memory-limit", "0"], "--memory-limit must be above 0 GB, not 0"),
    (["--contenders", "keras_adam"], "--contenders and --memory-limit go with --largest-table"),
])
def test_bad_sweep_flags_are_one_line_and_exit_2(capsys, argv, message):
    from fusedopt.bench import cli

    err = refused_in_one_line(capsys, cli.main, argv)
    assert err.startswith("python -m fusedopt.bench: error: " + message), err


def test_sweep_flags_pick_sizes_and_optimizers():
    from fusedopt.bench import cli, largest_table

    args = cli.parse_args(["--largest-table", "100M", "10M", "10,000,000", "--dim", "16",
                           "--contenders", "keras_adam,row_wise_adagrad"])
    assert args.largest_table == [10_000_000, 100_000_000]  # sorted, once each
    assert args.contenders == ["keras_adam", "row_wise_adagrad"] and not args.headline
    assert largest_table.sizes(False, args.dim, args.batch)["dim"] == 16
    assert cli.parse_args(["--largest-table"]).largest_table == list(largest_table.DEFAULT_ROWS)
    quick = cli.parse_args(["--largest-table", "--quick"])
    assert quick.largest_table == list(largest_table.QUICK_ROWS)
    assert quick.contenders == list(largest_table.CONTENDERS)
    assert "--largest-table" in cli.parser().format_help()


def test_an_allocation_error_is_named_by_its_line_that_says_so():
    from fusedopt.bench.largest_table import error_words, out_of_memory

    class ResourceExhaustedError(Exception):
        pass

    error = ResourceExhaustedError(
        "Graph execution error:\n\n{{function_node __wrapped__Fill_device_/job:localhost}} "
        "OOM when allocating tensor with shape[100,32] and type float")
    assert out_of_memory(error) and not out_of_memory(ValueError("bad shape"))
    assert error_words(error) == ("ResourceExhaustedError: OOM when allocating tensor with "
                                  "shape[100,32] and type float")


RECORDED = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "bench",
                        "largest_table.json")


def test_the_recorded_sweep_reads_for_users():
    from fusedopt.bench import largest_table

    with open(RECORDED) as f:
        recorded = json.load(f)
    report = largest_table.markdown(recorded["largest_table"], recorded["environment"],
                                    "python -m fusedopt.bench --largest-table")
    assert [w for w in NOT_FOR_USERS if w in report] == [], report
    assert "| fusedopt.keras.RowWiseAdagrad | 132 (128 + 4) | 150,000,000 rows" in report
    assert report.count("\n| keras.optimizers.Adam |") == 2  # the summary and the grid


@pytest.mark.parametrize("environ,value", [({}, "0"), ({"TF_ENABLE_ONEDNN_OPTS": "1"}, "1"),
                                           ({"TF_ENABLE_ONEDNN_OPTS": "0"}, "0")])
def test_children_run_with_onednn_off_unless_the_user_set_it(monkeypatch, environ, value):
    """With oneDNN on (TensorFlow's default on AVX-512 CPUs), TF 2.21 crashed (SIGSEGV) about
    every other time an allocation was refused under the cap: children turn it off, unless
    the user chose; the rest of the environment is passed on."""
    from fusedopt.bench import largest_table

    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FUSEDOPT_SOMETHING_ELSE", "kept")
    seen = {}

    def run(args, **kwargs):
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(args, 0, json.dumps({"outcome": "fits"}), "")
    monkeypatch.setattr(largest_table.subprocess, "run", run)
    largest_table.run_point("keras_adam", 1000, CFG, None, 10.0)
    assert seen["TF_ENABLE_ONEDNN_OPTS"] == value
    assert seen["FUSEDOPT_SOMETHING_ELSE"] == "kept"
    meta = {"onednn_opts": value}
    words = largest_table.onednn_words(meta)
    assert ("were off in each process" in words) == (value == "0"), words
    assert largest_table.onednn_words({}) == ""  # a file an earlier version wrote
