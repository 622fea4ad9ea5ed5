"""The benchmark suite's smoke run: every scenario runs on tiny sizes (the embedding-scale
ones in test_bench_state.py) and every contender produces fusedopt's numbers (no timing
assertions: speed is measured, not tested); what its users read (a user's run, --headline,
--help, the errors) holds no internal words."""
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from command_line import refused_in_one_line

# Independent of TensorFlow's version (the benchmark harness): one TF stage of CI runs it.
pytestmark = pytest.mark.once

# Words of the project's own bookkeeping that a user of the default run, --headline,
# --help or an error must never read (--aims, the developers' run, has them).
INTERNAL = [r"\bissues?\b", r"\bmoonshot\b", r"\baims?\b", r"\bNone\b", r"FUSEDOPT_",
            r"Traceback", r"I0000", r"W0000", r"cpu_feature_guard", r"UserWarning"]


def internal_words(text):
    return [m.group(0) for pattern in INTERNAL for m in re.finditer(pattern, text)]


def without_tf_log_setting():
    """This environment less TF_CPP_MIN_LOG_LEVEL: the bench quiets TensorFlow itself."""
    return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


# The quick run here: every scenario of the full run but the embedding-scale ones, which
# tests/builds/test_bench_state.py runs the same way (a user's run, no --aims) and checks:
# two runs in two files, which CI's two pytest workers run side by side.
QUICK_SCENARIOS = ("sparse", "sparse_xla", "dense", "dense_sizes", "scaling", "bandwidth",
                   "many_small", "sparse_fbgemm")


def test_the_two_quick_runs_are_the_whole_default_run():
    from fusedopt.bench import cli
    from test_bench_state import SCENARIOS as STATE_SCENARIOS

    assert cli.parse_args(["--quick"]).scenarios == set(cli.SCENARIOS)  # the default: all
    assert sorted(QUICK_SCENARIOS + STATE_SCENARIOS) == sorted(cli.SCENARIOS)
    assert not set(QUICK_SCENARIOS) & set(STATE_SCENARIOS)


@pytest.mark.slow
def test_quick_benchmark_runs_the_step_scenarios_and_contenders_agree(tmp_path):
    # A user's run (no aims): nothing internal in what it prints.
    result = subprocess.run(
        [sys.executable, "-m", "fusedopt.bench", "--quick", "--scenarios",
         ",".join(QUICK_SCENARIOS), "--out", str(tmp_path),
         "--markdown", str(tmp_path / "report.md")],
        capture_output=True, text=True, env=without_tf_log_setting())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert internal_words(result.stdout + result.stderr) == [], (
        internal_words(result.stdout + result.stderr), result.stdout[-3000:],
        result.stderr[-3000:])
    stages = re.findall(r"^\[(\d+)/(\d+)\] ", result.stdout, re.M)
    assert [int(n) for n, _ in stages] == list(range(1, len(QUICK_SCENARIOS) + 2)), \
        result.stdout[:3000]
    assert result.stdout.rstrip().splitlines()[-1].startswith("Plot: ")
    results = json.loads((tmp_path / "results.json").read_text())
    assert "aims" not in results
    from fusedopt.bench.aims import aims
    results["aims"] = aims(results)  # what --aims would add, from the same numbers
    for scenario in ("sparse", "sparse_xla", "dense", "dense_sizes", "scaling", "bandwidth",
                     "many_small", "aims"):
        assert scenario in results
    sparse = results["sparse"]
    from fusedopt.bench import sparse as sparse_bench
    from fusedopt.bench.contenders import COMPOSED_TF_OPS, ORACLE_COMPOSITION
    # Every rule beside its composition in TF ops; the tests' slower oracle is not timed.
    expected = {rule: {"fusedopt (raw op)", COMPOSED_TF_OPS} for rule in sparse}
    expected["lazy_adam"] |= {"tf.keras Adam", "tf.compat.v1 AdamOptimizer",
                              "fusedopt.keras.Adam (every row)"}
    expected["adagrad"] |= {"TF ResourceSparseApplyAdagradV2 (+dedup)", "tf.keras Adagrad"}
    expected["adamax"] |= {"tf.keras Adamax"}
    assert not any(ORACLE_COMPOSITION in rows for rows in sparse.values())
    if importlib.util.find_spec("torch") is not None:
        expected["lazy_adam"].add("torch SparseAdam")
    if importlib.util.find_spec("tensorflow_addons") is not None:
        expected["lazy_adam"].add("tensorflow_addons LazyAdam")
    if importlib.util.find_spec("tf_keras") is not None:
        expected["lazy_adam"].add("tf_keras legacy Adam")
    for rule, names in expected.items():
        assert names <= set(sparse[rule]), (rule, sorted(sparse[rule]))
    for rule, rows in sparse.items():  # every rule's step beside its floor (issue 33)
        meta = rows["_meta"]
        assert meta["floor_group_ms"] > 0 and meta["floor_rows_ms"] > 0, (rule, meta)
        assert meta["floor_ms"] == meta["floor_group_ms"] + meta["floor_rows_ms"]
        assert meta["fusedopt_x_floor"] == rows["fusedopt (raw op)"]["median_ms"] / meta["floor_ms"]
        assert 0 < meta["tf_function_call_ms"] < rows["fusedopt (raw op)"]["median_ms"] * 10
        assert 0 < meta["fusedopt_in_step_best_ms"] <= meta["fusedopt_in_step_ms"]
        assert meta["fusedopt_in_step_x_floor"] == meta["fusedopt_in_step_ms"] / meta["floor_ms"]
        assert (meta["fusedopt_in_step_best_x_floor"]
                == meta["fusedopt_in_step_best_ms"] / meta["floor_ms"])
        # the best of the rounds' probes, each interleaved with the op's calls
        assert meta["floor_ms"] == min(meta["floor_probes_ms"]), meta
        assert len(meta["floor_probes_ms"]) == sparse_bench.FLOOR_ROUNDS
    floor_aims = [a for a in results["aims"] if "/ the floor" in a["aim"]]
    # Every rule of the scenario, each row naming the CPU the ratio was measured on.
    cpu = results["environment"]["cpu"]["words"]
    assert [a["aim"] for a in floor_aims] == [
        f"sparse {rule} op in a training step / the floor on {cpu}, best of each"
        for rule in sparse if not rule.startswith("_")], floor_aims
    assert all(a["value"] > 0 and a["target"] == "<= 1.3" for a in floor_aims), floor_aims
    assert [a["value"] for a in floor_aims] == [
        rows["_meta"]["fusedopt_in_step_best_x_floor"] for rule, rows in sparse.items()
        if not rule.startswith("_")]
    assert cpu in results["environment"]["machine"]
    xla = {"fusedopt.keras.LazyAdam, XLA", "fusedopt (raw op), XLA",
           "fusedopt (raw op), XLA, HLO lowering", "fusedopt (raw op), no XLA", "tf.keras Adam, XLA"}
    assert len(results["sparse_xla"]) == 2  # two table sizes
    for rows_in_table, rows in results["sparse_xla"].items():
        assert xla <= set(rows), (rows_in_table, sorted(rows))
    assert len(results["dense_sizes"]) == 2  # two sizes
    for n, rows in results["dense_sizes"].items():
        assert {"fusedopt (raw op)", "TF fused kernel"} <= set(rows), (n, sorted(rows))
    many_small = results["many_small"]
    expected_small = {"fusedopt packed group op (raw)", "fusedopt group op (raw)",
                      "fusedopt per-variable ops (raw)",
                      "fusedopt group op (raw), v1 Session",
                      "fusedopt per-variable ops (raw), v1 Session",
                      "TF fused kernel per variable", "fusedopt.keras.LazyAdam (group op)",
                      "tf.keras Adam"}
    if importlib.util.find_spec("tf_keras") is not None:
        expected_small |= {"tf_keras legacy Adam", "fusedopt.keras.legacy.LazyAdam (group op)"}
    if importlib.util.find_spec("torch") is not None:
        expected_small |= {"torch Adam (foreach)", "torch Adam (fused)"}
        assert all("torch Adam (fused)" in rows for rows in results["dense_sizes"].values())
        for rows in results["dense_sizes"].values():  # the engine and torch, one set of buffers
            same = rows["_meta"]["same_buffers_ms"]
            assert set(same) == {"fusedopt engine (_core)", "torch Adam (fused)"}
            assert all(ms > 0 for ms in same.values())
            in_step = rows["_meta"]["in_step_ms"]  # the op in a training step, and torch's
            assert set(in_step) == {"fusedopt (raw op), 10 updates per call", "torch Adam (fused)"}
            assert all(ms > 0 for ms in in_step.values())
        dense_aims = [a for a in results["aims"] if a["aim"].startswith("dense Adam at")]
        assert [a["aim"] for a in dense_aims] == [
            f"dense Adam at {n:,} parameters{form} vs torch Adam (fused){where}"
            for n in sorted(map(int, results["dense_sizes"]))
            for form, where in ((", the op in a training step", ""),
                                (", the engine (fusedopt._core)", " on the same buffers"))]
    looped = ", {} steps per call".format(many_small["_meta"]["loop_steps"])
    expected_small |= {name + looped for name in (
        "fusedopt packed group op (raw)", "fusedopt group op (raw)",
        "fusedopt per-variable ops (raw)", "fusedopt.keras.LazyAdam (group op)",
        "tf.keras Adam")}
    assert expected_small <= set(many_small), sorted(many_small)
    for name, row in many_small.items():
        if not name.startswith("_"):
            assert row["match"] and row["max_rel_error"] < 1e-3, (name, row)
    for block in ("sparse", "sparse_xla", "dense", "dense_sizes"):
        for rule, rows in results[block].items():
            for name, row in rows.items():
                if not name.startswith("_"):
                    assert row["match"] and row["max_rel_error"] < 1e-3, (block, rule, name, row)
                    assert row["median_ms"] > 0
    from fusedopt import rules
    assert set(results["dense"]) == set(results["sparse"]) == set(rules.names())
    assert "TF fused kernel" in results["dense"]["adagrad"]
    assert (tmp_path / "report.md").read_text().count("| aim |") == 0
    probes = results["bandwidth"]["measured_GB_per_s"]
    assert {k.split()[0] for k in probes} == {"copy", "triad", "update", "update3"}
    assert all(v > 0 for v in probes.values())
    assert results["bandwidth"]["fusedopt_op_adam_GB_per_s"] > 0
    from fusedopt import bench
    assert results["scaling"]["huge_pages_MB"] is not None
    if bench.huge_pages_available():  # the child process with the ops' advice off ran
        small = results["scaling"]["table_rows_small_pages"]
        assert set(small) == set(results["scaling"]["table_rows"])
    # Flat in the table's size: every form, the two largest tables, per touched row.
    scaling = results["scaling"]
    assert set(scaling["table_rows_xla"]) == {"XLA, custom call", "XLA, HLO lowering"}
    largest_two = sorted(scaling["table_rows"], key=int)[-2:]
    for form, tables in scaling["table_rows_xla"].items():
        assert sorted(tables, key=int) == largest_two and all(v > 0 for v in tables.values())
    assert set(scaling["distinct_ids"]) == set(scaling["table_rows"])
    flat = [a for a in results["aims"] if a["aim"].startswith("step per touched row")]
    assert len(flat) == 3 + bench.huge_pages_available(), flat


def test_a_mismatch_in_any_contender_table_fails_the_run():
    from fusedopt.bench import cli

    def table(match):
        return {"fusedopt (raw op)": {"match": True}, "other": {"match": match}, "_meta": {}}

    results = {"sparse": {"lazy_adam": table(True)}, "sparse_xla": {"500": table(True)},
               "dense": {"adagrad": table(True)}, "many_small": {"other": {"match": True}}}
    assert cli.mismatches(results) == []
    for block, key in [("sparse", "lazy_adam"), ("sparse_xla", "500"), ("dense", "adagrad")]:
        broken = dict(results, **{block: {key: table(False)}})
        assert cli.mismatches(broken) == [(block, key, "other")]
    broken = dict(results, many_small={"other": {"match": False}})
    assert cli.mismatches(broken) == [("many_small", "other")]


def test_the_plain_tf_anchor_is_the_fastest_composition_present_and_named():
    """Ratios against "the same update in plain TF ops" use the fastest composition of TF
    ops in the table, whichever it is, and name it: in the report, the aims, the headline."""
    from fusedopt.bench import aims, headline, report
    from fusedopt.bench.contenders import COMPOSED_TF_OPS, fastest_composition

    def row(ms):
        return {"median_ms": ms, "min_ms": ms, "max_ms": ms, "x_fusedopt": ms / 2.0,
                "semantics": "lazy", "max_rel_error": 0.0, "match": True}

    lazy = {"fusedopt (raw op)": row(2.0), COMPOSED_TF_OPS: row(6.0),
            "tensorflow_addons LazyAdam": row(4.2), "tf.keras Adam": row(300.0),
            "torch SparseAdam": row(1.0), "_meta": {"unique_ids_per_step": 100}}
    assert fastest_composition("lazy_adam", lazy) == ("tensorflow_addons LazyAdam", lazy[
        "tensorflow_addons LazyAdam"])  # torch's is faster, but not TF ops; Keras's is dense
    sparse = {"lazy_adam": lazy,
              "adagrad": {"fusedopt (raw op)": row(2.0), COMPOSED_TF_OPS: row(5.0),
                          "tf.keras Adagrad": row(7.0),
                          "TF ResourceSparseApplyAdagradV2 (+dedup)": row(3.0),
                          "_meta": {}}}
    table = "\n".join(report.contender_table("Sparse", "sparse", sparse, developer=False))
    assert ("the fastest of the same lazy update in composed TF ops: tensorflow_addons "
            "LazyAdam, 2.10x fusedopt's step time") in table
    assert (f"the fastest of the same lazy update in composed TF ops: {COMPOSED_TF_OPS}, "
            "2.50x fusedopt's step time") in table
    anchor = [a for a in aims.sparse_aims(sparse) if "composition of TF ops" in a["aim"]]
    assert anchor == [aims.aim("sparse LazyAdam vs the fastest composition of TF ops: "
                               "tensorflow_addons LazyAdam", 2.1, 2)]
    assert headline.composition_line("lazy_adam", lazy) == (
        "  Fastest above in plain TF ops with the same lazy update (only the step's rows "
        "change): tensorflow_addons LazyAdam, 2.1x slower than fusedopt")
    del lazy["tensorflow_addons LazyAdam"]  # where tensorflow-addons is not installed
    assert headline.composition_line("lazy_adam", lazy) == (
        "  Fastest above in plain TF ops with the same lazy update (only the step's rows "
        "change): the same lazy update in plain TF ops (tensorflow-addons style), 3.0x slower "
        "than fusedopt")
    del lazy[COMPOSED_TF_OPS]
    assert headline.composition_line("lazy_adam", lazy) is None
    assert aims.sparse_aims(sparse)[1]["value"] is None  # not measured, not a failure


def test_memory_bandwidth_probe_validates_and_measures():
    import pytest
    from fusedopt import _core
    for kernel in ("copy", "triad", "update", "update3"):
        assert 0 < _core.memory_bandwidth(kernel, 4096, 2, 2) < 1e5
    with pytest.raises(ValueError, match="kernel must be"):
        _core.memory_bandwidth("scale", 4096)
    with pytest.raises(ValueError, match=r"16 \* num_threads <= n"):
        _core.memory_bandwidth("copy", 8, 1, 1)


# A damaged <out>/results.json (the results a partial re-run keeps): one line naming the
# file and the problem, exit status 2, before TensorFlow is imported or anything runs.
DAMAGED_RESULTS = {
    "truncated": ('{"environment": {"date": "2026-12-01"}, "dense": {"adag', "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "not_utf8": (b"\xff\xfe{}", "not valid JSON"),
    "array": ("[1, 2]", "an array, not an object of results"),
    "string": ('"results"', "a string, not an object of results"),
    "no_environment": ('{"dense": {}}', 'no "environment" object'),
    "scenario_not_object": ('{"environment": {}, "dense": [1]}',
                            "the 'dense' results are an array, not an object"),
    "scenario_rows_wrong": ('{"environment": {}, "sparse": {"lazy_adam": {"x": 1}}}',
                            "results not laid out as this version writes them (KeyError"),
    "directory": (None, "cannot be read (Is a directory)"),
}


def _damage_results(out, content):
    path = out / "results.json"
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


@pytest.mark.parametrize("name", sorted(DAMAGED_RESULTS))
def test_a_damaged_results_file_is_one_line_before_anything_runs(tmp_path, monkeypatch,
                                                                 capsys, name):
    from fusedopt.bench import cli

    content, problem = DAMAGED_RESULTS[name]
    path = _damage_results(tmp_path, content)

    def never(*args, **kwargs):
        raise AssertionError("ran past the damaged results file")

    monkeypatch.setattr(cli, "import_tensorflow", never)
    monkeypatch.setattr(cli, "run_scenario", never)
    assert cli.main(["--scenarios", "dense", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("python -m fusedopt.bench: %s: %s" % (path, problem)), err
    assert "move it away or choose another --out" in err


def test_recorded_results_are_kept_by_a_partial_rerun(tmp_path):
    """Control: the results files the repository records pass the same check."""
    from fusedopt.bench import cli

    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "bench")
    for recorded in ("results.json", os.path.join("tf215", "results.json")):
        with open(os.path.join(docs, recorded)) as f:
            text = f.read()
        (tmp_path / "results.json").write_text(text)
        args = cli.parse_args(["--scenarios", "dense", "--out", str(tmp_path)])
        assert cli.previous_results(args) == json.loads(text)


@pytest.mark.slow
def test_a_damaged_results_file_exits_2_from_the_command_line(tmp_path):
    _damage_results(tmp_path, DAMAGED_RESULTS["truncated"][0])
    proc = subprocess.run([sys.executable, "-m", "fusedopt.bench", "--scenarios", "dense",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "results.json: not valid JSON" in lines[0], proc.stderr


# --- what a user of the command line reads -------------------------------------------------

DOCS_BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "bench")


@pytest.mark.parametrize("recorded", ["results.json", os.path.join("tf215", "results.json")])
def test_the_user_report_of_every_recorded_section_has_no_internal_words(recorded):
    from fusedopt.bench import report

    with open(os.path.join(DOCS_BENCH, recorded)) as f:
        results = json.load(f)
    text = report.markdown(results, "python -m fusedopt.bench", developer=False)
    assert internal_words(text) == [], internal_words(text)
    assert "| aim |" not in text and "checked against" in text
    assert "distinct ids per step" in text  # the sparse tables' notes in words, not JSON
    developer = report.markdown(results, "python -m fusedopt.bench --aims", developer=True)
    assert developer.count("| aim |") == 1  # --aims: the project's targets, as before
    skipped = dict(results, sparse_fbgemm={"_skipped": "FUSEDOPT_FBGEMM_PYTHON is not set"})
    assert "FBGEMM" not in report.markdown(skipped, "x", developer=False)  # named once, earlier


def test_help_shows_the_modes_every_default_and_no_internal_words():
    from fusedopt.bench import cli

    text = cli.parser().format_help()
    assert text.startswith("usage: python -m fusedopt.bench "), text
    flowing = " ".join(text.split())  # as read, wherever argparse wraps a line
    for expected in ("--headline", "--aims", "--largest-table", "(default: 1,000,000)",
                     "(default: 64)", "(default: 16,384)", "(default: lazy_adam)",
                     "(default: bench_results)",
                     "pip install matplotlib, or fusedopt's [plot] extra", "row_wise_adagrad"):
        assert expected in flowing, expected
    # --aims itself is named (for developers); nothing else internal.
    assert internal_words(text.replace("--aims", "")) == [], internal_words(text)
    assert "``" not in text


@pytest.mark.parametrize("argv,message", [
    (["--rows", "0"], "argument --rows: must be at least 1, not 0"),
    (["--dim", "wide"], "argument --dim: 'wide' is not a whole number"),
    (["--batch", "-5"], "argument --batch: must be at least 1, not -5"),
    (["--optimizer", "sgd"], "argument --optimizer: 'sgd' is not one of fusedopt's optimizers: "
                             "lazy_adam, "),
    (["--rows", "100000000000"], "a 100,000,000,000 x 64 table needs about "),
    (["--rows", "1000", "--scenarios", "dense"], "--rows size the headline run (--headline)"),
    (["--headline", "--scenarios", "dense"], "--scenarios picks parts of the full run"),
    (["--headline", "--aims"], "--aims goes with the full run, not --headline"),
    (["--scenarios", "dense,speed"], "unknown scenarios speed; choose from sparse, "),
])
def test_bad_flags_are_one_line_and_exit_2_before_tensorflow(monkeypatch, capsys, argv, message):
    from fusedopt.bench import cli

    def never(*args, **kwargs):
        raise AssertionError("went past a bad flag")

    monkeypatch.setattr(cli, "import_tensorflow", never)
    err = refused_in_one_line(capsys, cli.main, argv)
    assert err.startswith("python -m fusedopt.bench: error: " + message), err
    assert internal_words(err.replace("--aims", "")) == [], err  # the flag the user typed


def test_user_sizes_imply_the_headline_and_override_only_what_is_given():
    from fusedopt.bench import cli, headline

    args = cli.parse_args(["--rows", "5,000", "--optimizer", "adagrad"])
    assert args.headline
    cfg = headline.sizes(args)
    assert (cfg["rows"], cfg["optimizer"]) == (5000, "adagrad")
    assert (cfg["dim"], cfg["batch"]) == (headline.SIZES["dim"], headline.SIZES["batch"])
    quick = headline.sizes(cli.parse_args(["--headline", "--quick", "--dim", "4"]))
    assert quick == dict(headline.QUICK_SIZES, dim=4)
    assert not cli.parse_args([]).headline


def test_missing_peers_are_named_once_with_how_to_install_them(monkeypatch):
    from fusedopt.bench import libraries

    monkeypatch.setattr(libraries, "torch", lambda: None)
    monkeypatch.setattr(libraries, "tf_keras", lambda: None)
    monkeypatch.setattr(libraries, "tensorflow_addons", lambda: None)
    assert libraries.missing_peers("2.21.0") == [
        "PyTorch (pip install torch)",
        "Keras 2's optimizers (pip install --no-deps tf-keras==2.21.*)",
        "tensorflow-addons' LazyAdam (it needs TensorFlow 2.15 or older)"]
    assert libraries.missing_peers("2.15.1")[-1] == \
        "tensorflow-addons' LazyAdam (pip install tensorflow-addons)"


def test_without_matplotlib_the_plot_is_one_line_saying_how_to_get_it(monkeypatch, tmp_path):
    from fusedopt.bench import cli, headline, report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    assert report.plot({}, str(tmp_path / "b.png")) is False
    assert headline.plot({}, str(tmp_path / "h.png")) is False
    monkeypatch.setattr(cli, "installed_as", lambda: "fusedopt-tf2.21-cpu")
    line = cli.plot_line(False, str(tmp_path / "h.png"))
    assert line == ("Plot: not drawn (matplotlib is not installed): pip install matplotlib "
                    "(or pip install 'fusedopt-tf2.21-cpu[plot]') for the plot")
    assert cli.plot_line(True, "out/h.png") == "Plot: out/h.png"


@pytest.mark.slow
def test_headline_at_tiny_sizes_prints_stages_and_a_summary(tmp_path):
    # --quick: the tests' tiny sizes. Without matplotlib and PyTorch (hidden), as on a
    # machine that has neither: each is named once, with how to get it.
    code = ("import sys\nsys.modules['matplotlib'] = sys.modules['torch'] = None\n"
            "from fusedopt.bench.cli import main\n"
            "sys.exit(main(['--headline', '--quick', '--rows', '3000', '--out', %r]))\n"
            % str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=without_tf_log_setting(), timeout=300)
    out, err = result.stdout, result.stderr
    assert result.returncode == 0, out[-3000:] + err[-3000:]
    assert internal_words(out + err) == [], (internal_words(out + err), out, err)
    assert [int(n) for n in re.findall(r"^\[(\d)/5\] ", out, re.M)] == [1, 2, 3, 4, 5], out
    assert out.count("Not compared (not installed here): PyTorch (pip install torch)") == 1
    summary = out[out.index("\nSummary\n"):]
    assert "a 3,000 x 8 table" in summary  # the size given; the others --quick's
    for row in ("fusedopt.keras.LazyAdam", "tf.keras Adam", "tf.compat.v1 AdamOptimizer",
                "the same lazy update in plain TF ops (tensorflow-addons style)",
                "keras.optimizers.Adam",
                "fusedopt.keras.RowWiseAdagrad"):
        assert re.search(r"^  %s  " % re.escape(row), summary, re.M), (row, summary)
    assert "torch" not in summary
    # The plain-TF anchor named, the fastest composition of TF ops that ran.
    assert re.search(r"^  Fastest above in plain TF ops with the same lazy update \(only the "
                     r"step's rows change\): .+, (about the same as|[\d,.]+x (slower|faster) "
                     r"than) fusedopt$", summary, re.M), summary
    assert re.fullmatch(r"Plot: not drawn \(matplotlib is not installed\): pip install "
                        r"matplotlib \(or pip install '\S*fusedopt\S*\[plot\]'\) for the plot",
                        out.rstrip().splitlines()[-1]), out
    saved = json.loads((tmp_path / "headline.json").read_text())["headline"]
    assert saved["_meta"]["rows"] == 3000 and saved["_meta"]["optimizer"] == "lazy_adam"
    assert all(r["match"] for block in ("sparse", "dense")
               for name, r in saved[block].items() if not name.startswith("_"))
    assert saved["state"]["fusedopt.keras.RowWiseAdagrad"]["state_bytes_per_param"] == 4 / 8
    assert not (tmp_path / "headline.png").exists()
