"""Every script of examples/ runs, at small sizes, and says in plain words what it did.

Each example is run as a user runs it (``python examples/<name>.py --rows ...``), in a
subprocess with the fusedopt this test imports. An example runs where its requirements are
met and is skipped, saying which environment runs it, elsewhere: Keras 3 examples on
TensorFlow >= 2.16, the Estimator and tensorflow-addons ones on TensorFlow 2.15 (CI runs
both stages, so each runs in CI).
"""
import ast
import importlib.util
import os
import subprocess
import sys

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
pytestmark = pytest.mark.slow

TF_MINOR = tuple(int(x) for x in tf.__version__.split(".")[:2])
KERAS3 = TF_MINOR >= (2, 16)
HAS_TF_KERAS = TF_MINOR < (2, 16) or importlib.util.find_spec("tf_keras") is not None
HAS_ESTIMATOR = hasattr(tf, "estimator") and hasattr(tf.estimator, "Estimator")
HAS_TFA = importlib.util.find_spec("tensorflow_addons") is not None

needs_keras3 = pytest.mark.skipif(
    not KERAS3, reason="Keras 3: TensorFlow >= 2.16 (CI's TF 2.21 stage)")
needs_tf_keras = pytest.mark.skipif(
    not HAS_TF_KERAS, reason="needs tf_keras (CI's TF 2.21 stage has it)")
needs_estimator = pytest.mark.skipif(
    not HAS_ESTIMATOR,
    reason="needs tf.estimator: TensorFlow 2.15 + tensorflow-estimator (CI's TF 2.15 stage)")
needs_tfa = pytest.mark.skipif(
    not HAS_TFA, reason="needs tensorflow-addons: TensorFlow 2.15 (CI's TF 2.15 stage)")


def run_example(name, *args, timeout=240):
    """Runs examples/<name>.py with `args` in a clean working directory; returns stdout."""
    import fusedopt

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1")
    env.pop("TF_USE_LEGACY_KERAS", None)  # each example chooses its Keras itself
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fusedopt.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, name + ".py"), *args],
                          cwd=os.path.dirname(ROOT), env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-5000:]
    return proc.stdout


def number_after(text, words):
    """The number that follows `words` in `text` (commas allowed)."""
    tail = text.split(words, 1)[1].split()[0].rstrip(".,;:)").replace(",", "")
    return float(tail)


@needs_keras3
def test_keras_recommender():
    out = run_example("keras_recommender", "--rows", "5000", "--steps", "8", "--batch", "256")
    fused, plain = [line for line in out.splitlines() if " loss " in line]
    assert fused.startswith("fusedopt.keras.LazyAdam") and plain.startswith("keras.optimizers.Adam")
    # LazyAdam's extra step moved exactly the rows its batch named; Keras's Adam more.
    moved, named = number_after(fused, "moved"), number_after(fused, "named")
    assert moved == named > 0, fused
    assert number_after(plain, "moved") > number_after(plain, "named"), plain
    assert "as fast" in out


@needs_tf_keras
def test_tf_keras_legacy():
    out = run_example("tf_keras_legacy", "--rows", "5000", "--steps", "6", "--batch", "256")
    assert "fusedopt.keras.legacy.LazyAdam at step 6." in out, out
    assert "the optimizer is at step 10." in out, out


def test_compat_v1_session():
    out = run_example("compat_v1_session", "--rows", "5000", "--steps", "10", "--batch", "512")
    assert "with fusedopt.compat.v1.LazyAdamOptimizer in a Session" in out
    assert "table/Adam, table/Adam_1" in out and "beta1_power" in out
    assert "Restored that checkpoint into tf.compat.v1.train.AdamOptimizer at step 10" in out


@needs_estimator
def test_estimator_towers():
    out = run_example("estimator_towers", "--rows", "5000", "--steps", "6", "--batch", "256")
    assert "split over 2 towers (/cpu:0, /cpu:1)" in out, out
    losses = [number_after(line, "loss") for line in out.splitlines() if "after" in line]
    assert len(losses) == 2 and losses[1] < losses[0], out


@needs_keras3
def test_row_wise_big_table():
    out = run_example("row_wise_big_table", "--rows", "20000", "--steps", "4", "--batch", "1024")
    assert "fusedopt.keras.RowWiseAdagrad(slot_dtype='bfloat16')" in out
    # One bfloat16 accumulator per row: 2 bytes a row.
    assert "table_embeddings_accumulator [20000] bfloat16" in out, out
    assert "Peak memory of this process" in out


@needs_tf_keras
def test_parameter_server_cluster():
    out = run_example("parameter_server_cluster", "--rows", "1000", "--steps", "6", "--batch", "64",
                      timeout=300)
    assert "Starting 2 parameter servers and 2 workers" in out
    for task in (0, 1):  # each ps holds a shard and ran its fused update
        assert out.count(f"/job:ps/replica:0/task:{task}/device:CPU:0") >= 2, out
    assert "Stopped all 4 server processes." in out


@needs_tfa
def test_migrate_from_tfa():
    out = run_example("migrate_from_tfa", "--rows", "2000", "--steps", "6", "--more", "3",
                      "--batch", "128")
    assert "loaded model.h5 with its optimizer as fusedopt.keras.legacy.LazyAdam at step 6" in out
    assert number_after(out, "differ from tfa's by at most") < 1e-5, out


def test_every_example_is_tested_and_documented():
    """A new example needs a test here, flags for its sizes, a docstring that says what it
    needs, and a line in docs/examples.md."""
    tests = {name[len("test_"):] for name in globals() if name.startswith("test_")}
    with open(os.path.join(ROOT, "docs", "examples.md")) as f:
        listed = f.read()
    scripts = sorted(f[:-3] for f in os.listdir(EXAMPLES) if f.endswith(".py"))
    assert len(scripts) >= 7, scripts
    for name in scripts:
        assert name in tests, f"examples/{name}.py has no test in {__file__}"
        assert f"`examples/{name}.py`" in listed, f"docs/examples.md does not list {name}"
        with open(os.path.join(EXAMPLES, name + ".py")) as f:
            source = f.read()
        doc = ast.get_docstring(ast.parse(source))
        assert doc and "Needs " in doc and f"python examples/{name}.py" in doc, name
        assert '"--rows"' in source and '"--steps"' in source, name
