"""lazy_adam: Adam, TF ApplyAdam's math; lazy on sparse gradients."""
import numpy as np

SLOTS = ["m", "v"]
HYPER = ["beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon"]
OPTIONS = {"use_nesterov": False}


def update(var, slots, g, h, o):
    m, v = slots
    b1, b2 = h["beta1"], h["beta2"]
    m = m + (g - m) * (1.0 - b1)
    v = v + (g * g - v) * (1.0 - b2)
    alpha = h["lr"] * np.sqrt(1.0 - h["beta2_power"]) / (1.0 - h["beta1_power"])
    if o["use_nesterov"]:
        var = var - alpha * (m * b1 + (1.0 - b1) * g) / (np.sqrt(v) + h["epsilon"])
    else:
        var = var - alpha * m / (np.sqrt(v) + h["epsilon"])
    return var, [m, v]


OPTION_SETS = [{}, {"use_nesterov": True}]
BASE_HYPER = dict(lr=0.1, beta1=0.9, beta2=0.99, epsilon=0.01)
POWERS = {"beta1_power": "beta1", "beta2_power": "beta2"}
SLOT_RANGES = {"m": (-0.5, 0.5), "v": (0.05, 1.0)}
# Front-end classes: the arguments their tests add (those that make the fused update run)
# and the compat.v1 constructor's (large enough to matter at half precision).
KERAS_KWARGS = {}
LEGACY_KWARGS = {}
COMPAT_V1_KWARGS = dict(learning_rate=0.1, beta1=0.9, beta2=0.99, epsilon=0.01)
ANCHOR_CASES = [({}, {}, False), ({"use_nesterov": True}, {}, False)]


def tf_anchor(tf, handles, h, grad, options, indices):
    tf.raw_ops.ResourceApplyAdam(
        var=handles[0], m=handles[1], v=handles[2], beta1_power=h["beta1_power"],
        beta2_power=h["beta2_power"], lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"],
        epsilon=h["epsilon"], grad=grad, use_nesterov=options.get("use_nesterov", False))
