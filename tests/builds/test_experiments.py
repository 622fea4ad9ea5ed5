"""The experiments BENCHMARKS.md quotes (benchmarks/experiments/): each still runs.

A/B tools that compare two settings of the op library in separate processes, and plain
C++ probes of a memory pattern without TensorFlow, at their quick sizes.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

# Independent of TensorFlow's version (the experiment tools): one TF stage of CI runs it.
pytestmark = pytest.mark.once

EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "benchmarks", "experiments")


def run_ab_tool_quick(name, tmp_path):
    """Runs benchmarks/experiments/<name> --quick --rounds 1 and returns the JSON it wrote."""
    out = tmp_path / "ab.json"
    tool = os.path.join(EXPERIMENTS, name)
    proc = subprocess.run([sys.executable, tool, "--quick", "--rounds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_isa_ab_tool_runs_both_loops(tmp_path):
    """benchmarks/experiments/isa_ab.py (BENCHMARKS.md's AVX2 A/B) in its quick form: each process reports the
    loop it ran, and every step has a time for both."""
    result = run_ab_tool_quick("isa_ab.py", tmp_path)
    assert [r["isa"] for r in result["runs"]["baseline"]] == ["baseline"]
    assert result["runs"]["default"][0]["isa"] in ("avx2", "baseline")
    assert set(result["summary"]) == {"dense_4096", "many_small_group"}
    for row in result["summary"].values():
        assert row["default_ms"] > 0 and row["baseline_ms"] > 0


@pytest.mark.slow
def test_separation_ab_tool_runs_both_settings(tmp_path):
    """benchmarks/experiments/separation_ab.py (BENCHMARKS.md's buffer-separation A/B) in its quick form: each
    setting's processes report their setting, every step has a time for both, and nothing
    moves with the setting off."""
    result = run_ab_tool_quick("separation_ab.py", tmp_path)
    assert [r["moved"]["enabled"] for r in result["runs"]["on"]] == [True]
    assert [r["moved"] for r in result["runs"]["off"]] == [
        dict(enabled=False, moved_buffers=0, moved_bytes=0, failures=0)]
    assert set(result["summary"]) == {"dense, setup 0", "dense, setup 1",
                                      "sparse [1,024, 64], 64 ids"}
    for row in result["summary"].values():
        assert row["on_ms"] > 0 and row["off_ms"] > 0


@pytest.mark.parametrize("tool,args,expect", [
    ("cache_alias_probe.cc", ["65536", "1048576", "4096", "8192", "12288"], "ms"),
    ("table_rows_probe.cc", ["20000", "1", "8", "sorted"], "rows 20000 huge 1 distance 8 sorted"),
])
def test_cpp_probes_compile_warning_free_and_run(tmp_path, tool, args, expect):
    """The plain C++ probes BENCHMARKS.md quotes (no TensorFlow), at tiny sizes."""
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed (the project's builds need it too)")
    source = os.path.join(EXPERIMENTS, tool)
    binary = str(tmp_path / "probe")
    subprocess.run(["g++", "-O2", "-mavx2", "-pthread", "-Wall", "-Wextra", "-Werror", "-o",
                    binary, source], check=True, capture_output=True, text=True, timeout=300)
    proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout


@pytest.mark.slow
def test_core_build_ab_builds_this_tree_and_compares_it_with_the_installed_core(tmp_path):
    """benchmarks/experiments/core_build_ab.py (BENCHMARKS.md's prefetch A/B): `build` makes a
    _core from this tree that imports and steps; `compare` (quick) times it beside the
    installed one, every step of both builds."""
    import fusedopt._core
    tool = os.path.join(EXPERIMENTS, "core_build_ab.py")
    built = tmp_path / "built"
    proc = subprocess.run([sys.executable, tool, "build", str(built)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "ab.json"
    proc = subprocess.run([sys.executable, tool, "compare",
                           os.path.dirname(fusedopt._core.__file__), str(built), "--quick",
                           "--rounds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    steps = {f"{rule}, {t}" for rule in ("adagrad", "lazy_adam") for t in ("1 thread", "2 threads")}
    assert set(result["summary"]) == steps
    for row in result["summary"].values():
        assert len(row["a_ms"]) == len(row["b_ms"]) == 1
        assert row["a_ms"][0] > 0 and row["b_ms"][0] > 0


@pytest.mark.slow
def test_table_size_flat_tool_times_every_form_at_both_sizes(tmp_path):
    """benchmarks/experiments/table_size_flat.py (BENCHMARKS.md's "flat in the table's size")
    in its quick form: every form (tf.function, both XLA lowerings) and the floor probe at
    both table sizes, and the ratio per touched row from those times."""
    result = run_ab_tool_quick("table_size_flat.py", tmp_path)
    assert set(result["summary"]) == {"tf.function", "XLA custom call", "XLA HLO lowering",
                                      "floor (plain C++)"}
    small, large = (str(r) for r in result["sizes"])
    for name, row in result["summary"].items():
        assert row["small_ms"] > 0 and row["large_ms"] > 0, name
        ratio = ((row["large_ms"] / result["unique_ids"][large])
                 / (row["small_ms"] / result["unique_ids"][small]))
        assert abs(row["per_touched_row_large_over_small"] - ratio) < 1e-9, name
    assert len(result["runs_ms"]) == 2 * 3


def test_sparse_phases_builds_against_the_engine_and_reports_every_pool(tmp_path):
    """benchmarks/experiments/sparse_phases.cc (BENCHMARKS.md's "where the floor's gap
    goes"): the engine's own headers, built warning-free, at a tiny table: one line per
    rule and round, every figure positive (it exits 1 first if its grouping split over
    threads makes other groups than one thread's)."""
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed (the project's builds need it too)")
    root = os.path.dirname(os.path.dirname(EXPERIMENTS))
    binary = str(tmp_path / "phases")
    built = subprocess.run(["g++", "-std=c++20", "-O2", "-fno-math-errno", "-pthread", "-Wall",
                            "-Wextra", "-Werror", "-I", root, "-o", binary,
                            os.path.join(EXPERIMENTS, "sparse_phases.cc")],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    proc = subprocess.run([binary, "5000", "2000", "2"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rules = ["row_wise_adagrad", "lazy_adam", "partial_row_wise_adam", "adagrad"]
    assert [line.split(" round ")[0] for line in lines] == [r for r in rules for _ in (1, 2)]
    for line in lines:
        figures = [float(word) for word in line.replace(",", " ").replace(")", " ").split()
                   if word.replace(".", "", 1).isdigit() and "." in word]
        assert len(figures) == 8 and all(f > 0 for f in figures), line
    bad = subprocess.run([binary, "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr
