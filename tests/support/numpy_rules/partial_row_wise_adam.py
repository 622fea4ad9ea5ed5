"""partial_row_wise_adam: FBGEMM's PARTIAL_ROWWISE_ADAM, m per element, v one per row of var
(dim 0; a scalar var is one row): v[r] = beta2·v[r] + (1-beta2)·mean over the row of g²,
m = beta1·m + (1-beta1)·g, var -= lr/(1-beta1^t) · m / (sqrt(v[r]/(1-beta2^t)) + eps)
(FBGEMM's split_weight_update for partial_rowwise_adam, weight_decay 0).
No TensorFlow op has this math: no anchor cases."""
import numpy as np

SLOTS = ["m", "v"]
PER_ROW = ("v",)  # slots of shape var.shape[:1]
HYPER = ["beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon"]
OPTIONS = {}


def update(var, slots, g, h, o):
    m, v = slots
    rows = 1 if var.ndim == 0 else var.shape[0]
    width = int(np.prod(var.shape[1:]))
    if width:  # rows of no elements: nothing to average, v stays
        g_rows = g.reshape(rows, width)
        v = h["beta2"] * v + (1.0 - h["beta2"]) * (g_rows * g_rows).mean(axis=1).reshape(v.shape)
    m = h["beta1"] * m + (1.0 - h["beta1"]) * g
    v_hat = v / (1.0 - h["beta2_power"])
    m_hat = m / (1.0 - h["beta1_power"])
    along_rows = v_hat.reshape(v.shape + (1,) * max(var.ndim - 1, 0))
    return var - h["lr"] * m_hat / (np.sqrt(along_rows) + h["epsilon"]), [m, v]


OPTION_SETS = [{}]
# beta2 0.9: a per-row v moves by (1-beta2)·(mean(g²)-v), visible at bfloat16 near 1.
BASE_HYPER = dict(lr=0.1, beta1=0.9, beta2=0.9, epsilon=0.01)
POWERS = {"beta1_power": "beta1", "beta2_power": "beta2"}
SLOT_RANGES = {"m": (-0.5, 0.5), "v": (0.05, 1.0)}
KERAS_KWARGS = {}
LEGACY_KWARGS = {}
COMPAT_V1_KWARGS = dict(learning_rate=0.1, beta1=0.9, beta2=0.9, epsilon=0.01)
ANCHOR_CASES = []


def tf_anchor(tf, handles, h, grad, options, indices):
    raise NotImplementedError("TensorFlow has no partial row-wise Adam op")
