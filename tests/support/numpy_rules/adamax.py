"""adamax: AdaMax, TF ApplyAdaMax's math."""
import numpy as np

SLOTS = ["m", "v"]
HYPER = ["beta1_power", "lr", "beta1", "beta2", "epsilon"]
OPTIONS = {}


def update(var, slots, g, h, o):
    m, v = slots
    m = m + (g - m) * (1.0 - h["beta1"])
    v = np.maximum(h["beta2"] * v, np.abs(g))
    var = var - h["lr"] / (1.0 - h["beta1_power"]) * m / (v + h["epsilon"])
    return var, [m, v]


OPTION_SETS = [{}]
BASE_HYPER = dict(lr=0.05, beta1=0.8, beta2=0.95, epsilon=0.05)
POWERS = {"beta1_power": "beta1"}
SLOT_RANGES = {"m": (-0.5, 0.5), "v": (0.05, 1.0)}
# Front-end classes: the arguments their tests add (those that make the fused update run)
# and the compat.v1 constructor's (large enough to matter at half precision).
KERAS_KWARGS = {}
LEGACY_KWARGS = {}
COMPAT_V1_KWARGS = dict(learning_rate=0.05, beta1=0.8, beta2=0.95, epsilon=0.05)
ANCHOR_CASES = [({}, {}, False)]


def tf_anchor(tf, handles, h, grad, options, indices):
    tf.raw_ops.ResourceApplyAdaMax(
        var=handles[0], m=handles[1], v=handles[2], beta1_power=h["beta1_power"],
        lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"], epsilon=h["epsilon"], grad=grad)
