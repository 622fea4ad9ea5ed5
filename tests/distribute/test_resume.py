"""Exact resume: train K steps, checkpoint, continue in a NEW process; the final variables
(var, every slot, the beta powers) equal an uninterrupted run bit for bit, for every
rule and option set (tests/distribute/resume_worker.py has the training loops).

* tf.train.Checkpoint: eager, resource variables, resource_* ops.
* tf.compat.v1.train.Saver: graph mode, ref variables, the ref ops.
* fusedopt.compat.v1 optimizer classes (LazyAdam/Adamax/Adagrad) with a Saver.
* fusedopt.keras optimizers: model.save(".keras"), keras.models.load_model in the new
  process, train_on_batch on (model weights + optimizer variables).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import resume_worker

HERE = os.path.dirname(os.path.abspath(__file__))
K, TOTAL = 7, 15


def _worker(mode, phase, ckpt_dir, out, first, last):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE] + [p for p in sys.path if p] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    subprocess.run([sys.executable, os.path.join(HERE, "resume_worker.py"), mode, phase,
                    str(ckpt_dir), str(out), str(first), str(last)],
                   check=True, env=env, timeout=300)
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["checkpoint", "saver", "v1optimizer", "keras"])
def test_resume_in_new_process_is_bit_exact(mode, tmp_path):
    # Uninterrupted reference run, in this process.
    full = resume_worker.run(mode, "start", "", 0, TOTAL)
    # K steps and a checkpoint in one process, the rest in another.
    _worker(mode, "start", tmp_path, tmp_path / "first.npz", 0, K)
    resumed = _worker(mode, "resume", tmp_path, tmp_path / "resumed.npz", K, TOTAL)
    assert sorted(full) == sorted(resumed)
    rules = {name.split("/")[0] for name in full}
    assert len(rules) == (len(resume_worker.RULE_SETS) if mode in ("checkpoint", "saver")
                          else len(resume_worker.HYPER))
    if mode == "keras":  # model weights and the optimizer's slots were compared too
        assert sum("/opt/" in n for n in full) >= 3 * 3, sorted(full)
    for name in sorted(full):
        a, b = full[name], resumed[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), "%s differs after resume (max |diff| %g)" % (
            name, np.max(np.abs(a.astype(np.float64) - b)))
    # And training did something: the K-step state is not the final one.
    first = np.load(tmp_path / "first.npz")
    assert any(first[n].tobytes() != full[n].tobytes() for n in full)
