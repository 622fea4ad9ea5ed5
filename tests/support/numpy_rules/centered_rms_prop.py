"""centered_rms_prop: centered RMSprop with momentum, TF ApplyCenteredRMSProp's math
(epsilon inside the sqrt, the mean gradient's square subtracted)."""
import numpy as np

SLOTS = ["ms", "mom", "mg"]
HYPER = ["lr", "rho", "momentum", "epsilon"]
OPTIONS = {}


def update(var, slots, g, h, o):
    ms, mom, mg = slots
    ms = ms + (g * g - ms) * (1.0 - h["rho"])
    mg = mg + (g - mg) * (1.0 - h["rho"])
    mom = h["momentum"] * mom + h["lr"] * g / np.sqrt(ms - mg * mg + h["epsilon"])
    return var - mom, [ms, mom, mg]


OPTION_SETS = [{}]
BASE_HYPER = dict(lr=0.05, rho=0.9, momentum=0.5, epsilon=0.05)
POWERS = {}
# mg small beside sqrt(ms): the estimated variance ms - mg^2 stays positive.
SLOT_RANGES = {"ms": (0.3, 1.0), "mom": (-0.5, 0.5), "mg": (-0.3, 0.3)}
# Front-end classes: the RMSprop classes with centered=True (VARIANT_KWARGS: what selects
# this rule in every front end), with momentum (Keras runs its own update without).
VARIANT_KWARGS = {"centered": True}
KERAS_KWARGS = {"momentum": 0.5, "centered": True}  # stable at the fit tests' lr 0.05
LEGACY_KWARGS = {"momentum": 0.5, "centered": True}
COMPAT_V1_KWARGS = dict(learning_rate=0.05, decay=0.9, momentum=0.5, epsilon=0.05,
                        centered=True)
ANCHOR_CASES = [({}, {}, False), ({}, {}, True)]


def tf_anchor(tf, handles, h, grad, options, indices):
    args = dict(var=handles[0], ms=handles[1], mom=handles[2], mg=handles[3], lr=h["lr"],
                rho=h["rho"], momentum=h["momentum"], epsilon=h["epsilon"], grad=grad)
    if indices is None:
        tf.raw_ops.ResourceApplyCenteredRMSProp(**args)
    else:
        tf.raw_ops.ResourceSparseApplyCenteredRMSProp(indices=indices, **args)
