"""rms_prop: RMSprop with momentum, TF ApplyRMSProp's math (epsilon inside the sqrt)."""
import numpy as np

SLOTS = ["ms", "mom"]
HYPER = ["lr", "rho", "momentum", "epsilon"]
OPTIONS = {}


def update(var, slots, g, h, o):
    ms, mom = slots
    ms = ms + (g * g - ms) * (1.0 - h["rho"])
    mom = h["momentum"] * mom + h["lr"] * g / np.sqrt(ms + h["epsilon"])
    return var - mom, [ms, mom]


OPTION_SETS = [{}]
BASE_HYPER = dict(lr=0.05, rho=0.9, momentum=0.5, epsilon=0.05)
POWERS = {}
SLOT_RANGES = {"ms": (0.05, 1.0), "mom": (-0.5, 0.5)}
# Front-end classes: the arguments their tests add (those that make the fused update run)
# and the compat.v1 constructor's (large enough to matter at half precision).
KERAS_KWARGS = {"momentum": 0.9}
LEGACY_KWARGS = {"momentum": 0.9}
COMPAT_V1_KWARGS = dict(learning_rate=0.05, decay=0.9, momentum=0.5, epsilon=0.05)
ANCHOR_CASES = [({}, {}, False), ({}, {}, True)]


def tf_anchor(tf, handles, h, grad, options, indices):
    args = dict(var=handles[0], ms=handles[1], mom=handles[2], lr=h["lr"], rho=h["rho"],
                momentum=h["momentum"], epsilon=h["epsilon"], grad=grad)
    if indices is None:
        tf.raw_ops.ResourceApplyRMSProp(**args)
    else:
        tf.raw_ops.ResourceSparseApplyRMSProp(indices=indices, **args)
