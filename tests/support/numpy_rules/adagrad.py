"""adagrad: TF ApplyAdagradV2's math (epsilon 0: ApplyAdagrad); epsilon inside the square
root with epsilon_inside_sqrt (Keras >= 2.11)."""
import numpy as np

SLOTS = ["accum"]
HYPER = ["lr", "epsilon"]
OPTIONS = {"update_slots": True, "epsilon_inside_sqrt": False}


def update(var, slots, g, h, o):
    (accum,) = slots
    if o["update_slots"]:
        accum = accum + g * g
    if o["epsilon_inside_sqrt"]:
        var = var - h["lr"] * g / np.sqrt(accum + h["epsilon"])
    else:
        var = var - h["lr"] * g / (np.sqrt(accum) + h["epsilon"])
    return var, [accum]


OPTION_SETS = [{}, {"update_slots": False}, {"epsilon_inside_sqrt": True},
               {"update_slots": False, "epsilon_inside_sqrt": True}]
BASE_HYPER = dict(lr=0.2, epsilon=0.1)
POWERS = {}
SLOT_RANGES = {"accum": (0.05, 1.0)}
# epsilon 0 is tf.compat.v1's AdagradOptimizer (TF's ApplyAdagrad), else ApplyAdagradV2.
# Front-end classes: the arguments their tests add (those that make the fused update run)
# and the compat.v1 constructor's (large enough to matter at half precision).
KERAS_KWARGS = {}
LEGACY_KWARGS = {}
COMPAT_V1_KWARGS = dict(learning_rate=0.2, initial_accumulator_value=0.1)
ANCHOR_CASES = [({}, {}, False), ({"update_slots": False}, {}, False),
                ({}, {"epsilon": 0.0}, False), ({"update_slots": False}, {"epsilon": 0.0}, False),
                ({}, {}, True)]


def tf_anchor(tf, handles, h, grad, options, indices):
    update_slots = options.get("update_slots", True)
    if options.get("epsilon_inside_sqrt"):
        raise ValueError("TF has no Adagrad op with epsilon inside the square root")
    if indices is not None:
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=handles[0], accum=handles[1], lr=h["lr"], epsilon=h["epsilon"], grad=grad,
            indices=indices, update_slots=update_slots)
    elif float(h["epsilon"]) == 0.0:
        tf.raw_ops.ResourceApplyAdagrad(var=handles[0], accum=handles[1], lr=h["lr"],
                                        grad=grad, update_slots=update_slots)
    else:
        tf.raw_ops.ResourceApplyAdagradV2(
            var=handles[0], accum=handles[1], lr=h["lr"], epsilon=h["epsilon"], grad=grad,
            update_slots=update_slots)
