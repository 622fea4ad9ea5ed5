"""The embedding-scale scenarios of ``python -m fusedopt.bench`` (issue 32): optimizer state
and peak memory per contender (a child process each), and convergence of the compact-state
rules on the synthetic CTR model. Quick sizes; the numbers checked are exact (state bytes)
or loose sanity bounds (memory, loss), never speed."""
import json
import re
import subprocess
import sys

import pytest

from test_bench import internal_words, without_tf_log_setting

# Independent of TensorFlow's version (the benchmark harness): one TF stage of CI runs it.
pytestmark = pytest.mark.once

FULL_STATE = {"keras.optimizers.Adam": 8.0, "keras.optimizers.Adagrad": 4.0,
              "fusedopt.keras.LazyAdam": 8.0, "fusedopt.keras.Adagrad": 4.0}


# The full run's part that tests/builds/test_bench.py's quick run leaves to this file (the
# two runs, one file each, share CI's two workers; together they are every scenario).
SCENARIOS = ("state_memory", "convergence")


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    """A user's run of these scenarios (no --aims): what it prints, results.json, report.md."""
    out = tmp_path_factory.mktemp("bench_state")
    argv = ["--quick", "--scenarios", ",".join(SCENARIOS), "--out", str(out),
            "--markdown", str(out / "report.md")]
    # With the plot where matplotlib is installed, as a user runs it: a run without the
    # scaling scenario draws its panels without a legend, and warns nothing.
    code = "import sys\nfrom fusedopt.bench.cli import main\nsys.exit(main(%r))\n" % argv
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=without_tf_log_setting())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run, json.loads((out / "results.json").read_text()), (out / "report.md").read_text()


@pytest.fixture(scope="module")
def results(user_run):
    """The results with what --aims adds, and the --aims report, from the same numbers (what
    the command line does with --aims: aims(results), report.markdown(developer=True))."""
    from fusedopt.bench.aims import aims
    from fusedopt.bench.report import markdown

    data = dict(user_run[1])
    assert "aims" not in data  # a user's run has none
    data["aims"] = aims(data)
    return data, markdown(data, "python -m fusedopt.bench --quick --aims", developer=True)


@pytest.mark.slow
def test_the_user_run_prints_its_stages_and_no_internal_words(user_run):
    run, data, report = user_run
    text = run.stdout + run.stderr
    assert internal_words(text) == [], (internal_words(text), run.stdout[-3000:],
                                        run.stderr[-3000:])
    stages = re.findall(r"^\[(\d+)/(\d+)\] ", run.stdout, re.M)
    assert stages == [(str(n), str(len(SCENARIOS) + 1)) for n in range(1, len(SCENARIOS) + 2)]
    assert run.stdout.rstrip().splitlines()[-1].startswith("Plot: ")
    assert "Warning" not in run.stderr, run.stderr[-3000:]  # e.g. matplotlib's empty legends
    assert set(SCENARIOS) <= set(data)
    assert "### Embedding-scale optimizer state" in report
    assert "### Convergence: synthetic CTR model" in report
    assert report.count("| aim |") == 0 and internal_words(report) == [], internal_words(report)


@pytest.mark.slow
def test_state_memory_reports_exact_state_and_sane_memory(results):
    from fusedopt.bench.state import STATE_CONTENDERS

    rows = results[0]["state_memory"]
    meta = rows["_meta"]
    dim, table_mb = meta["dim"], meta["table_MB"]
    assert dim == 64 and table_mb == meta["rows"] * dim * 4 / 1e6
    assert set(rows) == {"_meta"} | {c.label for c in STATE_CONTENDERS}
    measured = {label: r for label, r in rows.items()
                if not label.startswith("_") and "not_available" not in r}
    expected = dict(FULL_STATE, **{"fusedopt.keras.RowWiseAdagrad": 4 / dim,
                                   "fusedopt.keras.PartialRowWiseAdam": 4 + 4 / dim,
                                   "fusedopt.keras.LazyAdam, bf16 slots": 4.0,
                                   "fusedopt.keras.Adagrad, bf16 slots": 2.0})
    # Every contender ran (compact slots exist now: none "not available").
    assert set(measured) == {c.label for c in STATE_CONTENDERS}, sorted(measured)
    for label, r in measured.items():
        assert "error" not in r, (label, r)
        if label in expected:  # exactly, in bytes (no scalar counted)
            assert r["state_bytes_per_param"] == expected[label], (label, r)
            assert r["state_bytes"] == expected[label] * meta["rows"] * dim
        assert r["state_vs_table"] == pytest.approx(r["state_bytes_per_param"] / 4)
        assert r["state_bytes"] == sum(s["bytes"] for s in r["slots"])
        assert r["rss_table_MB"] - r["rss_start_MB"] > 0.9 * table_mb  # the table is resident
        assert r["peak_MB"] >= r["rss_table_MB"] and r["peak_over_table_MB"] >= 0
        assert 0 < r["min_step_ms"] <= r["median_step_ms"] <= r["max_step_ms"]
        assert 0 < r["unique_ids_per_step"] <= meta["ids_per_step"]
    row_wise = measured["fusedopt.keras.RowWiseAdagrad"]
    assert [s["shape"] for s in row_wise["slots"]] == [[meta["rows"]]]
    # The slots a full-state rule writes are resident: at least its state over the table
    # (quick tables are above glibc's mmap threshold, so this is not allocator noise).
    for label in FULL_STATE:
        assert measured[label]["peak_over_table_MB"] > 0.9 * measured[label]["state_bytes"] / 1e6
    # (Row-wise's peak against Adagrad's is left to the full-size run: at the quick size
    # the step's own working memory, e.g. Keras 2.15's XLA-compiled update, is larger than
    # the slots, so the difference is not the state's; the state sizes are exact above.)


@pytest.mark.slow
def test_convergence_runs_every_pair_on_the_same_problem(results):
    from fusedopt.bench.convergence import PAIRS, RUNS

    conv = results[0]["convergence"]
    meta = conv["_meta"]
    assert set(conv["runs"]) == {c.label for c in RUNS}
    ran = {label: r for label, r in conv["runs"].items() if "not_available" not in r}
    assert set(ran) == {c.label for c in RUNS}  # bf16 slots (and stochastic rounding) too
    initial = {r["curve"][0][1] for r in ran.values()}
    assert len(initial) == 1  # the same initial weights and held-out set for every run
    (initial,) = initial
    assert 0.5 < initial < 0.8  # about log 2 from near-zero logits
    for label, r in ran.items():
        assert r["curve"][-1][0] == meta["steps"]
        assert r["held_out_log_loss"] == r["curve"][-1][1]
        assert meta["hidden_model_log_loss"] < r["held_out_log_loss"] < initial, (label, r)
    assert [(p["variant"], p["counterpart"]) for p in conv["pairs"]] == list(PAIRS)
    for p in conv["pairs"]:
        if p["variant"] in ran and p["counterpart"] in ran:
            a = ran[p["variant"]]["held_out_log_loss"]
            b = ran[p["counterpart"]]["held_out_log_loss"]
            assert p["rel_diff_pct"] == pytest.approx(100 * (a - b) / b)
        else:
            assert p["rel_diff_pct"] is None


@pytest.mark.slow
def test_report_and_aims_cover_both_scenarios(results):
    from fusedopt.bench.state import STATE_AIMS

    data, report = results
    assert "### Embedding-scale optimizer state" in report
    assert "### Convergence: synthetic CTR model" in report
    aims = {a["aim"]: a for a in data["aims"]}
    for text, *_ in STATE_AIMS:
        assert text in aims
    row_wise = aims[STATE_AIMS[0][0]]
    assert row_wise["value"] == 64 and row_wise["met"]  # 4 bytes a parameter / 4/64
    assert aims[STATE_AIMS[1][0]]["value"] == pytest.approx((4 + 4 / 64) / 8)
    for a in aims.values():  # measured or marked not measured, never half of it
        assert (a["value"] is None) == (a["met"] is None), a
    assert report.count("| aim |") == 1


def test_unavailable_storage_options_are_named_not_raised():
    from fusedopt.bench.state import Contender, Unavailable

    bogus = Contender("LazyAdam, made-up storage", "fusedopt.keras", "LazyAdam",
                      {"made_up_storage_option": 1})
    assert "made_up_storage_option" in bogus.unavailable()
    with pytest.raises(Unavailable):
        bogus.make()
    assert Contender("RowWiseAdagrad", "fusedopt.keras", "RowWiseAdagrad").unavailable() is None


def test_aims_of_missing_rows_are_not_measured():
    from fusedopt.bench import aims
    from fusedopt.bench.convergence import PAIRS_WITHIN_PCT

    rows = aims.state_memory_aims({"_meta": {}})
    assert rows and all(r["value"] is None and r["met"] is None for r in rows)
    pairs = {"pairs": [{"variant": "a", "counterpart": "b", "rel_diff_pct": None},
                       {"variant": "c", "counterpart": "b", "rel_diff_pct": 2.0}]}
    met = [r["met"] for r in aims.convergence_aims(pairs)]
    assert met == [None, 2.0 <= PAIRS_WITHIN_PCT]
