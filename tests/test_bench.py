"""The benchmark suite's smoke run: every scenario runs on tiny sizes and every contender
produces fusedopt's numbers (no timing assertions: speed is measured, not tested)."""
import importlib.util
import json
import os
import subprocess
import sys


def test_quick_benchmark_runs_every_scenario_and_contenders_agree(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "fusedopt.bench", "--quick", "--out", str(tmp_path),
         "--markdown", str(tmp_path / "report.md")],
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    for scenario in ("sparse", "dense", "scaling", "bandwidth", "many_small", "aims"):
        assert scenario in results
    sparse = results["sparse"]
    expected = {
        "lazy_adam": {"fusedopt (raw op)", "composed gather/scatter", "tf.keras Adam",
                      "tf.compat.v1 AdamOptimizer"},
        "adagrad": {"fusedopt (raw op)", "composed gather/scatter",
                    "TF ResourceSparseApplyAdagradV2 (+dedup)", "tf.keras Adagrad"},
        "adamax": {"fusedopt (raw op)", "composed gather/scatter", "tf.keras Adamax"},
    }
    if importlib.util.find_spec("torch") is not None:
        expected["lazy_adam"].add("torch SparseAdam")
    if importlib.util.find_spec("tf_keras") is not None:
        expected["lazy_adam"].add("tf_keras legacy Adam")
    for rule, names in expected.items():
        assert names <= set(sparse[rule]), (rule, sorted(sparse[rule]))
    for block in ("sparse", "dense"):
        for rule, rows in results[block].items():
            for name, row in rows.items():
                if not name.startswith("_"):
                    assert row["match"] and row["max_rel_error"] < 1e-3, (block, rule, name, row)
                    assert row["median_ms"] > 0
    assert set(results["dense"]) == {"lazy_adam", "adamax", "adagrad"}
    assert "TF fused kernel" in results["dense"]["adagrad"]
    assert (tmp_path / "report.md").read_text().count("| aim |") == 1
