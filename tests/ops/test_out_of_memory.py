"""An update whose working buffers cannot be allocated (the grouping of its indices, the
rows that sum duplicates) fails with ResourceExhaustedError and writes nothing: the
variable and every slot keep their bits, and the same call succeeds once memory is there.
Before, the engine's std::bad_alloc crossed TensorFlow's frames and the process died
(SIGSEGV in TF 2.21's error translation).

Each case runs in a child process that caps its own memory (RLIMIT_DATA, soft limit only, so
that it can lift the cap again): 20M indices over 2^20 rows need about 350 MB of grouping
buffers, which the cap of 50 MB above what the process holds refuses. (Not run under the
sanitizer build: ASan maps its own shadow memory.)"""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

CHILD = r"""
import json, os, resource, sys
import numpy as np
import tensorflow as tf
import fusedopt.ops as fops

rule, form = sys.argv[1], sys.argv[2]
# 2^20 rows: more hash slots than a thread keeps between calls (engine.h), so the warm-up
# call below frees its grouping buffers and the capped call must allocate them again.
n, rows = 20_000_000, 1 << 20
rng = np.random.default_rng(0)
indices = tf.constant((np.arange(n) % rows).astype(np.int32))
grad = tf.constant(rng.normal(size=(n, 1)).astype(np.float32))
var0 = rng.normal(size=(rows, 1)).astype(np.float32)
update = getattr(fops, "resource_sparse_apply_" + rule)
slots0 = [np.full((rows, 1) if s != "accum" or rule != "row_wise_adagrad" else (rows,), 0.1,
                  np.float32) for s in fops.RULES[rule]["slots"]]
hyper = {"lazy_adam": (0.9, 0.999, 1e-3, 0.9, 0.999, 1e-7),  # beta powers, lr, betas, eps
         "row_wise_adagrad": (0.1, 1e-7)}[rule]

def make():
    return tf.Variable(var0), [tf.Variable(s) for s in slots0]

def step(var, slots):
    update(var, *slots, *hyper, grad, indices, every_row=(form == "every_row"))

run = {"eager": step, "every_row": step,
       "xla": tf.function(step, jit_compile=True)}[form]
var, slots = make()
run(var, slots)  # compiled (XLA), kernels and thread pools started: the next call is the test
before = [var.numpy().tobytes()] + [s.numpy().tobytes() for s in slots]

def vm_data():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmData:"))
soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
resource.setrlimit(resource.RLIMIT_DATA, (vm_data() + 50_000_000, hard))
try:
    run(var, slots)
    error = None
except tf.errors.ResourceExhaustedError as e:
    error = e.message
finally:
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
after = [var.numpy().tobytes()] + [s.numpy().tobytes() for s in slots]
run(var, slots)  # memory back: the same call goes through
again, again_slots = make()
run(again, again_slots)
run(again, again_slots)
print(json.dumps({"error": error, "unchanged": before == after,
                  "then_updated": var.numpy().tobytes() == again.numpy().tobytes()
                  and var.numpy().tobytes() != before[0]}))
"""


def _forms():
    """Eager, every row, and XLA where XLA calls the engine (the custom call, TF >= 2.16;
    the HLO lowering is XLA's own code and buffers)."""
    from fusedopt import runtime

    return ["eager", "every_row"] + (["xla"] if runtime.xla_cpu_lowering() == "custom_call"
                                     else [])


@pytest.mark.parametrize("rule", ["lazy_adam", "row_wise_adagrad"])
@pytest.mark.parametrize("form", _forms())
def test_refused_allocation_is_an_error_and_nothing_is_written(rule, form):
    # oneDNN off: its allocator crashes TF 2.21 itself on a refused allocation (the
    # benchmark's largest-table sweep met it), and TensorFlow's own ops are not the test.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0")
    proc = subprocess.run([sys.executable, "-c", CHILD, rule, form], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] is not None, "the capped call was not refused: the cap is too loose"
    assert "nothing was written" in result["error"], result["error"]
    assert result["unchanged"]
    assert result["then_updated"]
