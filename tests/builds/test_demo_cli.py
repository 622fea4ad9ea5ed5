"""``python -m fusedopt.demo`` as a new user meets it: ``--help`` (its program name, every
default, no markup), ``--quick`` changing only the sizes not given, bad sizes refused in
one line, stages on stdout, a progress line on stderr, TensorFlow's log quiet, and the
results explained (the speed-up, why the losses differ)."""
import io
import math
import os
import re
import subprocess
import sys

import pytest

from command_line import refused_in_one_line
from fusedopt import _console, demo

# What a user should never see in --help: reStructuredText and Sphinx markup.
MARKUP = ("``", ":class:", ":func:", ".. ", "demo.py")


def test_help_names_the_program_and_shows_every_default():
    text = demo.parser().format_help()
    assert text.startswith("usage: python -m fusedopt.demo "), text
    for markup in MARKUP:
        assert markup not in text, markup
    help_of = {}
    for action in demo.parser()._actions:  # each option's own help, as printed
        if action.option_strings and action.help:
            help_of[action.option_strings[-1]] = " ".join(
                demo.parser()._get_formatter()._expand_help(action).split())
    for flag in ("--dim", "--bag", "--lr", "--zipf", "--seed", "--api"):
        assert "(default: " in help_of[flag], (flag, help_of[flag])
    assert "(default: 0)" in help_of["--seed"]  # a default of 0 is shown too
    for flag, name in (("--rows", "rows"), ("--batch", "batch"), ("--steps", "steps")):
        full, quick = demo.SIZES[name]
        assert f"(default: {full:,}; with --quick: {quick:,})" in help_of[flag], help_of[flag]


@pytest.mark.parametrize("argv,expected", [
    ([], {"rows": 1_000_000, "batch": 2048, "steps": 200}),
    (["--quick"], {"rows": 300_000, "batch": 1024, "steps": 60}),
    (["--quick", "--rows", "5000"], {"rows": 5000, "batch": 1024, "steps": 60}),
    (["--rows", "5000", "--quick", "--steps", "7"], {"rows": 5000, "batch": 1024, "steps": 7}),
    (["--quick", "--rows", "5000", "--batch", "3", "--steps", "2"],
     {"rows": 5000, "batch": 3, "steps": 2}),
    (["--batch", "64"], {"rows": 1_000_000, "batch": 64, "steps": 200}),
])
def test_quick_changes_only_the_sizes_not_given(argv, expected):
    args = demo.parse_args(argv)
    assert {name: getattr(args, name) for name in expected} == expected
    assert args.quick == ("--quick" in argv)


def test_the_first_lines_say_the_sizes_and_the_expected_time_of_a_preset():
    quick = demo.describe(demo.parse_args(["--quick"]))
    assert "300,000 x 32 (38 MB)" in quick and "expected time: under a minute" in quick
    assert "expected time: about 3 minutes" in demo.describe(demo.parse_args([]))
    mine = demo.describe(demo.parse_args(["--quick", "--rows", "5000"]))
    assert "5,000 x 32 (0.64 MB)" in mine and "expected time" not in mine  # unknown there


@pytest.mark.parametrize("argv,message", [
    (["--rows", "0"], "argument --rows: must be at least 1, not 0"),
    (["--steps", "ten"], "argument --steps: 'ten' is not a whole number"),
    (["--lr", "-1"], "argument --lr: must be a number above 0, not -1"),
    (["--zipf", "1"], "argument --zipf: must be above 1, not 1.0"),
    (["--tf1", "ref", "--estimator", "2"], "--tf1 and --estimator are different variants"),
    (["--api", "ops", "--keras-embedding"], "--keras-embedding goes with the Keras variant"),
])
def test_bad_arguments_are_refused_in_one_line(capsys, argv, message):
    err = refused_in_one_line(capsys, demo.parse_args, argv)
    assert err.startswith("python -m fusedopt.demo: error: " + message), err
    assert err.rstrip().endswith("(python -m fusedopt.demo --help lists the options)"), err


def test_report_explains_the_speed_up_and_the_losses(capsys):
    args = demo.parse_args(["--rows", "300000"])
    demo.report([("fusedopt.keras LazyAdam", 0.6931, 0.62, 0.005),
                 ("keras Adam", 0.6931, 0.621, 0.2)], args)
    out = capsys.readouterr().out
    assert "fusedopt.keras LazyAdam is 40.0x as fast as keras Adam" in out
    loss_lines = [line for line in out.splitlines() if line.startswith("Loss:")]
    assert len(loss_lines) == 1 and "lazy Adam" in loss_lines[0], out
    assert "only the rows each batch looks up" in loss_lines[0]
    assert "table is small" not in out
    # A small table: the gap is small, and the report says why and what to try.
    demo.report([("fusedopt.keras LazyAdam", 0.6931, 0.62, 0.003),
                 ("keras Adam", 0.6931, 0.621, 0.004)], demo.parse_args(["--rows", "1000"]))
    out = capsys.readouterr().out
    assert "the table is small (1,000 rows)" in out and "--rows 1000000" in out


def test_progress_is_a_line_each_tenth_off_a_terminal_and_redrawn_on_one():
    log = io.StringIO()
    progress = _console.Progress(50, "steps", stream=log)
    for done in range(51):
        progress.update(done, "loss 0.5")
    progress.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in log.getvalue(), lines
    assert lines[-1].startswith("  50/50 steps  loss 0.5  "), lines

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    progress = _console.Progress(3, "steps", stream=term)
    for done in range(4):
        progress.update(done)
    progress.close()
    text = term.getvalue()
    assert "\n" not in text and text.count("\r") >= 3 and "[" + "#" * 24 + "] 3/3" in text
    assert text.endswith("\r")  # cleared: the next output starts at column 0


@pytest.mark.slow
def test_help_from_the_command_line_imports_no_tensorflow():
    code = ("import sys, runpy; sys.argv = ['x', '--help']\n"
            "try:\n    runpy.run_module('fusedopt.demo', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0\n"
            "assert 'tensorflow' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m fusedopt.demo ")


@pytest.mark.slow
def test_a_run_shows_stages_and_progress_and_keeps_tensorflow_quiet():
    # TF_CPP_MIN_LOG_LEVEL unset, as for a new user: the demo quiets TensorFlow itself.
    env = {k: v for k, v in os.environ.items() if k != _console.TF_LOG_SETTING}
    result = subprocess.run(
        [sys.executable, "-m", "fusedopt.demo", "--quick", "--rows", "5000", "--batch", "128",
         "--steps", "20"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out, err = result.stdout, result.stderr
    assert "5,000 x 32" in out and "20 steps per optimizer" in out  # the sizes given
    stages = re.findall(r"^\[(\d)/3\] (.*)$", out, re.M)
    assert [n for n, _ in stages] == ["1", "2", "3"], out
    assert stages[1][1].startswith("Training with fusedopt.keras LazyAdam")
    assert out.count("      done in ") == 3
    rows = dict(re.findall(r"^(fusedopt.keras LazyAdam|keras Adam)\s+([\d.]+ +[\d.]+ +[\d.]+)$",
                           out, re.M))
    assert set(rows) == {"fusedopt.keras LazyAdam", "keras Adam"}, out
    for numbers in rows.values():
        first, final, _ = map(float, numbers.split())
        assert abs(first - math.log(2)) < 0.01 and final < first
    assert "x as fast as keras Adam" in out and "lazy Adam" in out
    assert re.search(r"^  20/20 steps  loss [\d.]+, [\d.]+ ms/step", err, re.M), err
    for noise in ("I0000", "W0000", "cpu_feature_guard", "absl::InitializeLog", "oneDNN"):
        assert noise not in err, err
    assert "Traceback" not in err


# What TensorFlow 2.21 printed while loading on an AVX-512 Xeon, whatever
# TF_CPP_MIN_LOG_LEVEL said (absl logging before it is set up), and lines that must stay.
ABSL_NOTICE = ("WARNING: All log messages before absl::InitializeLog() is called are written "
               "to STDERR")
ONEDNN_INFO = ("I0000 00:00:1796680755.304542   20142 port.cc:153] oneDNN custom operations "
               "are on. You may see slightly different numerical results")
ABSL_WARNING = "W1207 21:40:01.123456    20142 cpu_feature_guard.cc:210] a warning"
ABSL_ERROR = "E0000 00:00:1796680755.304542   20142 some_kernel.cc:12] an error"


@pytest.mark.parametrize("level,hidden", [
    (0, []), (1, [ONEDNN_INFO]), (2, [ABSL_NOTICE, ONEDNN_INFO, ABSL_WARNING]),
    (3, [ABSL_NOTICE, ONEDNN_INFO, ABSL_WARNING, ABSL_ERROR])])
def test_load_noise_is_what_the_log_level_hides(level, hidden):
    lines = [ABSL_NOTICE, ONEDNN_INFO, ABSL_WARNING, ABSL_ERROR, "Traceback (most recent call)",
             "I0000 without the rest of absl's prefix"]
    assert [line for line in lines if _console.is_load_noise(line + "\n", level)] == hidden


@pytest.mark.parametrize("value,level", [("2", 2), ("0", 0), ("3", 3), ("9", 3), ("-1", 0),
                                         ("", 0), (None, 0), ("two", 0)])
def test_log_level_reads_the_setting_as_tensorflow_does(value, level):
    assert _console.log_level(value) == level


def _filtered_in_a_process(body):
    """Runs `body` (Python, indented 8) inside stderr_without_load_noise(2) in a process of
    its own, whose descriptor 2 and sys.stderr are the real ones; its stderr."""
    code = ("import os, sys\nfrom fusedopt import _console\nLINES = %r\n"
            "try:\n    with _console.stderr_without_load_noise(2):\n%s\n"
            "except ImportError:\n    print('raised', file=sys.stderr)\n"
            % ([ABSL_NOTICE, ONEDNN_INFO, ABSL_WARNING, ABSL_ERROR], body))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    return result.stderr


def test_load_noise_is_dropped_from_the_descriptor_and_the_rest_kept_in_order():
    # C++ writes straight to descriptor 2; Python's sys.stderr goes there too.
    err = _filtered_in_a_process(
        "        os.write(2, ('\\n'.join(LINES[:2]) + '\\n').encode())\n"
        "        print('a Python line', file=sys.stderr)\n"
        "        os.write(2, (LINES[3] + '\\n' + LINES[2] + '\\nlast, no newline').encode())\n"
        "    print('after', file=sys.stderr)")
    assert err == f"a Python line\n{ABSL_ERROR}\nlast, no newlineafter\n"


def test_what_is_written_before_an_error_inside_still_comes_out():
    err = _filtered_in_a_process("        os.write(2, (LINES[1] + '\\nwhy it failed\\n').encode())\n"
                                 "        raise ImportError('no such module')")
    assert err == "why it failed\nraised\n"
