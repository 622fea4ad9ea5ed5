"""row_wise_adagrad: FBGEMM's EXACT_ROWWISE_ADAGRAD, one accumulator per row of var (dim 0;
a scalar var is one row): acc[r] += mean over the row of g², var[r] -= lr/(sqrt(acc[r])+eps)·g[r].
No TensorFlow op has this math: no anchor cases. Its outside oracle is FBGEMM's
EXACT_ROWWISE_ADAGRAD itself (fbgemm-gpu-cpu 1.9.0 in its own venv, run as a child process):
tests/core/test_fbgemm_oracle.py compares fusedopt with it step by step (issue 32)."""
import numpy as np

SLOTS = ["accum"]
PER_ROW = ("accum",)  # slots of shape var.shape[:1]
HYPER = ["lr", "epsilon"]
OPTIONS = {}


def update(var, slots, g, h, o):
    (accum,) = slots
    rows = 1 if var.ndim == 0 else var.shape[0]
    g_rows = g.reshape(rows, int(np.prod(var.shape[1:])))
    mean = (g_rows * g_rows).mean(axis=1) if g_rows.shape[1] else np.zeros(rows)
    accum = accum + mean.reshape(accum.shape) if g_rows.shape[1] else accum
    multiplier = h["lr"] / (np.sqrt(accum) + h["epsilon"])
    var = var - multiplier.reshape(accum.shape + (1,) * max(var.ndim - 1, 0)) * g
    return var, [accum]


OPTION_SETS = [{}]
BASE_HYPER = dict(lr=0.2, epsilon=0.1)
POWERS = {}
SLOT_RANGES = {"accum": (0.05, 1.0)}
KERAS_KWARGS = {}
LEGACY_KWARGS = {}
COMPAT_V1_KWARGS = dict(learning_rate=0.2, initial_accumulator_value=0.1)
ANCHOR_CASES = []


def tf_anchor(tf, handles, h, grad, options, indices):
    raise NotImplementedError("TensorFlow has no row-wise Adagrad op")
