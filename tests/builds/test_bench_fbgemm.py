"""The benchmark's FBGEMM CPU peer (scenario sparse_fbgemm, issue 33): tiny sizes, every row
present and FBGEMM's numbers equal to fusedopt's (no timing assertions).

The run needs FBGEMM's venv (FUSEDOPT_FBGEMM_PYTHON: ``export FUSEDOPT_FBGEMM_PYTHON=$(
tools/setup_fbgemm_env.sh)``; tools/test_all.sh sets it) and FAILS without it, naming that
command: the peer must not vanish silently from CI. It is `slow`: the fast tier does not
run it. The benchmark itself, without FBGEMM, skips the peer with one line (tested here
without FBGEMM).
"""
import json
import os
import subprocess
import sys

import pytest

import fbgemm_peer
from fusedopt.bench import config, fbgemm, fbgemm_scenario, report

# Independent of TensorFlow's version (FBGEMM in its own venv): one TF stage of CI runs it.
pytestmark = pytest.mark.once


@pytest.mark.slow
def test_quick_fbgemm_scenario_has_every_row_and_fbgemm_agrees(tmp_path):
    python = fbgemm_peer.python_or_fail()
    result = subprocess.run(
        [sys.executable, "-m", "fusedopt.bench", "--quick", "--aims", "--scenarios",
         "sparse_fbgemm", "--out", str(tmp_path), "--markdown", str(tmp_path / "report.md")],
        capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **{fbgemm.PYTHON_SETTING: python}))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    peer = json.loads((tmp_path / "results.json").read_text())["sparse_fbgemm"]
    assert peer["_meta"]["versions"]["fbgemm_gpu"] == "1.9.0"
    cfg = config.sizes(quick=True)
    seen = {(r["table_rows"], r["threads"], r["rule"], r["mode"]) for r in peer["rows"]}
    assert seen == {(rows, threads, rule, mode) for rows in cfg["fbgemm_tables"]
                    for threads in cfg["fbgemm_threads"] for rule in fbgemm.OPTIMIZERS
                    for mode in fbgemm_scenario.MODES.values()}
    for r in peer["rows"]:
        assert r["match"] and r["max_rel_error"] < 1e-5, r  # float rounding only
        assert r["fusedopt"]["median_ms"] > 0 and r["FBGEMM"]["median_ms"] > 0, r
        assert r["unique_ids"] < r["ids"]  # duplicates: both sum them
    text = (tmp_path / "report.md").read_text()
    assert "### FBGEMM CPU beside fusedopt" in text and "EXACT_ROWWISE_ADAGRAD" in text
    aims = [a for a in json.loads((tmp_path / "results.json").read_text())["aims"]
            if "vs FBGEMM CPU" in a["aim"]]
    largest = [r for r in peer["rows"] if r["table_rows"] == max(cfg["fbgemm_tables"])]
    assert len(aims) == len(largest) > 0
    for a, r in zip(aims, largest):
        assert a["value"] == r["x_fusedopt"] and a["target"] == ">= 2", (a, r)
        assert a["met"] == (r["x_fusedopt"] >= 2)


def test_fbgemm_aims_name_rule_mode_threads_and_table():
    from fusedopt.bench import aims
    row = dict(table_rows=1000, threads=2, rule="adagrad", fbgemm="EXACT_ADAGRAD",
               mode="update", x_fusedopt=1.5)
    smaller = dict(row, table_rows=10, x_fusedopt=9.0)
    got = aims.fbgemm_aims({"rows": [row, smaller]})
    assert got == [{"aim": "sparse adagrad vs FBGEMM CPU EXACT_ADAGRAD (update, 2 threads, "
                           "1,000 rows)", "value": 1.5, "target": ">= 2", "met": False}]
    assert aims.fbgemm_aims({"_skipped": "no FBGEMM"}) == []


def test_without_fbgemm_the_scenario_is_skipped_with_one_line(monkeypatch):
    monkeypatch.delenv(fbgemm.PYTHON_SETTING, raising=False)
    lines = []
    out = fbgemm_scenario.scenario_sparse_fbgemm(None, config.sizes(quick=True), lines.append,
                                                 quick=True)
    assert len(lines) == 1 and lines[0].startswith("FBGEMM CPU peer skipped")
    assert fbgemm.PYTHON_SETTING in lines[0] and "setup_fbgemm_env.sh" in lines[0]
    assert out == {"_skipped": out["_skipped"]}
    assert "Skipped:" in "\n".join(report.fbgemm_section(out))
