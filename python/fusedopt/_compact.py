"""Compact slot storage, as every front end offers it (``slot_dtype=``, ``stochastic_rounding=``).

A float32 variable's slots may be stored as ``bfloat16`` or ``float16``: the fused ops
compute in float32 and round each slot value once on store (to nearest even, or with
``stochastic_rounding=True`` stochastically: unbiased, so increments smaller than half a
16-bit step survive in expectation). Other variables (float16, bfloat16, float64) keep
slots of their own dtype. Checkpoints then hold 16-bit slots: they no longer interchange
with TF's or Keras's optimizers as they are (TF's checkpoint restore refuses a dtype
change): ``fusedopt.checkpoint.cast_slots`` writes a cast copy. Keras 3 model files
(``.keras``) restore into either kind directly, cast.
"""
import inspect

import tensorflow as tf

from fusedopt._warnings import IgnoredOptionWarning, warn_once

__all__ = ["COMPACT_DTYPES", "parse_slot_dtype", "parse_flag", "slot_dtype_for", "check_strategy",
           "check_slots", "set_options", "config", "DOC", "KEYWORDS", "with_keywords",
           "SlotDtypeView"]

COMPACT_DTYPES = (tf.bfloat16, tf.float16)


def parse_slot_dtype(slot_dtype):
    """None, or the tf.DType of a ``slot_dtype`` argument ("bfloat16", tf.float16, ...)."""
    if slot_dtype is None:
        return None
    try:
        dtype = tf.as_dtype(slot_dtype)
    except TypeError:
        dtype = None
    if dtype not in COMPACT_DTYPES and dtype != tf.float32:
        raise ValueError("slot_dtype must be 'bfloat16', 'float16' (compact slots of float32 "
                         "variables) or None/'float32' (slots of the variable's dtype), got "
                         f"{slot_dtype!r}")
    return None if dtype == tf.float32 else dtype


def parse_flag(name, value):
    """A boolean keyword (``stochastic_rounding``, ``lazy_weight_decay``): True or False
    (or NumPy's), never a truthy stand-in ("False" is true in Python)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def slot_dtype_for(variable_dtype, slot_dtype):
    """The dtype of a variable's slots: `slot_dtype` (parsed) for a float32 variable, the
    variable's own dtype otherwise."""
    variable_dtype = tf.as_dtype(variable_dtype).base_dtype
    if slot_dtype is not None and variable_dtype == tf.float32:
        return slot_dtype
    return variable_dtype


def check_strategy(dtype):
    """Raises ValueError where the current tf.distribute strategy cannot make a slot of
    `dtype`: MultiWorkerMirroredStrategy broadcasts every new variable's initial value
    from the chief with a collective op that has no bfloat16 kernel (TF's limitation)."""
    if dtype != tf.bfloat16 or not tf.distribute.has_strategy():
        return
    strategy = tf.distribute.get_strategy()
    if (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and getattr(strategy.extended, "_num_workers", 1) > 1):
        raise ValueError(
            "slot_dtype='bfloat16' under MultiWorkerMirroredStrategy with more than one "
            "worker: TensorFlow broadcasts each new variable's initial value with a "
            "collective op that has no bfloat16 kernel; use slot_dtype='float16' there")


def check_slots(optimizer, variable, slots, slot_dtype, stochastic_rounding=False):
    """Warns once per optimizer (``IgnoredOptionWarning``) where an option cannot take effect
    on `variable`'s `slots`: `slot_dtype` (parsed) asks for compact slots beside a float32
    variable but the slots are of another dtype (code outside fusedopt made them: a library
    that wraps the optimizer and replaces its slot creation), or `stochastic_rounding` has
    no 16-bit slot to round (a float32/float64 variable without slot_dtype). The update runs
    on the slots as they are."""
    got = sorted({tf.as_dtype(s.dtype).base_dtype.name for s in slots})
    if stochastic_rounding and got and not set(got) & {d.name for d in COMPACT_DTYPES}:
        warn_once(optimizer, "stochastic_rounding", IgnoredOptionWarning,
                  f"stochastic_rounding=True has no effect on {getattr(variable, 'name', '?')}:"
                  f" its slots are {' and '.join(got)}, and only 16-bit slots are rounded. "
                  "Give slot_dtype='bfloat16' or 'float16' to store the slots of float32 "
                  "variables in 16 bits. (Said once per optimizer.)", stacklevel=4)
    if slot_dtype is None:
        return
    want = slot_dtype_for(variable.dtype, slot_dtype)
    if want not in COMPACT_DTYPES:  # compact slots are for float32 variables
        warn_once(optimizer, "slot_dtype_of_" + want.name, IgnoredOptionWarning,
                  f"slot_dtype={slot_dtype.name!r} has no effect on "
                  f"{getattr(variable, 'name', '?')}: compact slots are for float32 "
                  f"variables, and its are {want.name} (kept). (Said once per optimizer "
                  "and dtype.)", stacklevel=4)
        return
    if not got or got == [want.name]:
        return
    warn_once(optimizer, "slot_dtype", IgnoredOptionWarning,
              f"slot_dtype={slot_dtype.name!r} has no effect on {getattr(variable, 'name', '?')}: "
              f"its slots are {' and '.join(got)}, made by code that replaced this optimizer's "
              "slot creation (a library wrapping the optimizer). They are updated as they are, "
              f"in {' and '.join(got)}, and saved so; the optimizer's config still says "
              f"{slot_dtype.name!r}. (Said once per optimizer.)", stacklevel=4)


def set_options(optimizer, slot_dtype, stochastic_rounding):
    """Sets a Keras front-end class's ``slot_dtype`` (parsed) and ``stochastic_rounding``;
    refuses compact slots where the class runs the Keras class's own update (its
    ``_keeps_own_update()``, e.g. amsgrad), which has no use for them."""
    optimizer.slot_dtype = parse_slot_dtype(slot_dtype)
    optimizer.stochastic_rounding = parse_flag("stochastic_rounding", stochastic_rounding)
    if optimizer.slot_dtype is not None and optimizer._keeps_own_update():
        raise ValueError(
            f"slot_dtype={optimizer.slot_dtype.name!r}: compact slots are for fusedopt's fused "
            "update, and these settings run the Keras class's own (e.g. amsgrad=True)")


def config(slot_dtype, stochastic_rounding):
    """The config entries of the options, only where set (the config stays the replaced
    class's otherwise)."""
    entries = {}
    if slot_dtype is not None:
        entries["slot_dtype"] = slot_dtype.name
    if stochastic_rounding:
        entries["stochastic_rounding"] = True
    return entries


DOC = """
      slot_dtype: fusedopt's own (keyword only, default None): "bfloat16" or "float16" to
        store the slots of float32 variables in 16 bits (half the state memory; the update
        computes in float32 and rounds once on store). Checkpoints then hold 16-bit slots
        (``fusedopt.checkpoint.cast_slots`` casts a copy for TF's optimizers, and back).
      stochastic_rounding: fusedopt's own (keyword only, default False): round 16-bit slots
        stochastically (unbiased) instead of to nearest even; deterministic bits.
"""


# The keyword-only arguments the Keras front ends add to each class's constructor.
KEYWORDS = (("slot_dtype", None), ("stochastic_rounding", False))


def with_keywords(signature, keywords):
    """`signature` with keyword-only `keywords` ((name, default), ...) before **kwargs."""
    P = inspect.Parameter
    parameters = list(signature.parameters.values())
    at = len(parameters) - (bool(parameters) and parameters[-1].kind == P.VAR_KEYWORD)
    own = [P(name, P.KEYWORD_ONLY, default=default) for name, default in keywords]
    return signature.replace(parameters=parameters[:at] + own + parameters[at:])


class SlotDtypeView:
    """A variable as a Keras 2 optimizer's slot maker sees it: the variable itself in every
    respect but its dtype (``dtype``, and ``true_dtype``, which OptimizerV2.add_slot reads
    as a mixed-precision variable's), here the compact slot dtype the slot is made in."""

    def __init__(self, variable, dtype):
        self._fusedopt_variable = variable
        self.dtype = self.true_dtype = dtype

    def __getattr__(self, name):
        return getattr(self._fusedopt_variable, name)
