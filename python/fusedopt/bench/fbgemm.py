"""FBGEMM's CPU TBE from this side: finding its venv and running ``fbgemm_worker.py`` there.

TF-free (the oracle test imports it beside fusedopt._core). The worker runs in the
interpreter named by ``FUSEDOPT_FBGEMM_PYTHON`` (``tools/setup_fbgemm_env.sh`` prints it),
a child process: TensorFlow and FBGEMM's torch cannot share one.
"""
import json
import os
import subprocess
import tempfile

import numpy as np

PYTHON_SETTING = "FUSEDOPT_FBGEMM_PYTHON"
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fbgemm_worker.py")
# fusedopt's rule -> FBGEMM's optimizer with the same math (fbgemm_worker.py's docstring);
# adagrad with its default options (epsilon outside the sqrt).
OPTIMIZERS = {"adagrad": "EXACT_ADAGRAD", "row_wise_adagrad": "EXACT_ROWWISE_ADAGRAD"}
SETUP_HINT = f"export {PYTHON_SETTING}=$(tools/setup_fbgemm_env.sh)"


def find_python():
    """(FBGEMM venv's python, None), or (None, why not)."""
    python = os.environ.get(PYTHON_SETTING)
    if not python:
        return None, f"{PYTHON_SETTING} is not set ({SETUP_HINT})"
    if not os.access(python, os.X_OK):
        return None, f"{PYTHON_SETTING}={python} is not an executable ({SETUP_HINT})"
    return python, None


class Request:
    """Arrays and jobs for one worker run (each array stored once, by identity)."""

    def __init__(self):
        self.arrays, self.jobs, self._keys = {}, [], {}

    def array(self, value):
        """The request's key of `value`."""
        key = self._keys.get(id(value))
        if key is None:
            key = self._keys[id(value)] = f"a{len(self._keys)}"
            self.arrays[key] = value
        return key

    def job(self, rule, table, batches, lr, eps, mode="apply", steps=None, threads=1,
            state=None, state_init=None, repeats=1, any_dim=False):
        """Adds a job (fbgemm_worker.py's docstring) and returns its index.

        rule: fusedopt's rule name; batches: [(ids, grads)]; state: an array, or
        state_init one value for every accumulator entry; any_dim: D need not be a multiple
        of 4 (the worker's _any_dim)."""
        job = {"optimizer": OPTIMIZERS[rule], "lr": float(lr), "eps": float(eps),
               "table": self.array(np.ascontiguousarray(table, np.float32)),
               "batches": [[self.array(i), self.array(g)] for i, g in batches],
               "steps": int(steps if steps is not None else len(batches)),
               "threads": int(threads), "mode": mode, "repeats": int(repeats),
               "any_dim": bool(any_dim)}
        if state is not None:
            job["state"] = self.array(np.ascontiguousarray(state, np.float32))
        else:
            job["state_init"] = float(state_init)
        self.jobs.append(job)
        return len(self.jobs) - 1

    def run(self, python, timeout=None, huge_pages=False):
        """Runs the worker: (its result JSON, {name: array}). huge_pages: torch allocates
        big buffers with transparent huge pages (THP_MEM_ALLOC_ENABLE=1)."""
        env = dict(os.environ, **({"THP_MEM_ALLOC_ENABLE": "1"} if huge_pages else {}))
        with tempfile.TemporaryDirectory(prefix="fusedopt-fbgemm-") as tmp:
            request, result = os.path.join(tmp, "request.npz"), os.path.join(tmp, "result.npz")
            np.savez(request, request=np.array(json.dumps({"jobs": self.jobs})), **self.arrays)
            child = subprocess.run([python, "-I", WORKER, request, result], capture_output=True,
                                   text=True, timeout=timeout, env=env)
            if child.returncode != 0:
                raise RuntimeError(f"FBGEMM worker ({python}) exited {child.returncode}:\n"
                                   + (child.stdout + child.stderr)[-4000:])
            with np.load(result, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
        return json.loads(str(arrays.pop("result"))), arrays


def states_after_each_step(arrays, job, steps):
    """[(table, accumulator)] after steps 1..steps of an "apply" job."""
    return [(arrays[f"job{job}_table_{t}"], arrays[f"job{job}_state_{t}"])
            for t in range(1, steps + 1)]
